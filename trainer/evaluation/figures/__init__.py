"""Figures for papers and sanity checks: attention maps (attention.py, resampled by resample.py),
HACap's goals (goals.py) and training curves (curves.py), rendered off-screen (render.py)."""

from pathlib import Path
from typing import Callable

from trainer.evaluation.figures.attention import attention_figure, figure_image, stages_figure
from trainer.evaluation.figures.curves import curves_figure, on_one_axis, training_curves
from trainer.evaluation.figures.goals import goals_figure
from trainer.evaluation.figures.resample import upsampled_attention

# The pictures an evaluation draws per image, by the name a decoder's ``figures`` hook asks for
# (``pictures.draw("stages", ...)``): a decoder names a picture and never imports its drawing.
PER_IMAGE: dict[str, Callable[..., Path]] = {"attention": attention_figure,
                                             "stages": stages_figure, "goals": goals_figure}

__all__ = ["PER_IMAGE", "attention_figure", "curves_figure", "figure_image", "goals_figure",
           "on_one_axis", "stages_figure", "training_curves", "upsampled_attention"]
