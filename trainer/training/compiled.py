"""``train.compile: steps``: the decoder's fixed-shape parts through ``torch.compile`` during
the training steps, where a GPU step is otherwise bound by launching its many small kernels.

Two of the decoder's methods are compiled, each as one graph with fixed shapes
(``dynamic=False``), and put in place on the decoder only while a step's loss is made:

- ``recur``, teacher forcing's recurrence over every word of the batch's captions (XE): its
  loop over the T words is unrolled into one forward graph and one backward graph;
- ``step``, one word of every row (sampling and the greedy baseline of SCST, scheduled
  sampling, and teacher forcing of decoders that do not split their step), unless the decoder
  says its state changes shape from word to word (``Decoder.steps_keep_shapes``: the
  transformer's cache grows).

``compile_mode: auto`` is ``reduce-overhead`` on CUDA (CUDA graphs: a step's kernels are
launched as one) and ``default`` elsewhere (fused kernels). Validation, evaluation and
checkpoints see the decoder's own methods: the compiled ones are attributes of the decoder
object during the step alone, so its state dict keeps its keys (no ``_orig_mod.`` prefix).

Shapes vary in three ways: the batch's caption width T (its longest caption), the epoch's
last batch (fewer images), and the mode (a sampled step trains, the greedy baseline's runs
in evaluation mode without gradients). Each new one compiles once and is kept; past
:data:`SHAPES` of them for a method, torch runs further new ones eagerly (and says so once in
its log). Where compiling fails (no working C++ compiler for the CPU's kernels, a backend
that cannot take the graph), the method runs eagerly for the rest of the run, said in one
warning.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Callable, Iterator

import torch

from trainer.decoders.base import Decoder

log = logging.getLogger(__name__)

SHAPES = 24  # compiled variants kept per method (torch._dynamo's recompile limit, at least)
BACKEND = "inductor"  # torch.compile's; tests take "aot_eager" (the same graphs, no codegen)
WARM_UP_CALLS = 3  # a shape's first calls: it compiles; CUDA graphs warm up; then record


def compile_mode(mode: str, device: torch.device) -> str:
    """``auto`` -> CUDA graphs on CUDA, fused kernels elsewhere; another mode as it is."""
    if mode != "auto":
        return mode
    return "reduce-overhead" if device.type == "cuda" else "default"


class CompiledMethod:
    """A decoder method through torch.compile; the method itself once compiling has failed."""

    def __init__(self, name: str, method: Callable, mode: str, backend: str):
        self.name, self.eager = name, method
        self.compiled = torch.compile(method, mode=mode, backend=backend, dynamic=False)
        self.failed = False

    def __call__(self, *args):
        if not self.failed:
            try:
                return self.compiled(*args)
            except torch._dynamo.exc.TorchDynamoException as error:
                self.failed = True
                first = str(error).strip().splitlines()[0] if str(error).strip() else ""
                log.warning("train.compile: the decoder's %s could not be compiled (%s: %s); "
                            "it runs eagerly", self.name, type(error).__name__, first[:200])
        return self.eager(*args)


class CompiledSteps:
    """The decoder's compiled ``recur`` and ``step``, in place inside :meth:`active`."""

    def __init__(self, decoder: Decoder, mode: str, backend: str | None = None):
        self.decoder, self.mode = decoder, mode
        backend = backend or BACKEND
        names = ["recur"] + (["step"] if decoder.steps_keep_shapes else [])
        self.methods = {name: CompiledMethod(name, getattr(decoder, name), mode, backend)
                        for name in names}
        limits = torch._dynamo.config
        limits.recompile_limit = max(limits.recompile_limit, SHAPES)
        limits.accumulated_recompile_limit = max(limits.accumulated_recompile_limit,
                                                 4 * SHAPES)

    @property
    def graphs(self) -> bool:
        """Whether the compiled methods replay CUDA graphs."""
        return self.mode == "reduce-overhead"

    @property
    def failed(self) -> list[str]:
        """The methods that run eagerly since compiling them failed."""
        return [name for name, method in self.methods.items() if method.failed]

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The compiled methods in place of the decoder's own, for one training step's loss."""
        if self.graphs:  # a new step: the CUDA graphs' outputs of the last one may be reused
            torch.compiler.cudagraph_mark_step_begin()
        own = vars(self.decoder)
        own.update(self.methods)  # instance attributes: looked up before the class's methods
        try:
            yield
        finally:
            for name in self.methods:
                own.pop(name, None)


def compiled_steps(setting: str, mode: str, decoder: Decoder,
                   device: torch.device) -> CompiledSteps | None:
    """``train.compile``'s compiled steps for ``decoder`` on ``device``; None when off."""
    if setting == "off":
        return None
    return CompiledSteps(decoder, compile_mode(mode, device))


@contextlib.contextmanager
def active(compiled: CompiledSteps | None) -> Iterator[None]:
    """``compiled.active()``, or nothing when the run compiles nothing."""
    if compiled is None:
        yield
    else:
        with compiled.active():
            yield
