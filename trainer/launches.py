"""What a step asks of the device: the operators that launch kernels, the host syncs, the copies
to the device, counted on any device (the CPU included) by running the step under torch's
function and dispatch modes.

A GPU step of a word-by-word decoder is bound by what the CPU issues: each operator is at least
one kernel launch, and each host sync (``.item()``, ``bool(tensor)``, ``.tolist()``, a copy to
the host, ``nonzero``, a boolean mask as an index) stops the CPU until the GPU has run all it
was given, so that the next kernels are issued only then. A CUDA graph cannot hold a sync (nor
a shape that depends on a tensor's values): a step whose syncs grow with the words cannot be
captured whole. These counts need no GPU: every tensor inside the counted region is taken to
live on the device (the batch is moved there first), so a sync here is one there.

    with StepCount() as count:
        step()
    count.operators, count.syncs, count.where()  # where: "file:line (what)" -> times

What counts as a sync: a call of the step's own code (not of torch's: the optimisers' step
counters live on the host by design) that brings a value to the host, outside
:func:`host_side` (code that waits only where its tensors are on the host, as the CPU path of
a check that on a GPU reads without waiting). A non-blocking copy is not a wait.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# Tensor methods and functions that wait for the device: their result is on the host
SYNCS = frozenset({"item", "tolist", "cpu", "__bool__", "__int__", "__float__",
                   "__index__", "nonzero", "argwhere", "masked_select", "unique",
                   "unique_consecutive"})
# operators that launch no kernel: allocation and metadata (views are told by their schema)
NO_KERNEL = frozenset({aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty,
                       aten.new_empty_strided, aten.detach, aten.alias, aten.lift_fresh,
                       aten._local_scalar_dense, aten.resize_, aten.set_})
TORCH = str(Path(torch.__file__).parent)
OWN_FILES = (TORCH, __file__)
SHIMS = frozenset(str(Path(TORCH, name)) for name in ("_tensor.py", "functional.py",
                                                       "overrides.py"))
_host = threading.local()


@contextlib.contextmanager
def host_side() -> Iterator[None]:
    """Code whose waits happen only where its tensors live on the host (the CPU path of a
    device-aware check): not counted as syncs."""
    before = getattr(_host, "side", False)
    _host.side = True
    try:
        yield
    finally:
        _host.side = before


class StepCount:
    """Operators, host syncs (with where they were asked for) and copies to the device of the
    work run inside it, on the thread that enters it (autograd's backward included)."""

    def __init__(self):
        self.operators = 0
        self.syncs_at: Counter[str] = Counter()
        self.copies_at: Counter[str] = Counter()
        self._function_mode = _SyncWatch(self)
        self._dispatch_mode = _OperatorCount(self)

    @property
    def syncs(self) -> int:
        return sum(self.syncs_at.values())

    @property
    def copies(self) -> int:
        return sum(self.copies_at.values())

    def where(self) -> dict[str, int]:
        """Each host sync's place in the caller's code ("path:line (method)"), most frequent
        first."""
        return dict(self.syncs_at.most_common())

    def __enter__(self) -> "StepCount":
        self._function_mode.__enter__()
        self._dispatch_mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._dispatch_mode.__exit__(*exc)
        self._function_mode.__exit__(*exc)


class _SyncWatch(TorchFunctionMode):
    """Records each call that makes the host wait for the device, and each tensor made from
    host data inside the region."""

    def __init__(self, count: StepCount):
        super().__init__()
        self.count = count

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if getattr(_host, "side", False) or _called_by_torch():
            pass
        elif name in SYNCS or _is_to_host(name, args, kwargs) or _indexes_by_mask(name, args):
            self.count.syncs_at[f"{_caller()} ({name})"] += 1
        elif name in ("as_tensor", "tensor", "from_numpy") and not _is_tensor(args[:1]):
            self.count.copies_at[f"{_caller()} ({name})"] += 1
        return func(*args, **kwargs)


class _OperatorCount(TorchDispatchMode):
    """Counts the operators that compute (a kernel each on a GPU): neither views nor
    allocations."""

    def __init__(self, count: StepCount):
        super().__init__()
        self.count = count

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.overloadpacket not in NO_KERNEL:
            self.count.operators += 1
        return func(*args, **(kwargs or {}))


def _is_tensor(values) -> bool:
    return bool(values) and isinstance(values[0], torch.Tensor)


def _called_by_torch() -> bool:
    """Whether the function was called by torch's own code, past the Python shims through
    which a user's call reaches the mode (``Tensor.unique`` in torch/_tensor.py, ...)."""
    frame: FrameType | None = sys._getframe(2)  # the caller of the mode's __torch_function__
    while frame is not None and frame.f_code.co_filename in SHIMS:
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(TORCH)


def _is_to_host(name: str, args, kwargs) -> bool:
    """``tensor.to("cpu")`` or ``.to(device=torch.device("cpu"))``, unless non-blocking."""
    if name != "to" or kwargs.get("non_blocking"):
        return False
    targets = [*args[1:], kwargs.get("device")]
    return any(str(t) == "cpu" for t in targets if isinstance(t, (str, torch.device)))


def _indexes_by_mask(name: str, args) -> bool:
    """``x[mask]`` or ``x[mask] = v`` with a boolean tensor: the selected count is a sync."""
    if name not in ("__getitem__", "__setitem__") or len(args) < 2:
        return False
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)


def _caller() -> str:
    """The innermost frame outside torch and this file, as ``path:line``."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(OWN_FILES):
        frame = frame.f_back
    if frame is None:
        return "?"
    path = Path(frame.f_code.co_filename)
    try:
        path = path.relative_to(Path(__file__).resolve().parent.parent)
    except ValueError:
        pass
    return f"{path}:{frame.f_lineno}"
