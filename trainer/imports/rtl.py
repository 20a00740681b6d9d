"""self-critical.pytorch's checkpoints (ruotianluo): ``model.pth`` and ``infos_ID.pkl``.

Its ``tools/train.py`` saves the model's ``state_dict`` (read here with
``torch.load(weights_only=True)``) and an ``infos`` pickle holding its options (an
``argparse.Namespace``, ``opt``) and its vocabulary (``vocab``: index 1..V -> word), read with
capstack's restricted unpickler (pipeline/core/safe_pickle.py), which builds that Namespace
and plain data and nothing else. Two of its models are read, by ``opt.caption_model``:

- ``updown`` / ``topdown`` (captioning/models/AttModel.py ``UpDownModel``, ``UpDownCore``) ->
  capstack's ``top_down`` with ``feature_embed`` and ``mean_embed`` at its ``rnn_size``,
  ``word_activation: relu``, ``embed_dropout: true`` and its ``drop_prob_lm`` as the dropout
  (trainer/decoders/top_down.py). Its attention's two biases (``ctx2att``'s and ``h2att``'s)
  become one, and ``alpha_net``'s bias, which the softmax ignores, is dropped.
- ``transformer`` (captioning/models/TransformerModel.py) -> capstack's ``transformer`` with
  ``norm_first: true, region_norm: false, layer_norm: unbiased_std``: its pre-norm stacks, its
  ``att_embed`` and its LayerNorm, (x - mean) / (std + 1e-6), exactly. Its K and V projections
  become one layer.

Its region features' mean is its ``fc_feats`` (what its loader uses for bottom-up features,
which have no fc file: ``att_feat.mean(0)``); capstack takes the mean of the valid regions.

The vocabulary. Its index 0 is ``<bos>`` when fed and ``<eos>`` when predicted; words are
1..V, and ``UNK`` (when its threshold dropped words) is one of them. The captions folder given
must hold the same words (``capstack prepare --vocab-rule rtl`` on the Karpathy json its
``prepro_labels.py`` read gives them in its order; any order is taken): the word embedding and
the logit rows are permuted into capstack's ids, ``<bos>``'s and ``<eos>``'s from row 0,
``<unk>``'s from ``UNK``'s. ``<pad>`` and ``<bos>`` (and ``<unk>`` where it has no ``UNK``),
which it never predicts, get a logit of weight 0 and bias -10,000: a probability that is 0 in
float32, so every other word's log-probability is its own.

Refused, by name: any other ``caption_model``, and options that change what the weights mean
that capstack's decoders do not have (``use_bn``, ``logit_layers`` > 1, ``norm_att_feat``,
``use_box``, a ``cached_transformer``, encoder and decoder of different depths).
"""

from __future__ import annotations

import argparse
import numbers
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from pipeline.captions.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Vocabulary
from pipeline.core import safe_pickle
from pipeline.core.errors import CapstackError, shown
from pipeline.core.regular import read_bytes
from pipeline.core.state_dicts import listed, require_finite, tensors_only
from pipeline.core.torch_files import load_tensors
from trainer.bounds import MAX_CAPTION_WORDS, MAX_STEPS
from trainer.decoders.top_down import TopDownConfig
from trainer.decoders.transformer import TransformerConfig, sinusoid
from trainer.imports import CHECKPOINT_FORMATS, CheckpointFormat, Converted
from trainer.objectives import OBJECTIVES, table_labels

UPDOWN = ("updown", "topdown")
MODELS = (*UPDOWN, "transformer")
NEVER = -1e4  # the logit bias of a token the peer never predicts: exp underflows to 0
PEER_UNK = "UNK"
# options whose values other than these change what the weights compute, and capstack has not
UNSUPPORTED = {"use_bn": 0, "logit_layers": 1, "norm_att_feat": 0, "use_box": 0,
               "cached_transformer": False}
MAX_WHOLE = MAX_STEPS  # its epochs, iterations and lengths, far below


