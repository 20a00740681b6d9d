"""capstack's XE step, SCST step and beam search against self-critical.pytorch's, side by side.

Both sides get the same work, one after the other in one process, for two models:

- UpDown / ``top_down``: hidden 512, word and feature embeddings of 512 (the peer's UpDown
  embeds its 2048-d region features to ``rnn_size`` first; capstack's ``feature_embed: 512``),
  dropout 0.5;
- TransformerModel / ``transformer``: the peer's defaults, 6 encoder and 6 decoder layers,
  d_model 512, d_ff 2048, 8 heads, dropout 0.1 (capstack's ``norm_first: true,
  region_norm: false``, the peer's layout; ``benchmarks/parity.py`` holds the two equal).

Vocabulary 9,487, 36 regions of 2048-d, 50 images x 5 captions of 16 words, Adam (capstack's:
torch's fused Adam; the peer's: torch.optim.Adam as its train.py builds it), gradient-norm
clipping at 0.1, random weights (so every sampled caption runs the full 16 words). The SCST
step is 5 samples per image with the greedy decode as baseline and the CIDEr-D reward (the
peer's ``cider`` package against capstack's vectorised one, the same synthetic references and
document frequencies); beam search is K = 5 over 50 images.

The peer is not part of capstack: give a checkout of
https://github.com/ruotianluo/self-critical.pytorch with its ``cider``
submodule (``git clone --recursive``) and its requirements (``six``, ``yacs``). Its model,
loss wrapper and reward code are imported from there and driven as its
``tools/train.py`` drives them.

    python benchmarks/peer_steps.py --peer DIR [--steps 3] [--threads 2]
        [--models updown,transformer]

On a GPU (GPU.md's sizes): ``--device cuda --width 1000 --beam-images 5000``; beam search then
decodes that many images of random features, 50 at a time, and prints images/s.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import numpy as np

from common import importable

import torch

from trainer.batch import TrainBatch, whole_batch
from trainer.decode import beam_search
from trainer.decoders import build_decoder
from trainer.decoders.top_down import TopDownConfig
from trainer.decoders.transformer import TransformerConfig
from trainer.objectives import Setting, StepKey
from trainer.objectives.cross_entropy import CrossEntropy, CrossEntropyConfig
from trainer.objectives.scst import SelfCritical, SelfCriticalConfig
from trainer.optimizers import build_optimizer
from trainer.optimizers.adam import AdamConfig
from trainer.precision import Precision
from trainer.rewards.cider import CiderD
from trainer.training.compiled import WARM_UP_CALLS, compiled_steps
from trainer.training.loop import optimizer_step

VOCAB = 9487  # words + <pad>, <bos>, <eos>, <unk> in capstack; the peer's 9,486 words + 0
IMAGES, PER_IMAGE, LENGTH, REGIONS, DIM, WIDTH = 50, 5, 16, 36, 2048, 512
CLIP, LR, BEAM = 0.1, 5e-5, 5
SPECIALS = 4  # capstack's ids below this are <pad> <bos> <eos> <unk>


# ------------------------------------------------------------------------- the shared work

class Work:
    """Features, reference captions (ids of real words, 1..VOCAB-SPECIALS) and their words;
    the width of both sides' models, the device, and the images beam search decodes."""

    def __init__(self, seed: int = 0, width: int = WIDTH, device: str = "cpu",
                 beam_images: int = IMAGES):
        rng = np.random.default_rng(seed)
        self.width, self.device = width, torch.device(device)
        self.feats = torch.from_numpy(np.abs(rng.standard_normal((IMAGES, REGIONS, DIM)))
                                      .astype(np.float32)).to(self.device)
        words = VOCAB - SPECIALS
        frequent = rng.zipf(1.3, size=IMAGES * PER_IMAGE * LENGTH) % words + 1
        self.refs = frequent.reshape(IMAGES, PER_IMAGE, LENGTH)  # word w in 1..words
        self.beam_feats = self.feats if beam_images == IMAGES else torch.rand(
            beam_images, REGIONS, DIM, generator=torch.Generator().manual_seed(seed)
        ).to(self.device)

    def beam_batches(self, first_only: bool = False):
        """The beam-searched images' features, 50 at a time (the first 50: a warm-up)."""
        batches = self.beam_feats.split(IMAGES)
        return batches[:1] if first_only else batches


