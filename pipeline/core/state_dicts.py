"""Does a checkpoint's state_dict fit a model? The first problem, named, or None.

Checked before anything is copied, so a refused file leaves the model as it
was. BatchNorm's ``num_batches_tracked`` counters are ignored on both sides:
frozen-norm checkpoints lack them, and nothing reads them at inference.
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn


def _is_bn_counter(key: str) -> bool:
    return key.endswith("num_batches_tracked")


def first_misfit(state: dict[str, Tensor], model: nn.Module,
                 spelled: Callable[[str], str] = lambda key: key) -> tuple[str, list[str]] | None:
    """``(problem, keys as the file spells them)`` for the first kind of misfit, or None."""
    expected = {k: v.shape for k, v in model.state_dict().items() if not _is_bn_counter(k)}
    state = {k: v for k, v in state.items() if not _is_bn_counter(k)}
    missing = [spelled(k) for k in expected if k not in state]
    unexpected = [spelled(k) for k in state if k not in expected]
    wrong = [f"{spelled(k)} {list(state[k].shape)} vs {list(expected[k])}"
             for k in state if k in expected and state[k].shape != expected[k]]
    for problem, keys in (("missing keys", missing), ("unexpected keys", unexpected),
                          ("shape mismatch (file vs model)", wrong)):
        if keys:
            return problem, keys
    return None


def listed(keys: list[str], shown: int = 3) -> str:
    """The first ``shown`` keys, and how many more."""
    more = f" (+{len(keys) - shown} more)" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more
