"""Does a checkpoint's state_dict fit a model? The first problem, named, or None.

Checked before anything is copied, so a refused file leaves the model as it
was. BatchNorm's ``num_batches_tracked`` counters are ignored on both sides
(unless ``counters``): frozen-norm checkpoints lack them, and nothing reads them
at inference. Backbone weights, detector checkpoints and the decoder weights of a
training checkpoint are refused through :func:`require_fit`, in the same words, and so
are weights holding NaN or infinity (:func:`require_finite`).
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from pipeline.core.errors import CapstackError


def _is_bn_counter(key: str) -> bool:
    return key.endswith("num_batches_tracked")


def first_misfit(state: dict[str, Tensor], model: nn.Module,
                 spelled: Callable[[str], str] = lambda key: key,
                 may_lack: Callable[[str], bool] = lambda key: False,
                 counters: bool = False) -> tuple[str, list[str]] | None:
    """``(problem, keys as the file spells them)`` for the first kind of misfit, or None.

    Shapes first: a key both sides have at another shape is the surest sign of another
    layout (weights of another backbone), then missing keys (but those ``may_lack``), then
    unexpected ones. ``counters``: BatchNorm counters count too (a strict load needs them)."""
    kept = (lambda key: True) if counters else (lambda key: not _is_bn_counter(key))
    expected = {k: v.shape for k, v in model.state_dict().items() if kept(k)}
    state = {k: v for k, v in state.items() if kept(k)}
    missing = [spelled(k) for k in expected if k not in state and not may_lack(k)]
    unexpected = [spelled(k) for k in state if k not in expected]
    wrong = [f"{spelled(k)} {list(state[k].shape)} vs {list(expected[k])}"
             for k in state if k in expected and state[k].shape != expected[k]]
    for problem, keys in (("shape mismatch (file vs model)", wrong), ("missing keys", missing),
                          ("unexpected keys", unexpected)):
        if keys:
            return problem, keys
    return None


def tensors_only(state, where) -> dict[str, Tensor]:
    """``state`` when it is a dict of named tensors; else refused, naming the first key that
    is not (``weights.pth: fc.weight is an int, not a tensor``)."""
    if not isinstance(state, dict):
        raise CapstackError(f"{where}: not a state_dict (it holds {_a(state)}; expected a "
                            f"dict of tensors)")
    for key, value in state.items():
        if not isinstance(key, str):
            raise CapstackError(f"{where}: a key is {_a(key)}, not a name")
        if not isinstance(value, Tensor):
            raise CapstackError(f"{where}: {key} is {_a(value)}, not a tensor")
    return state


def _a(value) -> str:
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiouAEIOU' else 'a'} {name}"


def require_fit(state: dict[str, Tensor], model: nn.Module, where, what: str, *,
                spelled: Callable[[str], str] = lambda key: key,
                may_lack: Callable[[str], bool] = lambda key: False, counters: bool = False,
                hint: str = "") -> None:
    """Refuse ``state`` unless it fits ``model``: ``WHERE: does not fit WHAT: shape mismatch
    (file vs model) KEY [file shape] vs [model shape], ...HINT``."""
    misfit = first_misfit(state, model, spelled, may_lack, counters)
    if misfit:
        problem, keys = misfit
        raise CapstackError(f"{where}: does not fit {what}: {problem} {listed(keys)}"
                            + (f" ({hint})" if hint else ""))
    require_finite(state, where, spelled)


def require_finite(state: dict[str, Tensor], where,
                   spelled: Callable[[str], str] = lambda key: key) -> None:
    """Refuse weights holding NaN or infinity (a training that diverged saved them): a
    detector of NaN weights finds nothing in any image, a decoder's words are noise. Named
    by the first such tensor: ``w.pth: rpn.conv.weight holds NaN or infinite values``."""
    bad = [spelled(key) for key, value in state.items()
           if value.is_floating_point() and not bool(value.isfinite().all())]
    if bad:
        raise CapstackError(f"{where}: {listed(bad)} {'holds' if len(bad) == 1 else 'hold'} "
                            f"NaN or infinite values (weights of a training that diverged?); "
                            f"train again, or use other weights")


def listed(keys: list[str], shown: int = 3) -> str:
    """The first ``shown`` keys, and how many more."""
    more = f" (+{len(keys) - shown} more)" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more
