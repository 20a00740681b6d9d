"""The Transformer captioner (Vaswani et al. 2017) as self-critical.pytorch and xmodaler use it.

An encoder over the image's regions, a decoder over the caption's words:

    e_i = Dropout(LayerNorm(ReLU(W_v v_i + b_v)))           region embedding [B, L, d]
    E   = Encoder^N(e)        N x (self-attention over the valid regions, FFN)
    x_t = sqrt(d) W_e y_t + PE(t)                           word embedding + sinusoid [N, T, d]
    h_t = Decoder^N(x_<=t, E) N x (masked self-attention, cross-attention over E, FFN)
    p(y_{t+1}) = softmax(W_o h_t + b_o)

Each sublayer f is wrapped as ``LayerNorm(x + Dropout(f(x)))``, the paper's post-norm (and
xmodaler's). ``norm_first: true`` gives ``x + Dropout(f(LayerNorm(x)))`` with a LayerNorm after
each stack instead, as self-critical.pytorch's TransformerModel (from the Annotated Transformer)
does. FFN(x) = W_2 Dropout(ReLU(W_1 x)). Weights are Glorot-initialised as there.

The region embedding is xmodaler's ``VisualBaseEmbedding`` (Linear, ReLU, LayerNorm, Dropout);
``region_norm: false`` drops the LayerNorm, as self-critical.pytorch's ``att_embed``.

``layer_norm: unbiased_std`` makes every LayerNorm the Annotated Transformer's, as
self-critical.pytorch's: ``a (x - mean) / (std + 1e-6) + b`` with the unbiased std, where the
default ``torch`` is ``torch.nn.LayerNorm``, ``a (x - mean) / sqrt(var + 1e-5) + b``. Its
parameters have nn.LayerNorm's names (``weight``, ``bias``).

Parity. ``python benchmarks/parity.py --peer SELF_CRITICAL_CHECKOUT`` gives this decoder
(``norm_first: true, region_norm: false``) the weights of self-critical.pytorch's
TransformerModel and compares the log-probabilities of both, teacher forced and word by word,
in float64: equal to 1e-9 with ``layer_norm: unbiased_std`` (the peer's own LayerNorm, the
Annotated Transformer's: unbiased std, eps outside the root), and with the default once the
peer's is given torch's formula. The
post-norm default follows the paper and xmodaler; it was not run beside xmodaler.

Box geometry. With ``data.box_geometry: true`` each region's feature arrives with
``[x1/w, y1/h, x2/w, y2/h, area]`` appended (trainer/data.py ``box_geometry``), so the region
embedding W_v reads [v_i, g_i]: W_v [v; g] = W_f v + W_g g, which is xmodaler's separate
location embedding (a Linear of the 5 box numbers added to the feature's). Nothing here needs
to know: the decoder's feature_dim is D + 5 and the regions, which have no order and get no
positional encoding, are told apart by where they are. Without it the encoder sees a set of
features alone.

Decoding. Teacher forcing is one pass over the whole caption with a causal mask
(:meth:`Transformer.forward`). ``step`` decodes one word for each caption with a key/value
cache: the state is ``(keys, values)``, each ``[N, layers, t, d]``, every decoder layer's
self-attention keys and values of the t words so far (heads merged in the last dim). A step
projects only its new word, attends over the cached positions and its own, and returns the
state grown by one position; the word's position is the cache's length. Decoding (sampling,
greedy, beam search), which knows how many words it may step, first gives the cache room
(:meth:`Transformer.with_room`): ``[N, layers, S, d]`` with a slot for every word and a
``[N, S]`` mask of the filled ones; a step then writes its word's keys and values into the
first free slot and attends to the filled ones, so the state keeps its shapes from word to
word (a compiled step, CUDA graphs) and no step reads a value on the host. The first dimension
is the caption (or beam), so beam search's ``index_select`` reorders each hypothesis's cache
with it, and compacting the batch drops rows, as for any other state. The cross-attention's
keys and values of the encoded regions are projected once per image in ``encode`` (the
context's ``keys`` and ``values``, ``[B, layers, L, d]``), and the k rows of an image query
them together: its captions' (or beams') T positions are one sequence of k T queries over its
L regions.

Attention pictures: ``alpha`` is the last decoder layer's cross-attention, averaged over the
heads ([N, L] per step, [N, T, L] under teacher forcing), 0 on padded regions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.decoders import DECODERS
from trainer.decoders.base import (Context, Decoder, DecoderConfig, DecoderOutput, ReadOut,
                                   State, WordFeed)
from trainer.modules.dropout import Dropout


@dataclass
class TransformerConfig(DecoderConfig):
    d_model: int = 512  # every embedding's and sublayer's width
    heads: int = 8  # attention heads; d_model / heads each
    layers: int = 6  # N: encoder layers, and as many decoder layers
    d_ff: int = 2048  # the feed-forward sublayer's inner width
    dropout: float = 0.1  # P_drop: embeddings, sublayer outputs, attention weights, FFN inner
    norm_first: bool = False  # pre-norm and a final LayerNorm per stack (self-critical.pytorch)
    region_norm: bool = True  # a LayerNorm in the region embedding (xmodaler); false: sc.pytorch
    # every LayerNorm: torch's, or the Annotated Transformer's (sc.pytorch): unbiased std + 1e-6
    layer_norm: Literal["torch", "unbiased_std"] = "torch"

    def check(self):
        yield from super().check()
        if self.heads and self.d_model % self.heads:
            yield f"d_model: must be a multiple of heads ({self.heads}), got {self.d_model}"


class UnbiasedStdNorm(nn.Module):
    """a (x - mean) / (std + eps) + b over the last dimension, std unbiased (the Annotated
    Transformer's LayerNorm); its parameters named as nn.LayerNorm's."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x: Tensor) -> Tensor:
        mean = x.mean(-1, keepdim=True)
        return self.weight * (x - mean) / (x.std(-1, keepdim=True) + self.eps) + self.bias


def layer_norm(config: TransformerConfig) -> nn.Module:
    """The LayerNorm ``config.layer_norm`` names, of width d_model."""
    if config.layer_norm == "unbiased_std":
        return UnbiasedStdNorm(config.d_model)
    return nn.LayerNorm(config.d_model)


def sinusoid(positions: Tensor, d: int) -> Tensor:
    """PE(t, 2i) = sin(t / 10000^(2i/d)), PE(t, 2i+1) = cos(t / 10000^(2i/d)): [T] -> [T, d]."""
    rates = torch.exp(torch.arange(0, d, 2, device=positions.device) * (-math.log(10000.0) / d))
    angles = positions.float()[:, None] * rates  # [T, ceil(d/2)]
    return torch.stack([angles.sin(), angles.cos()], -1).flatten(1)[:, :d]


def split_heads(x: Tensor, heads: int) -> Tensor:
    """[N, T, d] -> [N, h, T, d/h]"""
    return x.unflatten(-1, (heads, -1)).transpose(1, 2)


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention of h heads (F.scaled_dot_product_attention).

    Keys and values are projected by :meth:`keys_values` apart from the queries, so a
    caller can keep them: the regions' once per image, the words' in the step cache.
    """

    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.p = heads, dropout
        self.query = nn.Linear(d, d)
        self.key_value = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, d)
        self.weights_dropout = Dropout(dropout)

    def keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """[N, T, d] -> keys, values [N, T, d] each."""
        return self.key_value(x).chunk(2, -1)

    def forward(self, x: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None,
                causal: bool = False, weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """Queries from x [N, Tq, d] over keys/values [N, Tk, d]; mask [N, Tk] bool (True:
        attend); ``causal``: query i sees keys 0..i (Tq = Tk). -> [N, Tq, d], and with
        ``weights`` the attention averaged over heads [N, Tq, Tk] (computed explicitly then,
        for a cross-attention: not causal; otherwise the fused kernel)."""
        q = split_heads(self.query(x), self.heads)  # [N, h, Tq, d/h]
        k, v = split_heads(keys, self.heads), split_heads(values, self.heads)  # [N, h, Tk, d/h]
        key_mask = None if mask is None else mask[:, None, None, :]  # [N, 1, 1, Tk]
        alpha = None
        if weights:
            assert not causal, "attention weights are kept of a cross-attention only"
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [N, h, Tq, Tk]
            if key_mask is not None:
                scores = scores.masked_fill(~key_mask, float("-inf"))
            p = scores.softmax(-1)
            alpha = p.mean(1)
            out = self.weights_dropout(p) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, is_causal=causal,
                                                 dropout_p=self.p if self.training else 0.0)
        return self.out(out.transpose(1, 2).flatten(2)), alpha  # heads concatenated: [N, Tq, d]


class FeedForward(nn.Sequential):
    """FFN(x) = W_2 Dropout(ReLU(W_1 x + b_1)) + b_2"""

    def __init__(self, d: int, d_ff: int, dropout: float):
        super().__init__(nn.Linear(d, d_ff), nn.ReLU(), Dropout(dropout), nn.Linear(d_ff, d))


class Sublayers(nn.Module):
    """The residual wrapping of a layer's sublayers: post-norm LN(x + Dropout(f(x))), or
    pre-norm x + Dropout(f(LN(x))); ``into(x, i)`` is what sublayer i reads, ``add`` its
    output back."""

    def __init__(self, config: TransformerConfig, count: int):
        super().__init__()
        self.norm_first = config.norm_first
        self.norms = nn.ModuleList(layer_norm(config) for _ in range(count))
        self.dropout = Dropout(config.dropout)

    def into(self, x: Tensor, i: int) -> Tensor:
        return self.norms[i](x) if self.norm_first else x

    def add(self, x: Tensor, update: Tensor, i: int) -> Tensor:
        x = x + self.dropout(update)
        return x if self.norm_first else self.norms[i](x)


class EncoderLayer(Sublayers):
    def __init__(self, config: TransformerConfig):
        super().__init__(config, 2)
        self.attention = MultiHeadAttention(config.d_model, config.heads, config.dropout)
        self.ffn = FeedForward(config.d_model, config.d_ff, config.dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """regions [B, L, d], mask [B, L]: padded regions are no one's keys."""
        y = self.into(x, 0)
        x = self.add(x, self.attention(y, *self.attention.keys_values(y), mask)[0], 0)
        return self.add(x, self.ffn(self.into(x, 1)), 1)


class DecoderLayer(Sublayers):
    def __init__(self, config: TransformerConfig):
        super().__init__(config, 3)
        self.self_attention = MultiHeadAttention(config.d_model, config.heads, config.dropout)
        self.cross_attention = MultiHeadAttention(config.d_model, config.heads, config.dropout)
        self.ffn = FeedForward(config.d_model, config.d_ff, config.dropout)

    def forward(self, x: Tensor, past: tuple[Tensor, Tensor] | None, memory: tuple[Tensor, Tensor],
                mask: Tensor, weights: bool, room: tuple[Tensor, Tensor] | None = None
                ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Words x [N, T, d] after the ``past`` positions' keys and values ([N, t, d] each, or
        None: then x is the whole caption, causally masked), the images' regions' keys and values
        ``memory`` [B, L, d] each and ``mask`` [B, L] (N = B k) -> x [N, T, d], this layer's
        keys and values of all t + T positions, the cross-attention [N, T, L] (with
        ``weights``). With ``room`` = (slot, seen), each [N, S] bool, ``past`` is a cache of S
        slots and x one word: its keys and values go in its ``slot``, and it attends to the
        slots ``seen`` (the words before it and its own); the cache's S slots are returned."""
        y = self.into(x, 0)
        keys, values = self.self_attention.keys_values(y)  # [N, T, d]
        seen = None
        if past is not None and room is not None:  # one word, written in its slot
            slot, seen = room[0][:, :, None], room[1]
            keys = torch.where(slot, keys, past[0].to(keys.dtype))  # [N, S, d]
            values = torch.where(slot, values, past[1].to(values.dtype))
        elif past is not None:
            keys = torch.cat([past[0].to(keys.dtype), keys], 1)  # [N, t + T, d]
            values = torch.cat([past[1].to(values.dtype), values], 1)
        x = self.add(x, self.self_attention(y, keys, values, seen, causal=past is None)[0], 0)
        n, t, images = x.shape[0], x.shape[1], mask.shape[0]
        queries = self.into(x, 1).reshape(images, -1, x.shape[2])  # an image's rows: [B, k T, d]
        attended, alpha = self.cross_attention(queries, *memory, mask, weights=weights)
        x = self.add(x, attended.reshape(n, t, -1), 1)
        alpha = None if alpha is None else alpha.reshape(n, t, -1)
        return self.add(x, self.ffn(self.into(x, 2)), 2), keys, values, alpha


@DECODERS.register("transformer")
class Transformer(Decoder):
    """The Transformer: a self-attention encoder over the regions and a decoder over the words
    (one teacher-forced pass; a key/value cache when decoding word by word)."""

    Config = TransformerConfig

    def __init__(self, config: TransformerConfig, vocab_size: int, feature_dim: int):
        super().__init__(config, vocab_size, feature_dim)
        d = config.d_model
        norm = [layer_norm(config)] if config.region_norm else []
        self.feature_embed = nn.Sequential(nn.Linear(feature_dim, d), nn.ReLU(), *norm,
                                           Dropout(config.dropout))  # W_v
        self.encoder = nn.ModuleList(EncoderLayer(config) for _ in range(config.layers))
        self.word_embed = nn.Embedding(vocab_size, d)  # W_e
        self.word_dropout = Dropout(config.dropout)
        self.decoder = nn.ModuleList(DecoderLayer(config) for _ in range(config.layers))
        self.encoder_norm = layer_norm(config) if config.norm_first else nn.Identity()
        self.decoder_norm = layer_norm(config) if config.norm_first else nn.Identity()
        self.out = nn.Linear(d, vocab_size)  # W_o
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def encode(self, feats: Tensor, mask: Tensor) -> Context:
        x = self.feature_embed(feats)  # [B, L, d]
        for layer in self.encoder:
            x = layer(x, mask)
        x = self.encoder_norm(x)
        layers = cast(Iterable[DecoderLayer], self.decoder)
        kv = torch.stack([torch.cat(layer.cross_attention.keys_values(x), -1)
                          for layer in layers], 1)  # [B, layers, L, 2d]
        keys, values = kv.chunk(2, -1)
        return {"keys": keys, "values": values, "mask": mask}

    def init_state(self, ctx: Context, rows: int) -> State:
        empty = ctx["keys"].new_zeros(rows, len(self.decoder), 0, self.config.d_model)
        return empty, empty  # no word yet: keys, values [N, layers, 0, d]

    def with_room(self, state: State, words: int) -> State:
        """The cache with a slot for each of ``words`` words: keys, values [N, layers, t +
        words, d] (the t words so far first) and which slots hold a word, [N, t + words] bool.
        A step then writes its word in the first free slot: the state keeps its shapes."""
        keys, values = state
        n, layers, t, d = keys.shape
        room = keys.new_zeros(n, layers, t + words, d), values.new_zeros(n, layers, t + words, d)
        room[0][:, :, :t], room[1][:, :, :t] = keys, values
        filled = torch.zeros(n, t + words, dtype=torch.bool, device=keys.device)
        filled[:, :t] = True
        return room[0], room[1], filled

    def embed(self, words: Tensor, start: int) -> Tensor:
        """Word ids [N, T] at positions start.. -> sqrt(d) W_e y + PE, [N, T, d]."""
        positions = torch.arange(start, start + words.shape[1], device=words.device)
        x = self.word_embed(words) * math.sqrt(self.config.d_model) + sinusoid(
            positions, self.config.d_model)
        return self.word_dropout(x)

    def decode(self, x: Tensor, ctx: Context, state: State | None,
               room: tuple[Tensor, Tensor] | None = None):
        """The decoder stack over words x [N, T, d] -> hidden [N, T, d], each layer's keys and
        values, the last layer's cross-attention [N, T, L] (``room``: a word's slot and the
        slots it sees in a cache with room, :meth:`with_room`)."""
        keys, values, alpha = [], [], None
        for i, layer in enumerate(self.decoder):
            past = None if state is None else (state[0][:, i], state[1][:, i])
            x, k, v, alpha = layer(x, past, (ctx["keys"][:, i], ctx["values"][:, i]), ctx["mask"],
                                   weights=i == len(self.decoder) - 1, room=room)
            keys.append(k)
            values.append(v)
        return self.decoder_norm(x), keys, values, alpha

    def forward(self, ctx: Context, captions: Tensor,
                feed: WordFeed | None = None) -> DecoderOutput:
        """Teacher forcing in one pass: every position attends to the words before it."""
        if feed is not None:  # scheduled sampling: a step's word follows the previous logits
            return super().forward(ctx, captions, feed)
        hidden, _, _, alphas = self.decode(self.embed(captions[:, :-1], 0), ctx, None)
        return DecoderOutput(ReadOut(hidden, self.out), alphas)  # [N, T, V], [N, T, L]

    def step(self, words: Tensor, state: State, ctx: Context):
        if len(state) == 3:
            return self.step_in_room(words, state, ctx)
        x = self.embed(words[:, None], state[0].shape[2])  # [N, 1, d] at position t
        hidden, keys, values, alpha = self.decode(x, ctx, state)
        state = torch.stack(keys, 1), torch.stack(values, 1)  # [N, layers, t + 1, d]
        return self.out(hidden[:, 0]), state, alpha[:, 0]

    def step_in_room(self, words: Tensor, state: State, ctx: Context):
        """A step on a cache with room (:meth:`with_room`): the word's position is the count of
        filled slots, its slot the first free one; no shape depends on it (nor a branch)."""
        filled = state[2]
        position = filled.sum(1)  # [N]
        slot = torch.arange(filled.shape[1], device=filled.device) == position[:, None]
        x = self.word_embed(words) * math.sqrt(self.config.d_model) + sinusoid(
            position, self.config.d_model)
        x = self.word_dropout(x[:, None])  # [N, 1, d]
        hidden, keys, values, alpha = self.decode(x, ctx, state, room=(slot, filled | slot))
        state = torch.stack(keys, 1), torch.stack(values, 1), filled | slot
        return self.out(hidden[:, 0]), state, alpha[:, 0]
