"""``capstack import-checkpoint rtl`` on checkpoints self-critical.pytorch's own code wrote.

For each of its UpDown (``caption_model: updown``) and Transformer models: the peer's own
``models.setup`` builds it at random weights, ``torch.save(model.state_dict())`` and its
``utils.pickle_dump`` write ``model.pth`` and ``infos_ID.pkl`` as its ``save_checkpoint`` does
(its options a Namespace, its vocabulary 1..V, ``UNK`` last), and ``capstack import-checkpoint
rtl`` (the command, in this process) makes a run of them on a captions folder that ``capstack
prepare --vocab-rule rtl`` wrote (the same words; the peer's order shuffled, which the import
undoes) and a region store of 60 images (up to 36 regions of 2,048 numbers, some images with
fewer). The run is then loaded as ``capstack evaluate`` loads it, and both decode the same
features (read from that store; the peer's ``fc_feats`` their mean, as its loader makes them
for bottom-up features), in float64, eval mode:

- teacher forcing: the peer's ``_forward`` against capstack's one pass, every word's
  log-probability (capstack's ids mapped to the peer's), to 1e-7 (the import rounds the sum
  of UpDown's two attention biases to float32 once: 8e-9 here);
- greedy, beam 5, beam 5 with ``length_penalty wu_0.2``, diverse beam search (4 beams in 2
  groups, lambda 0.5: the caption ranked first), beam 5 with ``remove_bad_endings``:
  each image's caption equal, and its log-probability to 1e-5 (capstack's searches score in
  float32), the peer's ``_sample`` (its
  ``beam_search``) against ``trainer/decoding_options.decode``;
- stated differences: ``block_trigrams`` (greedy, the only search where the peer applies it),
  the peer lowering a repeat's probability to a quarter where capstack forbids it; and all 4
  captions of the diverse search, the peer's ended hypotheses freeing their beams to search
  on where capstack's keep theirs;
- top-k (k = 3) and top-p (p = 0.8) sampling: a draw spends one random number per vocabulary
  entry (torch.multinomial's exponential race) in each's own vocabulary order and size, so one
  seed gives other words; compared instead is what each draws from, step by step along the
  peer's own samples: the support (entries that differ) and the probabilities (to 1e-5), the
  peer's recorded from the Categorical its ``sample_next_word`` builds.

Random weights give near-uniform words whose near-ties decide nothing, and captions that all
run to the length cut (where the two are known to differ: capstack scores a cut caption with
its P(<eos>), the peer without); so the peer's logit layer is scaled by ``LOGIT_SCALE`` and
its ``<eos>`` bias raised by ``EOS_BIAS`` before saving: peaked distributions, captions that
end by themselves. Rows whose captions reach the cut anyway are counted in the note.

Ensembles: the peer's ``captioning/models/AttEnsemble.py`` (its next-word distribution the
weighted mean of its members' probabilities, equal weights here; built as its
``tools/eval_ensemble.py`` builds it, ``AttEnsemble(models)`` and ``seq_length`` set, and called
as one model) against capstack's :class:`~trainer.ensemble.Ensemble` of the imported runs, as
``capstack evaluate RUN1 RUN2 --ensemble`` loads them, on the same 60 images: two Transformers
(seeds 0 and 1: two random initialisations, each saved and imported as above, their ``<eos>``
bias 20, not 16: at 16 the two disagree at almost every step, their averaged peaked
distributions near 50/50 ties, and most captions run to the length cut, where the beam searches
are known to differ: capstack's ended hypotheses keep their beams, out of which better open ones
can push them, and it scores a cut caption with its P(<eos>); 4 of 60 beam-5 captions differed
so, greedy none), and the UpDown beside the Transformer (AttEnsemble packs its members' states
side by side, so its members' types may differ). Compared: the teacher-forced
log-probabilities (its ``_forward``, AttModel's step by step through its
``get_logprobs_state``), each difference over max(1, |log p|) to 1e-6 (capstack's ensemble
averages its members' softmax in float32, whose error grows with the size of log p, and words
forced at random on peaked models are very improbable), and greedy and beam 5, every caption
equal and its log-probability to 1e-5.
AttEnsemble's ``__init__`` runs CaptionModel's, not AttModel's, so it lacks the ``bos_idx``,
``eos_idx``, ``pad_idx`` and ``unk_idx`` that the AttModel ``_sample`` and CaptionModel
``beam_search`` it inherits read (``'AttEnsemble' object has no attribute 'pad_idx'`` before
its first step; its ``_forward`` reads none): it is given its first member's (0, 0, 0 and
None), what AttModel's ``__init__`` would have set.
"""

