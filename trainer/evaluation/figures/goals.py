"""HACap's goal pictures (its Figures 3 and 4): what the MANAGER asked for, word by word.

Three panels over one caption:

- the subgoal w_t = W_psi sum_{i<c} g_{t-i} the WORKER reads, its k numbers per
  word as a heat map (the paper's "subgoal vector during text generation":
  segments of a dimension that stays put mark a phrase);
- per word, cos(f_{t+c} - f_t, g_t): whether the caption's leaked features
  went where the goal pointed;
- the goals g_t projected on their two principal directions, a path through
  the caption with each point labelled by the word it led to.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from pipeline.core.errors import CapstackError, where
from trainer.evaluation.figures.render import save_png


def principal_plane(goals: np.ndarray) -> np.ndarray:
    """Goals [T, F] -> their coordinates [T, 2] on the two principal directions (centred)."""
    centred = goals - goals.mean(0, keepdims=True)
    if len(goals) < 2:
        return np.zeros((len(goals), 2))
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    plane = centred @ vt[:2].T
    return np.pad(plane, ((0, 0), (0, 2 - plane.shape[1])))


def goals_figure(words: list[str], subgoals: np.ndarray, cosines: np.ndarray,
                 goals: np.ndarray, out: Path, *, title: str | None = None) -> Path:
    """subgoals [T, k], cosines [T], goals [T, F] for the caption's ``words`` (T of them)."""
    out = Path(out)
    t = len(words)
    subgoals, cosines, goals = (np.asarray(a, dtype=np.float64) for a in (subgoals, cosines, goals))
    if t == 0 or subgoals.shape[0] < t or cosines.shape[0] < t or goals.shape[0] < t:
        raise CapstackError(f"{where(out)}: {t} words but subgoals {subgoals.shape}, cosines "
                            f"{cosines.shape}, goals {goals.shape}")
    subgoals, cosines, goals = subgoals[:t], cosines[:t], goals[:t]
    fig = Figure(figsize=(max(6.0, 0.55 * t) + 4.5, 4.8), layout="constrained")
    grid = fig.add_gridspec(2, 2, width_ratios=[max(6.0, 0.55 * t), 4.5], height_ratios=[3, 2])
    heat = fig.add_subplot(grid[0, 0])
    image = heat.imshow(subgoals.T, aspect="auto", cmap="coolwarm")
    heat.set_yticks(range(subgoals.shape[1]), [f"w{i}" for i in range(subgoals.shape[1])])
    heat.set_xticks(range(t), words, rotation=45, ha="right", fontsize=8)
    heat.set_title("subgoal w_t per word")
    fig.colorbar(image, ax=heat, fraction=0.03)
    line = fig.add_subplot(grid[1, 0])
    line.bar(range(t), cosines, color=["tab:green" if c >= 0 else "tab:red" for c in cosines])
    line.axhline(0, color="black", linewidth=0.5)
    line.set_ylim(-1, 1)
    line.set_xticks(range(t), words, rotation=45, ha="right", fontsize=8)
    line.set_title("cos(f_{t+c} - f_t, g_t)", fontsize=9)
    path = fig.add_subplot(grid[:, 1])
    plane = principal_plane(goals)
    path.plot(plane[:, 0], plane[:, 1], "-", color="0.7", zorder=1)
    path.scatter(plane[:, 0], plane[:, 1], c=np.arange(t), cmap="viridis", zorder=2)
    for (x, y), word in zip(plane, words):
        path.annotate(word, (x, y), fontsize=8, xytext=(3, 3), textcoords="offset points")
    path.set_title("goals g_t, 2 principal directions", fontsize=9)
    if title:
        fig.suptitle(title)
    return save_png(fig, out)
