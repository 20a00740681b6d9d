"""Figures for papers and sanity checks: attention maps (attention.py, resampled by resample.py),
HACap's goals (goals.py) and training curves (curves.py), rendered off-screen (render.py)."""

from trainer.evaluation.figures.attention import attention_figure, figure_image, stages_figure
from trainer.evaluation.figures.curves import curves_figure, on_one_axis, training_curves
from trainer.evaluation.figures.goals import goals_figure
from trainer.evaluation.figures.resample import upsampled_attention

__all__ = ["attention_figure", "curves_figure", "figure_image", "goals_figure", "on_one_axis",
           "stages_figure", "training_curves", "upsampled_attention"]