from __future__ import annotations

import importlib
import json
import random
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.peer_parity import Difference, importable

from pipeline.captions.prepare import prepare_captions
from pipeline.captions.prepared import load_captions
from pipeline.captions.vocab import EOS_ID, UNK_ID
from pipeline.features.stores import Record, Schema, create_writer, field
from trainer.checkpoint import load_checkpoint
from trainer.data import Features
from trainer.decoding_options import BAD_ENDINGS, DecodingConfig, decode, filtered
from trainer.evaluation.ensembles import load_ensemble
from trainer.evaluation.evaluate import load_model

IMAGES, REGIONS, DIM, WORDS, MAX_LEN = 60, 36, 2048, 1000, 16
LOGIT_SCALE = 8.0
EOS_BIAS = {"updown": 6.0, "transformer": 16.0}  # its logits after LayerNorm run larger
FORCED = 1e-7  # float64; the import rounds UpDown's folded attention bias to float32 once
ENSEMBLE_FORCED = 1e-6  # relative: capstack's ensemble averages its members' softmax in float32
# members (caption_model, seed, <eos> bias); two Transformers of other seeds disagree at almost
# every step (their peaked distributions averaged: near 50/50 ties) and run on to the length
# cut, unless their <eos> is raised further
ENSEMBLES = {"ens 2 transformers": (("transformer", 0, 20.0), ("transformer", 1, 20.0)),
             "ens updown+transformer": (("updown", 0, EOS_BIAS["updown"]),
                                        ("transformer", 0, EOS_BIAS["transformer"]))}
BOUND = 1e-5  # capstack's searches score in float32
SIZES: dict[str, dict[str, Any]] = {
    "updown": dict(input_encoding_size=512, rnn_size=512, att_hid_size=512),
    "transformer": dict(input_encoding_size=512, rnn_size=2048, num_layers=3, num_att_heads=8,
                        dropout=0.1)}


# ----------------------------------------------------------------------- the data


