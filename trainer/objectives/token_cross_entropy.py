"""The summed cross-entropy of teacher forcing's target tokens, made where the logits lie.

At COCO's sizes (250 captions x 16 steps x 9,487 words) the logits are 150 MB a step, and
torch's cross-entropy passes over that much four more times (log-softmax, a zero gradient
for the picked entries, log-softmax's backward, the copy of the bias into the logits) in
fresh memory, which a CPU also pays in page faults. :class:`SummedCrossEntropy` turns the
saved log-probabilities into their own gradient; :class:`VocabularyCrossEntropy` also makes
the logits itself, from the decoder's vocabulary layer and what that layer reads
(:class:`~trainer.decoders.base.ReadOut`), into memory kept between steps on a CPU, and
takes the layer's gradients from that buffer. Both give torch's values and gradients, the
same products in the same order (``tests/test_objectives.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from trainer.decoders.base import DecoderOutput


def token_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """-log p of every real target token (<eos> included, <pad> ignored), summed."""
    return SummedCrossEntropy.apply(logits.reshape(-1, logits.shape[-1]).float(),
                                    targets.reshape(-1))  # rows: log-softmax on contiguous V


def output_cross_entropy(output: DecoderOutput, targets: Tensor) -> Tensor:
    """:func:`token_cross_entropy` of teacher forcing's output: from its unmade logits (its
    readout, the vocabulary layer and its input) where it has them in float32, else from
    its logits."""
    readout = output.readout
    if output.projected or readout is None or not _fusable(readout.features, readout.layer):
        return token_cross_entropy(output.logits, targets)
    features = readout.features
    return VocabularyCrossEntropy.apply(features.reshape(-1, features.shape[-1]),
                                        readout.layer.weight, readout.layer.bias,
                                        targets.reshape(-1), torch.is_grad_enabled())


def _fusable(features: Tensor, layer: torch.nn.Linear) -> bool:
    """float32 throughout and no autocast (which would run the layer in half precision)."""
    tensors = [features, layer.weight] + ([layer.bias] if layer.bias is not None else [])
    return (all(t.dtype == torch.float32 for t in tensors)
            and not torch.is_autocast_enabled(features.device.type))


class SummedCrossEntropy(torch.autograd.Function):
    """``F.cross_entropy(logits, targets, ignore_index=0, reduction="sum")`` with the
    gradient ``softmax - onehot`` made in place in the saved log-probabilities.

    torch's backward fills a zero [M, V] gradient for the gathered entries, then its
    log-softmax backward reads it and the log-probabilities to write a third [M, V]
    tensor: at COCO's vocabulary these passes over the logits were a tenth of an XE step
    on a CPU. Here backward exponentiates the saved log-probabilities where they lie and
    subtracts 1 at the targets. So the graph can be run backward once only, as every
    training step does."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor) -> Tensor:
        logprobs = torch.log_softmax(logits, 1)  # [M, V]
        loss, real = _summed_loss(logprobs, targets)
        ctx.save_for_backward(logprobs, targets, real)
        return loss

    @staticmethod
    def backward(ctx, grad: Tensor):
        logprobs, targets, real = ctx.saved_tensors
        return _gradient_in_place(logprobs, targets, real, grad), None


class VocabularyCrossEntropy(torch.autograd.Function):
    """:class:`SummedCrossEntropy` of ``features @ weight.T + bias``, the logits made in a
    buffer of :data:`WORKSPACE` and never handed out: forward makes them there and takes
    their log-softmax in place; backward turns that into the logits' gradient G in place
    and returns G @ weight, G.T @ features and G's column sums, the products autograd
    would take. Run backward once, as :class:`SummedCrossEntropy`."""

    @staticmethod
    def forward(ctx, features: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                grad_enabled: bool) -> Tensor:
        logits = WORKSPACE.take((features.shape[0], weight.shape[0]), features)
        if bias is None:
            torch.mm(features, weight.t(), out=logits)
        else:
            torch.addmm(bias, features, weight.t(), out=logits)
        logprobs = torch._log_softmax(logits, 1, False, out=logits)
        loss, real = _summed_loss(logprobs, targets)
        if grad_enabled and any(ctx.needs_input_grad):  # (forward itself runs without grad)
            ctx.save_for_backward(logprobs, features, weight, targets, real)
            ctx.has_bias = bias is not None
        else:  # no backward will come for it
            WORKSPACE.give_back(logits)
        return loss

    @staticmethod
    def backward(ctx, grad: Tensor):
        logprobs, features, weight, targets, real = ctx.saved_tensors
        gradient = _gradient_in_place(logprobs, targets, real, grad)  # [M, V]
        wants = ctx.needs_input_grad
        d_features = gradient.mm(weight) if wants[0] else None
        d_weight = gradient.t().mm(features) if wants[1] else None
        d_bias = gradient.sum(0) if ctx.has_bias and wants[2] else None
        WORKSPACE.give_back(gradient)
        return d_features, d_weight, d_bias, None, None


def _summed_loss(logprobs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """-sum of the targets' log-probabilities over real tokens, and which tokens are real."""
    real = targets != 0
    picked = logprobs.gather(1, targets[:, None]).squeeze(1)  # [M]
    return -(picked * real).sum(), real


def _gradient_in_place(logprobs: Tensor, targets: Tensor, real: Tensor, grad: Tensor) -> Tensor:
    """softmax - onehot(targets), scaled by ``grad`` on real tokens, in ``logprobs``' memory."""
    gradient = logprobs.exp_()  # softmax, in the saved tensor's memory
    gradient.scatter_add_(1, targets[:, None], -torch.ones_like(gradient[:, :1]))
    return gradient.mul_((grad * real)[:, None])


class Workspace:
    """One float buffer per device kept between steps for :class:`VocabularyCrossEntropy`'s
    logits, on a CPU: fresh 150 MB a step costs its page faults there, not on a GPU, whose
    allocator keeps memory anyway. A buffer in use is taken out until given back, so two
    cross-entropies alive at once never share one; one dropped without a backward is
    freed as any tensor."""

    def __init__(self) -> None:
        self._free: dict[tuple, Tensor] = {}

    def take(self, shape: tuple[int, int], like: Tensor) -> Tensor:
        numel = shape[0] * shape[1]
        key = (like.device, like.dtype)
        buffer = self._free.pop(key, None) if like.device.type == "cpu" else None
        if buffer is None or buffer.numel() < numel:
            buffer = like.new_empty(numel)
        return buffer[:numel].view(shape)

    def give_back(self, used: Tensor) -> None:
        if used.device.type != "cpu":
            return
        whole = used._base if used._base is not None else used
        key = (used.device, used.dtype)
        kept = self._free.get(key)
        if kept is None or kept.numel() < whole.numel():
            self._free[key] = whole


WORKSPACE = Workspace()