def word_strings(ids) -> str:
    return " ".join(str(int(i)) for i in ids if i > 0)


def document_frequencies(refs: np.ndarray) -> dict:
    """n-gram -> images whose references hold it, as both scorers' caches do."""
    df = defaultdict(float)
    for image in refs:
        grams = set()
        for caption in image:
            tokens = [str(int(t)) for t in caption]
            for n in range(1, 5):
                grams.update(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
        for gram in grams:
            df[gram] += 1
    return df


# ------------------------------------------------------------------------- capstack

def capstack_decoder(model: str, width: int) -> tuple[str, object]:
    """capstack's decoder for the peer's ``caption_model``: top_down as its UpDown (widths
    ``width``), the transformer as its TransformerModel (its defaults: 6 layers, d_model 512,
    d_ff 2048, 8 heads, dropout 0.1; its pre-norm sublayers and plain region embedding)."""
    if model == "updown":
        return "top_down", TopDownConfig(hidden=width, embed=width, att_hidden=width,
                                         feature_embed=width)
    return "transformer", TransformerConfig(d_model=512, heads=8, layers=6, d_ff=2048,
                                            dropout=0.1, norm_first=True, region_norm=False)


def peer_model_options(model: str, width: int) -> dict:
    """The peer's options for the same model (its transformer configs' values)."""
    if model == "updown":
        return dict(caption_model="updown", input_encoding_size=width, rnn_size=width,
                    att_hid_size=width, drop_prob_lm=0.5)
    return dict(caption_model="transformer", num_layers=6, input_encoding_size=512,
                rnn_size=2048, att_hid_size=512, drop_prob_lm=0.1, dropout=0.1, use_bn=0)


class Capstack:
    name = "capstack"

    def __init__(self, work: Work, model: str = "updown", amp: str = "off",
                 compile_steps: str = "off"):
        torch.manual_seed(0)
        self.precision = Precision(amp, work.device)
        name, config = capstack_decoder(model, work.width)
        self.work = work
        self.model = build_decoder(name, config, VOCAB, DIM).to(work.device).train()
        self.opt = build_optimizer("adam", AdamConfig(), [{"params": list(self.model.parameters()),
                                                           "name": "decoder"}], LR)
        captions = torch.zeros(IMAGES * PER_IMAGE, LENGTH + 2, dtype=torch.long)
        captions[:, 0] = 1  # <bos>
        captions[:, 1:LENGTH + 1] = torch.from_numpy(work.refs.reshape(-1, LENGTH)) + SPECIALS - 1
        captions[:, LENGTH + 1] = 2  # <eos>
        mask = torch.ones(IMAGES, REGIONS, dtype=torch.bool)
        share = whole_batch(int((captions[:, 1:] != 0).sum()), IMAGES * PER_IMAGE, IMAGES)
        self.batch = TrainBatch(list(range(IMAGES)), work.feats, mask, captions, share,
                                seq_per_img=PER_IMAGE).to(work.device)
        setting = Setting(captions=None, max_len=LENGTH, device=work.device)
        self.xe = CrossEntropy(CrossEntropyConfig(), setting)
        names = ["<pad>", "<bos>", "<eos>", "<unk>"] + [str(w) for w in range(1, VOCAB - 3)]
        references = {i: [word_strings(c) for c in work.refs[i]] for i in range(IMAGES)}
        self.scst = SelfCritical(SelfCriticalConfig(reward=None, samples=PER_IMAGE,
                                                    baseline="greedy"), setting,
                                 scorer=CiderD.from_references(references, names))
        self.compiled = compiled_steps(compile_steps, "auto", self.model, work.device)

    def _update(self, objective) -> None:
        """Training's own step (trainer/training/loop.py): the loss under ``train.amp``'s
        autocast and ``train.compile``'s compiled steps, zero_grad, backward, clipping, the
        optimiser's step, the statistics to the host."""
        optimizer_step(partial(objective.loss, self.model), self.batch, StepKey(0, 0, 0),
                       self.precision, self.opt, CLIP, self.compiled)

    def warm_up(self, method: str) -> None:
        """The calls before the timed ones: compiled steps compile, then warm up and record
        their CUDA graphs (three calls); eager ones once."""
        for _ in range(WARM_UP_CALLS if self.compiled is not None else 1):
            getattr(self, method)()

    def xe_step(self) -> None:
        self._update(self.xe)

    def scst_step(self) -> None:
        self._update(self.scst)

    def beam(self, warm_up: bool = False) -> None:
        self.model.eval()
        with torch.no_grad():
            for feats in self.work.beam_batches(warm_up):
                mask = torch.ones(feats.shape[:2], dtype=torch.bool, device=feats.device)
                beam_search(self.model, self.model.encode(feats, mask), BEAM, LENGTH)
        self.model.train()


# ------------------------------------------------------------------------- the peer

@contextmanager
def peer_paths(peer: Path):
    """The peer's package and its cider submodule importable, its working folder current
    (its CiderD reads document frequencies from ``data/<name>.p`` there)."""
    if not (peer / "captioning" / "models" / "AttModel.py").is_file():
        sys.exit(f"{peer}: not a self-critical.pytorch checkout (no captioning/models/AttModel.py)")
    if not (peer / "cider" / "pyciderevalcap" / "ciderD").is_dir():
        sys.exit(f"{peer}/cider: the cider submodule is missing (git clone --recursive, or "
                 f"git submodule update --init)")
    importable(peer, peer / "cider")
    with tempfile.TemporaryDirectory() as tmp:
        before = os.getcwd()
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(before)


class Peer:
    name = "self-critical.pytorch"

    def __init__(self, work: Work, folder: Path, model: str = "updown"):
        argv, sys.argv = sys.argv, [sys.argv[0]]
        try:
            from captioning.utils.opts import parse_opt
            opt = parse_opt()
        finally:
            sys.argv = argv
        from captioning.models import setup
        from captioning.modules.loss_wrapper import LossWrapper
        from captioning.utils import rewards

        words = VOCAB - SPECIALS
        for key, value in dict(**peer_model_options(model, work.width), vocab_size=words,
                               fc_feat_size=DIM, att_feat_size=DIM, seq_length=LENGTH,
                               max_length=LENGTH, seq_per_img=PER_IMAGE, train_sample_n=PER_IMAGE,
                               train_sample_method="sample", sc_sample_method="greedy",
                               sc_beam_size=1, train_beam_size=1, cider_reward_weight=1,
                               bleu_reward_weight=0, grad_clip_mode="norm", grad_clip_value=CLIP,
                               label_smoothing=0, cached_tokens="bench-idxs",
                               vocab={str(i): str(i) for i in range(1, words + 1)}).items():
            setattr(opt, key, value)
        (folder / "data").mkdir(exist_ok=True)
        with open(folder / "data" / "bench-idxs.p", "wb") as f:
            pickle.dump({"document_frequency": document_frequencies(work.refs),
                         "ref_len": IMAGES}, f)
        rewards.init_scorer(opt.cached_tokens)
        torch.manual_seed(0)
        self.opt = opt
        self.work = work
        self.model = setup(opt).to(work.device).train()
        self.wrapper = LossWrapper(self.model, opt)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=LR)
        self.fc = work.feats.mean(1)
        self.att = work.feats
        labels = np.zeros((IMAGES * PER_IMAGE, LENGTH + 2), np.int64)
        labels[:, 1:LENGTH + 1] = work.refs.reshape(-1, LENGTH)  # 0: the peer's <bos> and <eos>
        self.labels = torch.from_numpy(labels).to(work.device)
        self.masks = torch.zeros(IMAGES * PER_IMAGE, LENGTH + 2, device=work.device)
        self.masks[:, :LENGTH + 2] = 1  # the words and the <eos> after them (as its loader)
        self.gts = [work.refs[i] for i in range(IMAGES)]

    def _step(self, sc_flag: bool) -> None:
        """As its tools/train.py: zero_grad, the loss wrapper, backward, clip, step."""
        self.optimizer.zero_grad()
        out = self.wrapper(self.fc, self.att, self.labels, self.masks, None, self.gts,
                           torch.arange(0, len(self.gts)), sc_flag, False, False)
        out["loss"].mean().backward()
        getattr(torch.nn.utils, f"clip_grad_{self.opt.grad_clip_mode}_")(
            self.model.parameters(), self.opt.grad_clip_value)
        self.optimizer.step()

    def xe_step(self) -> None:
        self._step(False)

    def scst_step(self) -> None:
        with quiet():  # its reward prints the batch's CIDEr-D at every step
            self._step(True)

    def beam(self, warm_up: bool = False) -> None:
        self.model.eval()
        with torch.no_grad():
            for att in self.work.beam_batches(warm_up):
                self.model(att.mean(1), att, None,
                           opt={"beam_size": BEAM, "sample_method": "greedy", "sample_n": 1},
                           mode="sample")
        self.model.train()