@CHECKPOINT_FORMATS.register("rtl")
class SelfCritical(CheckpointFormat):
    """self-critical.pytorch's model.pth and infos_ID.pkl (its updown/topdown and
    transformer models)."""

    sources = ("MODEL.pth", "INFOS.pkl")

    def read(self, paths: list[Path]) -> Converted:
        model_path, infos_path = paths
        infos = read_infos(infos_path)
        settings = read_settings(infos, infos_path)
        state = read_state(model_path)
        words = peer_words(infos["vocab"], infos_path)
        reader = _updown if settings.caption_model in UPDOWN else _transformer
        converted = reader(state, settings, words, f"{model_path}")
        converted.about.update({"caption_model": settings.caption_model,
                                "peer_vocab": len(words), "epoch": settings.epoch,
                                "iter": settings.iter})
        converted.table = table_labels(OBJECTIVES.get("scst" if settings.self_critical
                                                      else "xe"))
        converted.max_len = settings.max_len
        return converted


def read_infos(path: Path) -> dict:
    """The infos pickle, through the restricted unpickler: a dict with ``opt`` (a Namespace)
    and ``vocab``."""
    infos = safe_pickle.loads(read_bytes(path, "an infos pickle"), str(path), namespaces=True)
    if not isinstance(infos, dict):
        raise CapstackError(f"{path}: holds a {type(infos).__name__}, not self-critical."
                            f"pytorch's infos dict")
    for key, kind in (("opt", argparse.Namespace), ("vocab", dict)):
        if not isinstance(infos.get(key), kind):
            raise CapstackError(f"{path}: no {key!r} {kind.__name__} (not self-critical."
                                f"pytorch's infos pickle: its tools/train.py writes "
                                f"infos_ID.pkl)")
    return infos


@dataclass(frozen=True)
class Settings:
    """What capstack reads of the infos pickle, each value checked where it is read: the
    rest of the pickle (its loader's state, its histories) is neither read nor recorded."""

    caption_model: str
    dropout: float | None  # opt.dropout (the transformer's), None when absent
    drop_prob_lm: float | None  # UpDown's dropout, the transformer's att_embed's
    num_att_heads: int
    max_len: int  # opt.max_length, else opt.seq_length, else 16: at most MAX_CAPTION_WORDS
    epoch: int | None  # where its training was, recorded in imported.json
    iter: int | None
    self_critical: bool  # its epoch reached self_critical_after (or structure_after)


def read_settings(infos: dict, path: Path) -> Settings:
    """The infos' settings capstack uses, refused naming the file and the field when one is
    not what self-critical.pytorch writes (``opt.max_length is 'abc'``, a NaN dropout, a
    200,000-digit epoch), or names a model or an option capstack has no counterpart for."""
    opt = vars(infos["opt"])
    name = opt.get("caption_model")
    if not isinstance(name, str) or name not in MODELS:
        raise CapstackError(f"{path}: opt.caption_model is {shown(name)}: capstack imports "
                            f"self-critical.pytorch's {', '.join(MODELS)} models only")
    for option, plain in UNSUPPORTED.items():
        value = opt.get(option)
        if not (value is None or (isinstance(value, numbers.Number) and value == plain)):
            raise CapstackError(f"{path}: opt.{option} is {shown(value)}: capstack's decoders "
                                f"have no counterpart (imported: {option} {plain!r} only)")
    length = [whole(opt.get(k), f"opt.{k}", path, 0, MAX_WHOLE)
              for k in ("max_length", "seq_length")]
    epoch = whole(infos.get("epoch"), "epoch", path, 0, MAX_WHOLE)
    starts = [whole(opt.get(k), f"opt.{k}", path, -MAX_WHOLE, MAX_WHOLE)
              for k in ("self_critical_after", "structure_after")]
    return Settings(
        caption_model=name, dropout=probability(opt.get("dropout"), "opt.dropout", path),
        drop_prob_lm=probability(opt.get("drop_prob_lm"), "opt.drop_prob_lm", path),
        num_att_heads=whole(opt.get("num_att_heads"), "opt.num_att_heads", path, 1,
                            MAX_WHOLE) or 8,
        max_len=min(next((n for n in length if n), 16), MAX_CAPTION_WORDS),
        epoch=epoch, iter=whole(infos.get("iter"), "iter", path, 0, MAX_WHOLE),
        self_critical=any(s is not None and 0 <= s <= (epoch or 0) for s in starts))


def whole(value, field: str, path: Path, low: int, high: int) -> int | None:
    """``value`` as an int from ``low`` to ``high``, None when absent; anything else refused
    naming ``field`` (``int()`` of 'abc', NaN or inf raises, and one of a 200,000-digit int
    costs seconds)."""
    if value is None:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) \
            and low <= int(value) <= high:
        return int(value)
    raise CapstackError(f"{path}: {field} is {shown(value)}: expected a whole number from "
                        f"{low:,} to {high:,}")


