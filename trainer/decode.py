"""Greedy decoding, sampling and beam search, written once against ``decoder.step``.

Each takes the per-image context from ``decoder.encode`` and returns a
:class:`Decoded`: word ids ``[B, T]`` (``<eos>`` then ``<pad>`` after a caption
ends), their log-probabilities ``[B, T]`` (0 after the end) and the attention
``[B, T, L]`` (None for decoders without attention). Beam search runs all
images x beams as one batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from pipeline.vocab import BOS_ID, EOS_ID, PAD_ID
from trainer.decoders.base import Context, Decoder, expand_context, select


@dataclass
class Decoded:
    tokens: Tensor  # [B, T]
    logprobs: Tensor  # [B, T]
    alphas: Tensor | None  # [B, T, L]

    @property
    def scores(self) -> Tensor:
        """Each caption's total log-probability [B]."""
        return self.logprobs.sum(1)


def greedy(decoder: Decoder, ctx: Context, max_len: int) -> Decoded:
    return _step_by_step(decoder, ctx, max_len, lambda logp: logp.argmax(1))


def sample(decoder: Decoder, ctx: Context, max_len: int, temperature: float = 1.0,
           n: int = 1) -> Decoded:
    """``n`` sampled captions per image ([B*n, T], an image's samples adjacent).

    The log-probabilities keep their graph when called with gradients enabled
    (REINFORCE needs them); they are those of the model, not of the tempered
    distribution.
    """
    ctx = expand_context(ctx, n) if n > 1 else ctx

    def pick(logp: Tensor) -> Tensor:
        return torch.multinomial(torch.softmax(logp.detach() / temperature, 1), 1).squeeze(1)

    return _step_by_step(decoder, ctx, max_len, pick)


def _step_by_step(decoder: Decoder, ctx: Context, max_len: int, pick) -> Decoded:
    n = next(iter(ctx.values())).shape[0]
    state = decoder.init_state(ctx)
    words = torch.full((n,), BOS_ID, dtype=torch.long, device=state[0].device)
    done = torch.zeros(n, dtype=torch.bool, device=words.device)
    tokens, logprobs, alphas = [], [], []
    for _ in range(max_len + 1):  # max_len words, then room for <eos>
        logits, state, alpha = decoder.step(words, state, ctx)
        logp = torch.log_softmax(logits.float(), 1)  # [N, V]
        words = pick(logp).masked_fill(done, PAD_ID)
        tokens.append(words)
        logprobs.append(logp.gather(1, words[:, None]).squeeze(1).masked_fill(done, 0.0))
        alphas.append(alpha)
        done = done | (words == EOS_ID)
        if done.all():
            break
    return Decoded(torch.stack(tokens, 1), torch.stack(logprobs, 1),
                   torch.stack(alphas, 1) if alphas[0] is not None else None)


def beam_search(decoder: Decoder, ctx: Context, beam_size: int, max_len: int) -> Decoded:
    """The highest-scoring caption per image (sum of log-probabilities), K beams per image.

    All B x K hypotheses advance as one batch. A hypothesis that emitted
    ``<eos>`` stays in its beam with its score frozen (it only extends with
    ``<pad>`` at no cost), so finished and unfinished captions compete on
    total log-probability, as the papers' beam search does.
    """
    k = beam_size
    b = next(iter(ctx.values())).shape[0]
    ctx = expand_context(ctx, k)  # [B*K, ...]
    state = decoder.init_state(ctx)
    device = state[0].device
    words = torch.full((b * k,), BOS_ID, dtype=torch.long, device=device)
    scores = torch.full((b, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # every beam starts as the same empty caption: keep one
    done = torch.zeros(b * k, dtype=torch.bool, device=device)
    tokens = torch.zeros(b * k, 0, dtype=torch.long, device=device)
    logprobs = torch.zeros(b * k, 0, device=device)
    alphas = None
    offsets = (torch.arange(b, device=device) * k)[:, None]  # [B, 1]
    for _ in range(max_len + 1):
        logits, state, alpha = decoder.step(words, state, ctx)
        logp = torch.log_softmax(logits.float(), 1)  # [B*K, V]
        v = logp.shape[1]
        logp = torch.where(done[:, None], _finished_row(v, device), logp)
        total = (scores.reshape(-1, 1) + logp).reshape(b, k * v)  # [B, K*V]
        scores, flat = total.topk(k, dim=1)  # [B, K]
        beam, words = flat // v, flat % v  # [B, K]
        rows = (offsets + beam).reshape(-1)  # [B*K] the hypothesis each new one extends
        words = words.reshape(-1)
        step_logp = logp[rows, words]
        state = select(state, rows)
        tokens = torch.cat([tokens[rows], words[:, None]], 1)
        logprobs = torch.cat([logprobs[rows], step_logp[:, None]], 1)
        if alpha is not None:
            alpha = alpha.index_select(0, rows)[:, None]
            alphas = alpha if alphas is None else torch.cat([alphas[rows], alpha], 1)
        done = done[rows] | (words == EOS_ID)
        if done.all():
            break
    best = offsets.squeeze(1) + scores.argmax(1)  # [B]
    return Decoded(tokens[best], logprobs[best], alphas[best] if alphas is not None else None)


def _finished_row(v: int, device) -> Tensor:
    """A finished hypothesis's next-word log-probabilities: <pad> free, the rest impossible."""
    row = torch.full((v,), float("-inf"), device=device)
    row[PAD_ID] = 0.0
    return row