@contextmanager
def quiet():
    stdout, sys.stdout = sys.stdout, open(os.devnull, "w")
    try:
        yield
    finally:
        sys.stdout.close()
        sys.stdout = stdout


# ------------------------------------------------------------------------- timing

def warm_up_of(side, method: str):
    """What runs before a side's timed calls: beam search over the warm-up batches, a side's own
    warm-up (capstack's compiled steps), else one call of the timed method."""
    if method == "beam":
        return partial(side.beam, warm_up=True)
    return partial(side.warm_up, method) if hasattr(side, "warm_up") else None


def seconds(run, steps: int, warm_up=None) -> list[float]:
    """Seconds of each of ``steps`` calls after one warm-up call (``warm_up``'s, else the
    timed call's), the GPU's work finished."""
    (warm_up or run)()
    times = []
    for _ in range(steps):
        synchronize()
        started = time.perf_counter()
        run()
        synchronize()
        times.append(time.perf_counter() - started)
    return times


def synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", type=Path, required=True,
                    help="a checkout of self-critical.pytorch, with its cider submodule")
    ap.add_argument("--steps", type=int, default=3, help="timed calls of each (after a warm-up)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--width", type=int, default=WIDTH,
                    help="hidden, word and feature embedding, attention widths (GPU.md: 1000)")
    ap.add_argument("--beam-images", type=int, default=IMAGES)
    ap.add_argument("--beam-steps", type=int, default=3, help="timed beam searches of them all")
    ap.add_argument("--amp", default="off", choices=["off", "bfloat16"],
                    help="capstack's train.amp (the peer's side stays float32): off compares "
                         "like with like; bfloat16 is what train.amp: bfloat16 gives")
    ap.add_argument("--compile", default="off", choices=["off", "steps"],
                    help="capstack's train.compile (CUDA graphs on a GPU); its warm-up calls "
                         "(compiling, recording) are not timed")
    ap.add_argument("--models", default="updown,transformer",
                    help="the peer's caption_model names: updown (top_down), transformer")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    work = Work(width=args.width, device=args.device, beam_images=args.beam_images)
    where = (torch.cuda.get_device_name(work.device) if work.device.type == "cuda" else
             f"CPU, {torch.get_num_threads()} threads")
    print(f"torch {torch.__version__}, {where}; capstack's train.amp {args.amp}, train.compile "
          f"{args.compile}, the peer's "
          f"float32; vocabulary {VOCAB}, {REGIONS}x{DIM} regions, "
          f"{IMAGES} images x {PER_IMAGE} captions of {LENGTH} words, Adam, clip {CLIP}")
    with peer_paths(args.peer.resolve()) as folder:
        for model in args.models.split(","):
            compare(model, [Peer(work, folder, model),
                            Capstack(work, model, args.amp, args.compile)], args)