def probability(value, field: str, path: Path) -> float | None:
    """A dropout rate: a finite number from 0 to below 1, None when absent."""
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        with suppress(OverflowError):  # float() of a 400-digit int
            rate = float(value)
            if 0 <= rate < 1:
                return rate
    raise CapstackError(f"{path}: {field} is {shown(value)}: expected a dropout rate, a "
                        f"number from 0 to below 1")


def read_state(path: Path) -> dict[str, Tensor]:
    state = tensors_only(load_tensors(path, "state_dict"), path)
    require_finite(state, path)
    return state


def peer_words(vocab: dict, path: Path) -> list[str]:
    """Its words in index order, 1..V (as strings of digits, keys of its vocab)."""
    count = len(vocab)
    indices = {str(i) for i in range(1, count + 1)}
    odd = [shown(k) for k in vocab if not (isinstance(k, str) and k in indices)]
    if odd:
        raise CapstackError(f"{path}: vocab: keys must be the indices 1..{count} as strings, "
                            f"got {listed(sorted(odd))}")
    words = [vocab[str(i)] for i in range(1, count + 1)]
    if not all(isinstance(w, str) and w for w in words):
        raise CapstackError(f"{path}: vocab: every word must be a non-empty string")
    return words


def vocabulary_rows(vocab: Vocabulary, words: list[str], source: str
                    ) -> tuple[list[int], list[int]]:
    """For each capstack id, the peer's row of its embedding, and of its logit (-1: never
    predicted). Refused unless both vocabularies hold the same words."""
    index = {w: i for i, w in enumerate(words, start=1)}
    own = vocab.itow[UNK_ID + 1:]
    missing = [w for w in words if w != PEER_UNK and w not in vocab.wtoi]
    extra = [w for w in own if w not in index]
    if missing or extra:
        raise CapstackError(
            f"{source}: the checkpoint's {len(words)} words are not the captions' "
            f"{len(own)} (+ <unk>): " + "; ".join(
                part for part in (f"not in the captions: {listed(missing)}" if missing else "",
                                  f"not the checkpoint's: {listed(extra)}" if extra else "")
                if part) + " (prepare its Karpathy json with `capstack prepare --vocab-rule rtl` "
            "and its word_count_threshold as --min-count)")
    unk = index.get(PEER_UNK, -1)
    embed = [0] * len(vocab)  # <pad>, <bos>, <eos>: row 0, its <bos>
    logit = [-1] * len(vocab)
    logit[EOS_ID] = 0
    embed[UNK_ID], logit[UNK_ID] = max(unk, 0), unk
    for i, w in enumerate(own, start=UNK_ID + 1):
        embed[i] = logit[i] = index[w]
    assert embed[BOS_ID] == 0 and logit[PAD_ID] == logit[BOS_ID] == -1
    return embed, logit


def permuted(embedding: Tensor, weight: Tensor, bias: Tensor, vocab: Vocabulary,
             words: list[str], source: str) -> dict[str, Tensor]:
    """The word embedding and the logit layer's rows in capstack's ids."""
    embed, logit = vocabulary_rows(vocab, words, source)
    never = torch.tensor([i < 0 for i in logit])
    rows = torch.tensor([max(i, 0) for i in logit])
    return {"embedding": embedding[torch.tensor(embed)].clone(),
            "weight": weight[rows].masked_fill(never[:, None], 0.0),
            "bias": bias[rows].masked_fill(never, NEVER)}


# dimensions of each of its tensors, by the last part of its name: a weight matrix otherwise
RANKS = {"bias": 1, "bias_ih": 1, "bias_hh": 1, "a_2": 1, "b_2": 1, "pe": 3}


