"""Word-by-word decoding against ``decoder.step``: greedy decoding, sampling, and the pieces
every search shares (:class:`Decoded`, the length cut, the in-place log-softmax).

Each search takes the per-image context from ``decoder.encode`` and returns a
:class:`Decoded`: word ids ``[B, T]`` (``<eos>`` then ``<pad>`` after a caption
ends), their log-probabilities ``[B, T]`` (0 after the end) and the attention
``[B, T, L]`` (None for decoders without attention). Beam search is trainer/decoding/beam.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from pipeline.core.tokens import BOS_ID, EOS_ID, PAD_ID
from trainer.decoders.base import Context, Decoder, images_of, stack_steps
from trainer.launches import host_side


@dataclass
class Decoded:
    tokens: Tensor  # [B, T]
    logprobs: Tensor  # [B, T]
    alphas: Tensor | None  # [B, T, L]

    @property
    def scores(self) -> Tensor:
        """Each caption's total log-probability [B]."""
        return self.logprobs.sum(1)


@dataclass(frozen=True)
class SamplingNoise:
    """The uniform draws of multinomial sampling, a function of (key, step, row) alone.

    Row ``offset + i`` of the global batch gets the same draw at step ``t``
    whichever process samples it and whatever else that process samples: so a
    batch split over DDP ranks samples what one process would, and a resumed
    run samples what the uninterrupted one did.
    """

    key: tuple[int, ...]
    rows: int  # sampled rows of the global batch
    offset: int = 0  # this process's first row

    def __call__(self, t: int, n: int) -> np.ndarray:
        return np.random.default_rng([*self.key, t]).random(self.rows)[self.offset:self.offset + n]

    def table(self, steps: int, n: int, device: torch.device) -> Tensor:
        """The draws of steps 0..steps-1, [steps, n] float32 on ``device``, copied there at once
        (a copy a word would make the host wait for the device each time)."""
        draws = torch.from_numpy(np.stack([self(t, n) for t in range(steps)]).astype(np.float32))
        if device.type == "cuda":
            draws = draws.pin_memory()
        return draws.to(device, non_blocking=True)

    def child(self, *key: int) -> "SamplingNoise":
        """Independent draws for another sampling of the same batch (e.g. another stage)."""
        return SamplingNoise((*self.key, *key), self.rows, self.offset)


def greedy(decoder: Decoder, ctx: Context, max_len: int) -> Decoded:
    return step_by_step(decoder, ctx, images_of(ctx), max_len, lambda logp, t: logp.argmax(1))


def sample(decoder: Decoder, ctx: Context, max_len: int, temperature: float = 1.0,
           n: int = 1, noise: SamplingNoise | None = None, prefix: Tensor | None = None,
           scale: Callable[[int], float] | None = None) -> Decoded:
    """``n`` sampled captions per image ([B*n, T], an image's samples adjacent).

    With ``prefix`` [B*m, P] (word ids, no ``<bos>``; m rows of each image, adjacent),
    the first P words of each of its rows are the prefix's and the rest is sampled,
    n times for each: Monte-Carlo rollouts, [B*m*n, T].

    The log-probabilities keep their graph when called with gradients enabled
    (REINFORCE needs them); they are those of the model, not of the tempered
    distribution. With ``noise`` each word is drawn by inverting the cumulative
    distribution at the row's uniform draw (reproducible across processes);
    without, by ``torch.multinomial`` from the global generator.

    ``scale`` multiplies the logits of the word at each step t (0: the first word) before
    the draw, on top of the temperature: the word is drawn from
    softmax(scale(t) / temperature x logits) (LeakGAN's generation sharpens its first two words
    by 1.5 and flattens the rest by 0.8). Where it is 1 (or None) the draw is as without it,
    from softmax(logits / temperature); the recorded log-probabilities are the unscaled
    model's either way.
    """
    forced = prefix.repeat_interleave(n, 0) if prefix is not None and n > 1 else prefix
    rows = forced.shape[0] if forced is not None else images_of(ctx) * n
    draws = None if noise is None else noise.table(max_len, rows, device_of(ctx))

    def pick(logp: Tensor, t: int) -> Tensor:
        if forced is not None and t < forced.shape[1]:
            return forced[:, t]
        if t >= max_len:  # only <eos> may follow max_len words: no draw (its probability
            return torch.full_like(logp[:, 0], EOS_ID, dtype=torch.long)  # may underflow)
        # logp is normalised already: at temperature 1 its exp is the distribution
        factor = 1.0 if scale is None else scale(t)
        if factor == 1:
            probs = logp.exp() if temperature == 1 else \
                torch.softmax(tempered(logp, temperature), 1)
        else:
            probs = torch.softmax(tempered(logp * factor, temperature), 1)
        if draws is None:
            return torch.multinomial(probs, 1).squeeze(1)
        u = draws[t]
        cdf = torch.cumsum(probs, 1)
        picked = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1)
        return picked.clamp(max=probs.shape[1] - 1)

    return step_by_step(decoder, ctx, rows, max_len, pick)


def tempered(x: Tensor, temperature: float) -> Tensor:
    """``x / temperature`` for rows [N, V] of logits or log-probabilities, each row still a
    distribution to softmax however small the temperature.

    A row none of whose values float32 can hold once divided (all -inf, an +inf, or 0 / 0 where
    the temperature itself rounds to 0: below about 1e-38 on most rows) would softmax to NaN:
    it is its limit as the temperature falls to 0 instead, 0 at its largest values and -inf
    elsewhere (the most probable word, ties shared). The other rows are ``x / temperature``
    itself, as at any ordinary temperature."""
    if temperature == 1:
        return x
    scaled = x / temperature
    lost = ~torch.isfinite(scaled.amax(1, keepdim=True))  # without a branch: no host sync
    limit = torch.zeros_like(x).masked_fill(x != x.amax(1, keepdim=True), float("-inf"))
    return torch.where(lost, limit, scaled)