def compare(model: str, sides: list, args) -> None:
    """Each side's XE step, SCST step and beam search timed, one side after the other."""
    about = (f"hidden {args.width}, words and regions embedded to {args.width}"
             if model == "updown" else "6+6 layers, d_model 512, d_ff 2048, 8 heads")
    print(f"\n{model} / {capstack_decoder(model, args.width)[0]}: {about}")
    print(f"{'':34} {'self-critical.pytorch':>22} {'capstack':>16} {'capstack vs peer':>17}")
    for label, method in [("XE step", "xe_step"),
                          ("SCST step (5 samples + greedy)", "scst_step"),
                          (f"beam K={BEAM}, {args.beam_images} images", "beam")]:
        peer, ours = (seconds(getattr(side, method), args.steps if method != "beam" else
                              args.beam_steps, warm_up_of(side, method)) for side in sides)
        rates = (f"   images/s: {args.beam_images / np.median(peer):.0f} and "
                 f"{args.beam_images / np.median(ours):.0f}" if method == "beam" else "")
        print(f"{label:34} {min(peer):9.3f}-{max(peer):.3f} s {min(ours):7.3f}-{max(ours):.3f} s"
              f" {np.median(peer) / np.median(ours):16.2f}x" + rates, flush=True)

if __name__ == "__main__":
    main()
