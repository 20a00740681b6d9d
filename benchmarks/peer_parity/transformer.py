"""capstack's ``transformer`` decoder against self-critical.pytorch's TransformerModel.

Both are built at the peer's default sizes (6 layers, 8 heads, d_model 512, d_ff 2048)
over 36 regions of 2,048 numbers (some images with fewer, padded) and a vocabulary of
9,487. capstack's side is ``norm_first: true, region_norm: false`` (the peer's
pre-norm stacks, and its ``att_embed``: Linear, ReLU, Dropout), and gets the peer's
weights, parameter for parameter. Both run in eval mode, in float64, on the same word
ids. Compared:

- teacher forcing: capstack's one causal pass against the peer's ``_forward``;
- word by word: capstack's ``step`` with its key/value cache against the peer's
  ``get_logprobs_state`` loop (which decodes the whole prefix again at each word);
- the greedy word at each position.

The peer's LayerNorm is the Annotated Transformer's, ``a (x - mean) / (std + 1e-6) + b`` with
the unbiased std, where capstack's default is ``torch.nn.LayerNorm``, ``a (x - mean) /
sqrt(var + 1e-5) + b``. The check runs three ways: capstack's default against the peer's own
LayerNorm (a stated difference, reported), against the peer with that one method given
torch's formula, and capstack's ``layer_norm: unbiased_std`` (what ``capstack
import-checkpoint rtl`` sets) against the peer's own; the last two must agree to 1e-9.
"""

from __future__ import annotations

import importlib
from argparse import Namespace
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.peer_parity import Difference, importable

from trainer.decoders import build_decoder
from trainer.decoders.transformer import TransformerConfig

VOCAB, REGIONS, DIM, WORDS, LAYERS = 9487, 36, 2048, 16, 6
VALID_REGIONS = (36, 20, 7, 36, 1, 12)  # per image: the rest is padding
BOUND = 1e-9  # float64


def peer_options(opts_module) -> Namespace:
    """The peer's own defaults (its option parser), set as its transformer configs set them."""
    opt = opts_module.parse_opt()
    for key, value in dict(caption_model="transformer", vocab_size=VOCAB - 1, num_layers=LAYERS,
                           input_encoding_size=512, rnn_size=2048, att_feat_size=DIM,
                           fc_feat_size=DIM, att_hid_size=512, drop_prob_lm=0.1, dropout=0.1,
                           seq_length=WORDS, max_length=WORDS, use_bn=0,
                           vocab={str(i): str(i) for i in range(1, VOCAB)}).items():
        setattr(opt, key, value)
    return opt


def copy_linear(ours: torch.nn.Linear, *theirs: torch.nn.Linear) -> None:
    """One linear layer from one or more of the peer's, stacked by output (K then V)."""
    ours.weight.copy_(torch.cat([t.weight for t in theirs]))
    ours.bias.copy_(torch.cat([t.bias for t in theirs]))


def copy_norm(ours: torch.nn.LayerNorm, theirs) -> None:
    ours.weight.copy_(theirs.a_2)
    ours.bias.copy_(theirs.b_2)


def copy_attention(ours, theirs) -> None:
    query, key, value, out = theirs.linears
    copy_linear(ours.query, query)
    copy_linear(ours.key_value, key, value)
    copy_linear(ours.out, out)


def copy_feed_forward(ours, theirs) -> None:
    copy_linear(ours[0], theirs.w_1)
    copy_linear(ours[3], theirs.w_2)


@torch.no_grad()
def load_peer_weights(ours, peer) -> None:
    """Every parameter of the peer's TransformerModel into capstack's decoder."""
    copy_linear(ours.feature_embed[0], peer.att_embed[0])
    model = peer.model
    for layer, theirs in zip(ours.encoder, model.encoder.layers):
        copy_attention(layer.attention, theirs.self_attn)
        copy_feed_forward(layer.ffn, theirs.feed_forward)
        for norm, sub in zip(layer.norms, theirs.sublayer):
            copy_norm(norm, sub.norm)
    copy_norm(ours.encoder_norm, model.encoder.norm)
    for layer, theirs in zip(ours.decoder, model.decoder.layers):
        copy_attention(layer.self_attention, theirs.self_attn)
        copy_attention(layer.cross_attention, theirs.src_attn)
        copy_feed_forward(layer.ffn, theirs.feed_forward)
        for norm, sub in zip(layer.norms, theirs.sublayer):
            copy_norm(norm, sub.norm)
    copy_norm(ours.decoder_norm, model.decoder.norm)
    ours.word_embed.weight.copy_(model.tgt_embed[0].lut.weight)
    copy_linear(ours.out, model.generator.proj)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in peer.parameters())