def karpathy_json(path: Path, seed: int = 0) -> Path:
    """Every word of the vocabulary (the bad endings among them) in the train split's captions;
    the test split is the compared images."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(WORDS - len(BAD_ENDINGS))] + list(BAD_ENDINGS)
    rng.shuffle(words)
    images, sentid = [], 0
    chunks = [words[i:i + 8] for i in range(0, len(words), 8)]
    for i in range(len(chunks) + IMAGES):
        tokens = chunks[i] if i < len(chunks) else rng.sample(words, 8)
        images.append({"filepath": "x", "filename": f"{i}.jpg", "imgid": i, "cocoid": i,
                       "split": "train" if i < len(chunks) else "test", "sentids": [sentid],
                       "sentences": [{"tokens": tokens, "raw": " ".join(tokens), "imgid": i,
                                      "sentid": sentid}]})
        sentid += 1
    path.write_text(json.dumps({"dataset": "drawn", "images": images}))
    return path


def region_store(path: Path, image_ids, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    fields = (field("features", (DIM,), "float16"), field("boxes", (4,), "float32"),
              field("scores", (), "float32"), field("classes", (), "int32"))
    meta = {**Schema(fields, None).to_meta(), "fingerprint": "a11dd0", "capstack_version": "-",
            "producer": {"name": "parity-drawn", "settings": {}, "about": {}}}
    with create_writer(path, meta) as writer:
        records = []
        for k, i in enumerate(image_ids):
            n = REGIONS if k % 3 else int(rng.integers(10, REGIONS))
            x = rng.uniform(0, 30, (n, 2)).astype(np.float32)
            records.append((int(i), Record(rng.random((n, DIM), np.float32) * 2, 64, 64,
                                           boxes=np.concatenate([x, x + 20], 1),
                                           scores=np.ones(n, np.float32),
                                           classes=np.zeros(n, np.int32))))
        writer.write(records)
        writer.finish()
    return path


# ----------------------------------------------------------------------- the peer's side


def peer_model(peer, name: str, words: list[str], seed: int = 0,
               eos_bias: float | None = None):
    """The peer's own model at random weights (drawn after ``torch.manual_seed(seed)``; its
    ``<eos>`` bias raised by ``eos_bias``, EOS_BIAS's by default), its options as its train.py
    sets them."""
    opt = peer.opts.parse_opt()
    for key, value in dict(caption_model=name, vocab_size=len(words), att_feat_size=DIM,
                           fc_feat_size=DIM, drop_prob_lm=0.5, seq_length=MAX_LEN,
                           max_length=MAX_LEN, use_bn=0, **SIZES[name]).items():
        setattr(opt, key, value)
    opt.vocab = {str(i): w for i, w in enumerate(words, start=1)}
    torch.manual_seed(seed)
    model = peer.models.setup(opt)
    del opt.vocab  # as its train.py does: the vocabulary is kept in the infos
    logit = model.logit if name != "transformer" else model.model.generator.proj
    with torch.no_grad():
        logit.weight.mul_(LOGIT_SCALE)
        logit.bias[0] += EOS_BIAS[name] if eos_bias is None else eos_bias
    return model.eval(), opt


def peer_ensemble(peer, models):
    """The peer's AttEnsemble of its models, as its tools/eval_ensemble.py builds it (equal
    weights, ``seq_length`` set), given the indices it reads and lacks (the module docstring)."""
    ensemble = peer.ensemble.AttEnsemble(models)
    ensemble.seq_length = MAX_LEN
    for name in ("bos_idx", "eos_idx", "pad_idx", "unk_idx"):
        if not hasattr(ensemble, name):
            setattr(ensemble, name, getattr(models[0], name))
    return ensemble.double().eval()


def save_peer(peer, model, opt, words: list[str], folder: Path) -> tuple[Path, Path]:
    folder.mkdir()
    torch.save(model.state_dict(), folder / "model.pth")
    infos = {"iter": 1000, "epoch": 5, "loader_state_dict": None, "best_val_score": 1.0,
             "vocab": {str(i): w for i, w in enumerate(words, start=1)}, "opt": opt}
    with open(folder / f"infos_{opt.id}.pkl", "wb") as f:
        peer.utils.pickle_dump(infos, f)
    return folder / "model.pth", folder / f"infos_{opt.id}.pkl"


@contextmanager
def recorded_categoricals(log: list):
    """The peer's sampling draws from torch.distributions.Categorical: its logits kept."""
    original = torch.distributions.Categorical

    class Recording(torch.distributions.Categorical):
        def __init__(self, *args, logits=None, **kwargs):
            log.append(logits.detach().clone())
            super().__init__(*args, logits=logits, **kwargs)

    torch.distributions.Categorical = Recording  # type: ignore[misc]
    try:
        yield
    finally:
        torch.distributions.Categorical = original  # type: ignore[misc]


def peer_decode(model, fc, att, mask, options: dict):
    """The peer's captions (token lists, 0 ended) and each one's log-probability, as its
    eval_utils asks: ``model(fc, att, masks, opt=..., mode='sample')``."""
    opt = {"sample_n": 1, "beam_size": 1, "sample_method": "greedy", **options}
    with torch.no_grad():
        seq, logps = model(fc, att, mask, opt=opt, mode="sample")
    return seq, logps


def caption_of(tokens) -> tuple[list[int], int]:
    """A peer caption's word indices and its token count (the words, and 0 when it ended)."""
    out: list[int] = []
    for t in tokens.tolist():
        if t == 0:
            return out, len(out) + 1
        out.append(t)
    return out, len(out)


def gathered(tokens, logps, count: int) -> float:
    return float(logps[torch.arange(count), tokens[:count]].sum())


# ----------------------------------------------------------------------- the comparisons