class Weights:
    """The peer's state_dict, each key taken once, of the rank its name says (a 1-D
    ``embed.0.weight`` would fail far from the file); what is left over is refused."""

    def __init__(self, state: dict[str, Tensor], source: str):
        self.state, self.source = state, source
        self.taken: set[str] = set()

    def __call__(self, key: str) -> Tensor:
        if key not in self.state:
            raise CapstackError(f"{self.source}: no {key} (not a model.pth of this "
                                f"caption_model, or edited)")
        tensor, rank = self.state[key], RANKS.get(key.rsplit(".", 1)[-1], 2)
        if tensor.dim() != rank or 0 in tensor.shape:
            raise CapstackError(f"{self.source}: {key} is of shape {list(tensor.shape)}: "
                                f"expected {rank} dimension{'s' if rank > 1 else ''}, none "
                                f"empty (edited?)")
        self.taken.add(key)
        return tensor

    def size(self, key: str, dim: int) -> int:
        return int(self(key).shape[dim])

    def all_taken(self, ignored: tuple[str, ...] = ()) -> None:
        left = [k for k in self.state if k not in self.taken and k not in ignored]
        if left:
            raise CapstackError(f"{self.source}: weights capstack's decoder has no place for: "
                                f"{listed(left)} (options this import does not know?)")


def _vocab_size(w: Weights, words: list[str], *keys: str) -> None:
    """Each of ``keys`` (its embedding, its logit layer's weight and bias) has a row per
    word and one for row 0."""
    for key in keys:
        rows = w.size(key, 0)
        if rows != len(words) + 1:
            raise CapstackError(f"{w.source}: {key} has {rows} rows, its infos' vocab "
                                f"{len(words)} words + 1 (another checkpoint's infos?)")


def _alike(w: Weights, *keys: str) -> list[Tensor]:
    """The tensors of ``keys``, refused unless they are of one shape: biases summed into one,
    K's and V's projections stacked as one layer."""
    tensors = [w(key) for key in keys]
    if len({t.shape for t in tensors}) > 1:
        raise CapstackError(f"{w.source}: " + ", ".join(
            f"{key} {list(t.shape)}" for key, t in zip(keys, tensors)) + " do not fit together "
            "(edited?)")
    return tensors