def inputs(seed: int = 0):
    """Features [B, L, D] with padded regions zeroed, their mask, and word ids [B, T]: 0 first
    (the peer's <bos>), then words 1..V-1 (the peer masks id 0 in its self-attention)."""
    g = torch.Generator().manual_seed(seed)
    feats = torch.rand(len(VALID_REGIONS), REGIONS, DIM, generator=g, dtype=torch.float64)
    mask = torch.arange(REGIONS)[None, :] < torch.tensor(VALID_REGIONS)[:, None]
    feats = feats * mask[..., None]
    words = torch.randint(1, VOCAB, (len(VALID_REGIONS), WORDS), generator=g)
    words[:, 0] = 0
    return feats, mask, words


def peer_log_probs(peer, feats, mask, words):
    """Teacher forced, and word by word through the peer's own decoding loop."""
    fc = feats.mean(1)
    forced = peer._forward(fc, feats, words, mask.long())
    p_fc, p_att, memory, masks = peer._prepare_feature(fc, feats, mask.long())
    state, steps = [], []
    for t in range(words.shape[1]):
        log_probs, state = peer.get_logprobs_state(words[:, t], p_fc, p_att, memory, masks, state)
        steps.append(log_probs)
    return forced, torch.stack(steps, 1)


def our_log_probs(model, feats, mask, words):
    ctx = model.encode(feats, mask)
    captions = torch.cat([words, words[:, :1]], 1)  # forward reads captions[:, :-1]
    forced = F.log_softmax(model(ctx, captions).logits, -1)
    # word by word as decoding steps it: the cache given a slot for every word first
    state = model.with_room(model.init_state(ctx, words.shape[0]), words.shape[1])
    steps = []
    for t in range(words.shape[1]):
        logits, state, _ = model.step(words[:, t], state, ctx)
        steps.append(F.log_softmax(logits, -1))
    return forced, torch.stack(steps, 1)


def compare(label: str, ours, theirs, bound: float | None, note: str = "") -> list[Difference]:
    (our_forced, our_steps), (peer_forced, peer_steps) = ours, theirs
    words_differ = (our_forced.argmax(-1) != peer_forced.argmax(-1)).float().mean().item()
    return [
        Difference("transformer", f"{label}: log p, teacher forced",
                   (our_forced - peer_forced).abs().max().item(), bound, note),
        Difference("transformer", f"{label}: log p, word by word (capstack's cache)",
                   (our_steps - peer_steps).abs().max().item(), bound, note),
        Difference("transformer", f"{label}: greedy words that differ (fraction)",
                   words_differ, 0.0 if bound is not None else None, note),
    ]


def check(peer_dir: Path, options) -> list[Difference]:
    with importable(peer_dir):
        peer_module = importlib.import_module("captioning.models.TransformerModel")
        opts = importlib.import_module("captioning.utils.opts")
        torch.manual_seed(0)
        peer = peer_module.TransformerModel(peer_options(opts)).double().eval()
    config = TransformerConfig(d_model=512, heads=8, layers=LAYERS, d_ff=2048, dropout=0.1,
                               norm_first=True, region_norm=False)
    ours = build_decoder("transformer", config, VOCAB, DIM).double().eval()
    load_peer_weights(ours, peer)
    feats, mask, words = inputs()
    with torch.no_grad():
        mine = our_log_probs(ours, feats, mask, words)
        rows = compare("the peer's own LayerNorm", mine, peer_log_probs(peer, feats, mask, words),
                       None, "unbiased std, eps outside the root: a stated difference")
        own = peer_module.LayerNorm.forward
        peer_module.LayerNorm.forward = lambda self, x: F.layer_norm(
            x, x.shape[-1:], self.a_2, self.b_2, 1e-5)
        try:
            rows += compare("torch's LayerNorm in the peer", mine,
                            peer_log_probs(peer, feats, mask, words), BOUND)
        finally:
            peer_module.LayerNorm.forward = own
        config.layer_norm = "unbiased_std"
        same = build_decoder("transformer", config, VOCAB, DIM).double().eval()
        load_peer_weights(same, peer)
        rows += compare("layer_norm: unbiased_std, the peer's own", our_log_probs(
            same, feats, mask, words), peer_log_probs(peer, feats, mask, words), BOUND)
    return rows