def step_by_step(decoder: Decoder, ctx: Context, n: int, max_len: int, pick) -> Decoded:
    """``n`` rows of the context's images (n / B each) decoded word by word."""
    state = decoder.with_room(decoder.init_state(ctx, n), max_len + 1)
    words = torch.full((n,), BOS_ID, dtype=torch.long, device=state[0].device)
    done = torch.zeros(n, dtype=torch.bool, device=words.device)
    ended = _EndCheck(words.device, max_len + 1)
    tokens, logprobs, alphas = [], [], []
    for t in range(max_len + 1):  # max_len words, then room for <eos>
        logits, state, alpha = decoder.step(words, state, ctx)
        with torch.no_grad():
            full = log_softmax_in_place(logits.float())  # [N, V]; greedy: in place
        logp = ending_at(t, max_len, full)
        words = pick(logp, t).masked_fill(done, PAD_ID)
        tokens.append(words)
        logprobs.append(picked_logprobs(logits, full, words).masked_fill(done, 0.0))
        alphas.append(alpha)
        done = done | (words == EOS_ID)
        if ended(done):
            break
    return Decoded(torch.stack(tokens, 1), torch.stack(logprobs, 1), stack_steps(alphas))


class _EndCheck:
    """Whether every row has ended, asked after each word without stopping the host.

    On the CPU the answer is the word's own. On a GPU, waiting for it each word would leave the
    GPU idle while the host issues the next word's kernels (and no CUDA graph holds a wait): each
    word's answer is copied to pinned memory behind an event, and the decoding stops at the
    first answer the GPU has delivered that says so. It may run a few words past the end: those
    words are ``<pad>`` at log-probability 0 in every row, as after any row's end.
    """

    def __init__(self, device: torch.device, words: int):
        self.waits = device.type != "cuda"
        if not self.waits:
            self.answers = torch.zeros(words, dtype=torch.bool, pin_memory=True)
            self.asked: list[tuple[int, torch.cuda.Event]] = []
            self.word = 0

    def __call__(self, done: Tensor) -> bool:
        if self.waits:
            with host_side():  # on the host: the answer is there already
                return bool(done.all())
        self.answers[self.word].copy_(done.all(), non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self.asked.append((self.word, event))
        self.word += 1
        while self.asked and self.asked[0][1].query():  # delivered: read without waiting
            word, _ = self.asked.pop(0)
            with host_side():  # pinned host memory the GPU has written
                if bool(self.answers[word]):
                    return True
        return False


def device_of(ctx: Context) -> torch.device:
    """The device of a context's tensors."""
    return next(iter(ctx.values())).device


class _PickedLogProbs(torch.autograd.Function):
    """log p(w) of each row's picked word, read from the rows' log-softmax, with the gradient
    of log_softmax(logits)[w], onehot(w) - softmax(logits), made in two passes over [N, V]
    (autograd's gather and log-softmax backward make a zero-filled [N, V] and three more)."""

    @staticmethod
    def forward(ctx, logits: Tensor, logp: Tensor, words: Tensor) -> Tensor:
        ctx.save_for_backward(logp, words)
        ctx.dtype = logits.dtype
        return logp.gather(1, words[:, None]).squeeze(1)

    @staticmethod
    def backward(ctx, grad: Tensor):
        logp, words = ctx.saved_tensors
        grad_logits = logp.exp().mul_(-grad[:, None])
        grad_logits.scatter_add_(1, words[:, None], grad[:, None].to(grad_logits.dtype))
        return grad_logits.to(ctx.dtype), None, None


def picked_logprobs(logits: Tensor, logp: Tensor, words: Tensor) -> Tensor:
    """log p(w) [N] of words [N] from logp = log_softmax(logits) [N, V] (taken without a graph),
    differentiable in the logits when they have a graph (sampling for REINFORCE)."""
    if torch.is_grad_enabled() and logits.requires_grad:
        return _PickedLogProbs.apply(logits, logp, words)
    return logp.gather(1, words[:, None]).squeeze(1)


def log_softmax_in_place(logits: Tensor) -> Tensor:
    """log_softmax over the vocabulary [N, V], in the logits' memory when they are a tensor of
    their own that no graph needs (beam search and greedy decoding read a step's logits once):
    at COCO's vocabulary, fresh [N, V] tensors a step were a tenth of a beam search on a CPU."""
    owns_storage = logits.untyped_storage().nbytes() == logits.numel() * logits.element_size()
    if logits.requires_grad or not logits.is_contiguous() or not owns_storage:
        return torch.log_softmax(logits, 1)
    return torch._log_softmax(logits, 1, False, out=logits)


def ending_at(t: int, max_len: int, logp: Tensor) -> Tensor:
    """After ``max_len`` words only ``<eos>`` may follow, scored by the model's log P(<eos>).

    Training captions are cut at ``max_len`` words and end with ``<eos>``: a
    caption decoded longer would be scored (by rewards and by the evaluation) at
    a length the model never learnt. Every other word is impossible at that
    step; ``<eos>`` keeps its own probability (not renormalised to 1), so a beam
    that is cut there competes with the ones that ended by themselves on the
    probability the model gives the whole caption, ``<eos>`` included.
    """
    if t < max_len:
        return logp
    only_eos = torch.zeros_like(logp, dtype=torch.bool)
    only_eos[:, EOS_ID] = True
    return logp.masked_fill(~only_eos, float("-inf"))