class Side:
    """The imported run (or runs: their ensemble, as ``capstack evaluate --ensemble`` loads
    them), its vocabulary mapped to the peer's indices, and the inputs."""

    def __init__(self, run: Path | list[Path], words: list[str], features: Features,
                 image_ids):
        if isinstance(run, list):
            loaded = load_ensemble(run)
            self.model, self.vocab = loaded.model, loaded.vocab
        else:
            self.model, self.vocab, _ = load_model(load_checkpoint(run))
        self.model.double()
        index = {w: i for i, w in enumerate(words, start=1)}
        # capstack id -> the peer's logit row (-1: a token the peer never predicts)
        self.peer_of = torch.tensor([0 if i == EOS_ID else index.get("UNK", -1) if i == UNK_ID
                                     else index.get(w, -1) for i, w in
                                     enumerate(self.vocab.itow)])
        self.ours_of = {int(p): i for i, p in enumerate(self.peer_of.tolist()) if p >= 0}
        feats, mask, _ = features.read(list(image_ids))
        self.feats, self.mask = feats.double(), mask
        self.fc = (self.feats * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        self.peer_mask = mask.double()
        with torch.no_grad():
            self.ctx = self.model.encode(self.feats, self.mask)

    def words_of(self, peer_tokens: list[int]) -> list[int]:
        return [self.ours_of[t] for t in peer_tokens]

    def decode(self, **options):
        with torch.no_grad():
            return decode(self.model, self.ctx, DecodingConfig(max_len=MAX_LEN, **options),
                          self.vocab)


def teacher_forcing(side: Side, peer, label: str, bound: float = FORCED, note: str = "",
                    relative: bool = False) -> Difference:
    """Every word's log-probability, the largest difference (``relative``: each difference
    over max(1, |the peer's log p|), float32's error growing with the size of log p)."""
    g = torch.Generator().manual_seed(1)
    peer_words = torch.randint(1, len(side.ours_of), (IMAGES, MAX_LEN), generator=g)
    seq = torch.cat([torch.zeros(IMAGES, 1, dtype=torch.long), peer_words], 1)
    ours = torch.tensor([[side.ours_of[int(t)] for t in row] for row in peer_words])
    captions = torch.cat([torch.full((IMAGES, 1), 1), ours, torch.full((IMAGES, 1), EOS_ID)], 1)
    with torch.no_grad():
        theirs = peer._forward(side.fc, side.feats, seq, side.peer_mask)[:, :MAX_LEN + 1]
        mine = torch.log_softmax(side.model(side.ctx, captions).logits, -1)
    kept = side.peer_of >= 0
    reference = theirs[..., side.peer_of[kept]]
    error = (mine[..., kept] - reference).abs()
    diff = (error / reference.abs().clamp(min=1) if relative else error).max().item()
    never = mine[..., ~kept].exp().max().item()
    what = (f"log p, teacher forced, relative ({IMAGES} x {MAX_LEN + 1} words)" if relative
            else f"log p, teacher forced ({IMAGES} images x {MAX_LEN + 1} words)")
    return Difference("checkpoints", f"{label}: {what}", diff, bound,
                      "; ".join(filter(None, [note, f"capstack's tokens the peer never "
                                                    f"predicts: p <= {never:.0e}"])))


def caption_rows(label: str, what: str, side: Side, peer_caps, ours, cut: int,
                 bound: float | None = 0.0, note: str = "") -> list[Difference]:
    """Rows of captions that differ and of their log-probabilities where equal."""
    differ, score = 0, 0.0
    for (words, count, peer_score), (tokens, logp) in zip(peer_caps, ours):
        mine = [int(t) for t in tokens if int(t) != 0]
        mine = mine[:mine.index(EOS_ID)] if EOS_ID in mine else mine
        if mine != side.words_of(words):
            differ += 1
            continue
        score = max(score, abs(float(logp[:count].sum()) - peer_score))
    notes = [f"{cut} reach the length cut"] if cut else []
    return [Difference("checkpoints", f"{label}: {what}: captions that differ (of "
                       f"{len(peer_caps)})", differ, bound, "; ".join([note, *notes]).strip("; ")),
            Difference("checkpoints", f"{label}: {what}: caption log p, where equal", score,
                       BOUND if bound is not None else None)]


def peer_captions(seq, logps) -> tuple[list, int]:
    caps, cut = [], 0
    for row, lp in zip(seq, logps):
        words, count = caption_of(row)
        cut += count == len(words)  # no 0: cut at the length
        caps.append((words, count, gathered(row, lp, count)))
    return caps, cut


def searched(label: str, what: str, side: Side, model, peer_options: dict, options: dict,
             bound: float | None = 0.0, note: str = "") -> list[Difference]:
    seq, logps = peer_decode(model, side.fc, side.feats, side.peer_mask, peer_options)
    caps, cut = peer_captions(seq, logps)
    decoded = side.decode(**options)
    return caption_rows(label, what, side, caps, zip(decoded.tokens, decoded.logprobs), cut,
                        bound, note)


def diverse(label: str, side: Side, model) -> list[Difference]:
    """Diverse beam search, 4 beams in 2 groups: the caption ranked first (the first group's
    best), to be equal; and every caption of the search, as a set per image, a stated
    difference: the peer's ended hypotheses leave their beams to go on searching (and their
    words go on counting against the later groups), where capstack's keep their beams.

    The peer's ``add_diversity`` calls ``self.repeat_tensor``, which none of its models has
    (an AttributeError from the second step of the second group on): it is given its
    ``models/utils.py`` ``repeat_tensors``, what the call means."""
    if not hasattr(model, "repeat_tensor"):
        helpers = importlib.import_module("captioning.models.utils")
        model.repeat_tensor = helpers.repeat_tensors
    seq, logps = peer_decode(model, side.fc, side.feats, side.peer_mask,
                             {"beam_size": 4, "group_size": 2, "diversity_lambda": 0.5})
    caps, cut = peer_captions(seq, logps)
    options = dict(search="diverse", beam_size=4, group_size=2, diversity_lambda=0.5)
    first = side.decode(**options)
    rows = caption_rows(label, "diverse beam 4, 2 groups, lambda 0.5, ranked first", side, caps,
                        zip(first.tokens, first.logprobs), cut,
                        note="the peer's missing repeat_tensor given its repeat_tensors")
    every = side.decode(**options, n=4)
    differ = 0
    for k, beams in enumerate(model.done_beams):
        theirs = {tuple(side.words_of(caption_of(beam["seq"])[0])) for beam in beams}
        mine = {tuple(int(t) for t in tokens if int(t) not in (0, EOS_ID))
                for tokens in every.tokens[4 * k:4 * k + 4]}
        differ += mine != theirs
    return rows + [Difference("checkpoints", f"{label}: diverse beam: images whose 4 captions "
                              f"differ (of {IMAGES})", differ, None,
                              "the peer's ended hypotheses free their beams")]


def sampled(label: str, what: str, side: Side, model, method: str, top_k: int,
            top_p: float) -> list[Difference]:
    """What each samples from at each step along the peer's samples: support and p."""
    log: list = []
    torch.manual_seed(0)
    with recorded_categoricals(log):
        seq, _ = peer_decode(model, side.fc, side.feats, side.peer_mask,
                             {"sample_method": method})
    steps = len(log)
    ours_ids = [[side.ours_of[int(t)] if int(t) else EOS_ID for t in row] for row in seq]
    captions = torch.cat([torch.full((IMAGES, 1), 1), torch.tensor(ours_ids)], 1)
    with torch.no_grad():
        logp = torch.log_softmax(side.model(side.ctx, captions).logits, -1)
    kept = side.peer_of >= 0
    support, prob, rows = 0, 0.0, 0
    for t in range(steps):
        alive = torch.ones(IMAGES, dtype=torch.bool) if t == 0 else (seq[:, :t] != 0).all(1)
        theirs = torch.softmax(log[t], -1)[alive][:, side.peer_of[kept]]
        mine = torch.softmax(filtered(logp[:, t], 1.0, top_k, top_p), -1)[alive]
        support += int(((mine[:, kept] > 0) != (theirs > 0)).sum())
        support += int((mine[:, ~kept] > 0).sum())
        prob = max(prob, (mine[:, kept] - theirs).abs().max().item())
        rows += int(alive.sum())
    return [Difference("checkpoints", f"{label}: {what}: support entries that differ "
                       f"({rows} steps)", support, 0, "the peer's draws, seed 0"),
            Difference("checkpoints", f"{label}: {what}: p drawn from", prob, BOUND)]


def compare_model(label: str, side: Side, model) -> list[Difference]:
    rows = [teacher_forcing(side, model, label)]
    rows += searched(label, "greedy", side, model, {}, {"search": "greedy"})
    rows += searched(label, "beam 5", side, model, {"beam_size": 5}, {"beam_size": 5})
    rows += searched(label, "beam 5, length_penalty wu_0.2", side, model,
                     {"beam_size": 5, "length_penalty": "wu_0.2"},
                     {"beam_size": 5, "length_penalty": "wu_0.2"})
    rows += diverse(label, side, model)
    rows += searched(label, "beam 5, remove_bad_endings", side, model,
                     {"beam_size": 5, "remove_bad_endings": 1},
                     {"beam_size": 5, "remove_bad_endings": True})
    rows += searched(label, "greedy, block_trigrams", side, model, {"block_trigrams": 1},
                     {"search": "greedy", "block_trigrams": True}, bound=None,
                     note="the peer lowers a repeated trigram's p to a quarter, capstack "
                          "forbids it")
    rows += sampled(label, "top-k 3 sampling", side, model, "top3", 3, 1.0)
    rows += sampled(label, "top-p 0.8 sampling", side, model, "top0.8", 0, 0.8)
    return rows


def compare_ensemble(label: str, side: Side, model) -> list[Difference]:
    """AttEnsemble against capstack's Ensemble: teacher forcing, greedy, beam 5."""
    rows = [teacher_forcing(side, model, label, ENSEMBLE_FORCED, "|diff| / max(1, |log p|)",
                            relative=True)]
    note = "AttEnsemble given its first member's bos/eos/pad/unk_idx"
    rows += searched(label, "greedy", side, model, {}, {"search": "greedy"}, note=note)
    rows += searched(label, "beam 5", side, model, {"beam_size": 5}, {"beam_size": 5},
                     note=note)
    return rows


class Peer:
    """The peer's modules this check runs."""

    def __init__(self):
        self.opts = importlib.import_module("captioning.utils.opts")
        self.models = importlib.import_module("captioning.models")
        self.utils = importlib.import_module("captioning.utils.misc")
        self.ensemble = importlib.import_module("captioning.models.AttEnsemble")


def check(peer_dir: Path, options) -> list[Difference]:
    import cli

    rows: list[Difference] = []
    with tempfile.TemporaryDirectory() as tmp, importable(peer_dir):
        work = Path(tmp)
        prepare_captions(karpathy_json(work / "drawn.json"), work / "prepared", min_count=1,
                         max_len=MAX_LEN, vocab_rule="rtl")
        captions = load_captions(work / "prepared")
        test = [int(i) for i in captions.image_ids[captions.rows("test")]]
        store = region_store(work / "regions.lmdb", [int(i) for i in captions.image_ids])
        words = captions.vocab.itow[UNK_ID + 1:]
        random.Random(1).shuffle(words)
        words = words + ["UNK"]  # its vocabulary when its threshold dropped words
        peer = Peer()
        features = Features([store])
        made: dict[tuple[str, int, float], tuple[Any, Path]] = {}  # -> peer model, run

        def imported(name: str, seed: int, bias: float) -> tuple[Any, Path]:
            """The peer's model saved by its own code and imported (once per name, seed and
            <eos> bias)."""
            if (name, seed, bias) not in made:
                model, opt = peer_model(peer, name, words, seed, bias)
                sources = save_peer(peer, model, opt, words,
                                    work / f"peer_{name}{seed}_{bias:g}")
                run = work / f"run_{name}{seed}_{bias:g}"
                try:
                    cli.main(["import-checkpoint", "rtl", *map(str, sources), "--out",
                              str(run), "--captions", str(work / "prepared"), "--features",
                              str(store)], standalone_mode=False)
                except SystemExit as exit_:
                    if exit_.code:
                        raise
                made[name, seed, bias] = model.double(), run
            return made[name, seed, bias]

        for name in SIZES:
            model, run = imported(name, 0, EOS_BIAS[name])
            rows += compare_model(name, Side(run, words, features, test), model)
        for label, members in ENSEMBLES.items():
            models, runs = zip(*(imported(*member) for member in members))
            rows += compare_ensemble(label, Side(list(runs), words, features, test),
                                     peer_ensemble(peer, list(models)))
    sys.stdout.flush()
    return rows