def _updown(state: dict[str, Tensor], settings: Settings, words: list[str],
            source: str) -> Converted:
    w = Weights(state, source)
    _vocab_size(w, words, "embed.0.weight", "logit.weight", "logit.bias")
    e, h = w.size("embed.0.weight", 1), w.size("logit.weight", 1)
    att_hidden, dim = w.size("ctx2att.weight", 0), w.size("att_embed.0.weight", 1)
    if w.size("fc_embed.0.weight", 1) != dim:
        raise CapstackError(f"{source}: fc_embed reads {w.size('fc_embed.0.weight', 1)} numbers "
                            f"and att_embed {dim}: capstack's mean feature is the regions' mean, "
                            f"of their size")
    dropout = 0.5 if settings.drop_prob_lm is None else settings.drop_prob_lm
    config = TopDownConfig(embed=e, hidden=h, att_hidden=att_hidden, dropout=dropout,
                           feature_embed=h, mean_embed=h, word_activation="relu",
                           embed_dropout=True)
    feature_bias, query_bias = _alike(w, "ctx2att.bias", "core.attention.h2att.bias")
    fixed = {
        "feature_embed.0.weight": w("att_embed.0.weight"),
        "feature_embed.0.bias": w("att_embed.0.bias"),
        "mean_embed.0.weight": w("fc_embed.0.weight"), "mean_embed.0.bias": w("fc_embed.0.bias"),
        "attention.feature_proj.weight": w("ctx2att.weight"),
        # W_va v + b_va + W_ha h + b_ha: one bias
        "attention.feature_proj.bias": feature_bias + query_bias,
        "attention.query_proj.weight": w("core.attention.h2att.weight"),
        "attention.score.weight": w("core.attention.alpha_net.weight"),
        **{f"{ours}.{p}": w(f"core.{theirs}.{p}")
           for ours, theirs in (("attention_lstm", "att_lstm"), ("language_lstm", "lang_lstm"))
           for p in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")},
    }
    w("core.attention.alpha_net.bias")  # a constant added to every score: the softmax drops it
    embedding, logit_w, logit_b = w("embed.0.weight"), w("logit.weight"), w("logit.bias")
    w.all_taken()

    def weights(vocab: Vocabulary) -> dict[str, Tensor]:
        rows = permuted(embedding, logit_w, logit_b, vocab, words, source)
        return {**fixed, "word_embed.weight": rows["embedding"], "out.weight": rows["weight"],
                "out.bias": rows["bias"]}

    return Converted("top_down", config, dim, weights, 0, {}, {"decoder": "top_down"})


def _transformer(state: dict[str, Tensor], settings: Settings, words: list[str],
                 source: str) -> Converted:
    w = Weights(state, source)
    _vocab_size(w, words, "model.tgt_embed.0.lut.weight", "model.generator.proj.weight",
                "model.generator.proj.bias")
    layers = {side: len({k.split(".")[3] for k in state
                         if k.startswith(f"model.{side}.layers.")}) for side in ("encoder",
                                                                                  "decoder")}
    if layers["encoder"] != layers["decoder"]:
        raise CapstackError(f"{source}: {layers['encoder']} encoder and {layers['decoder']} "
                            f"decoder layers: capstack's transformer has as many of each")
    d = w.size("model.generator.proj.weight", 1)
    heads = settings.num_att_heads
    if d % heads:
        raise CapstackError(f"{source}: opt.num_att_heads {heads} does not divide d_model {d}")
    d_ff = w.size("model.encoder.layers.0.feed_forward.w_1.weight", 0)
    dropout = 0.1 if settings.dropout is None else settings.dropout
    config = TransformerConfig(d_model=d, heads=heads, layers=layers["encoder"], d_ff=d_ff,
                               dropout=dropout, norm_first=True, region_norm=False,
                               layer_norm="unbiased_std")
    notes = []
    embed_dropout = dropout if settings.drop_prob_lm is None else settings.drop_prob_lm
    if embed_dropout != dropout:
        notes.append(f"its att_embed dropout {embed_dropout} is {dropout} here (capstack's "
                     f"transformer has one dropout rate; it acts in training only)")

    def linear(ours: str, *theirs: str) -> dict[str, Tensor]:
        return {f"{ours}.{p}": torch.cat(_alike(w, *(f"{t}.{p}" for t in theirs)))
                for p in ("weight", "bias")}

    def norm(ours: str, theirs: str) -> dict[str, Tensor]:
        return {f"{ours}.weight": w(f"{theirs}.a_2"), f"{ours}.bias": w(f"{theirs}.b_2")}

    def attention(ours: str, theirs: str) -> dict[str, Tensor]:
        return {**linear(f"{ours}.query", f"{theirs}.linears.0"),
                **linear(f"{ours}.key_value", f"{theirs}.linears.1", f"{theirs}.linears.2"),
                **linear(f"{ours}.out", f"{theirs}.linears.3")}

    fixed = {**linear("feature_embed.0", "att_embed.0"),
             **norm("encoder_norm", "model.encoder.norm"),
             **norm("decoder_norm", "model.decoder.norm")}
    for i in range(config.layers):
        enc, dec = f"model.encoder.layers.{i}", f"model.decoder.layers.{i}"
        fixed.update({**attention(f"encoder.{i}.attention", f"{enc}.self_attn"),
                      **attention(f"decoder.{i}.self_attention", f"{dec}.self_attn"),
                      **attention(f"decoder.{i}.cross_attention", f"{dec}.src_attn")})
        for side, theirs, norms in (("encoder", enc, 2), ("decoder", dec, 3)):
            fixed.update({**linear(f"{side}.{i}.ffn.0", f"{theirs}.feed_forward.w_1"),
                          **linear(f"{side}.{i}.ffn.3", f"{theirs}.feed_forward.w_2")})
            for j in range(norms):
                fixed.update(norm(f"{side}.{i}.norms.{j}", f"{theirs}.sublayer.{j}.norm"))
    pe = "model.tgt_embed.1.pe"  # its positional encoding, a buffer: capstack's must be it
    if pe in state:
        table = w(pe)[0, :256]  # captions' positions (float32 sines drift further out)
        own = sinusoid(torch.arange(table.shape[0]), d)
        if table.shape[1] != d or not torch.allclose(table.float(), own, atol=1e-4):
            raise CapstackError(f"{source}: {pe} is not the sinusoid capstack's transformer adds")
    embedding = w("model.tgt_embed.0.lut.weight")
    logit_w, logit_b = w("model.generator.proj.weight"), w("model.generator.proj.bias")
    w.all_taken()
    dim = w.size("att_embed.0.weight", 1)

    def weights(vocab: Vocabulary) -> dict[str, Tensor]:
        rows = permuted(embedding, logit_w, logit_b, vocab, words, source)
        return {**fixed, "word_embed.weight": rows["embedding"], "out.weight": rows["weight"],
                "out.bias": rows["bias"]}

    return Converted("transformer", config, dim, weights, 0, {}, {"decoder": "transformer"},
                     notes)

