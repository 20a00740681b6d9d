"""capstack's XE step, SCST step and beam search against self-critical.pytorch's, side by side.

Both sides get the same work, one after the other in one process: UpDown / top_down
with hidden 512, word and feature embeddings of 512 (the peer's UpDown embeds its
2048-d region features to ``rnn_size`` first; capstack's ``feature_embed: 512``),
vocabulary 9,487, 36 regions of 2048-d, 50 images x 5 captions of 16 words,
Adam, gradient-norm clipping at 0.1, dropout 0.5, random weights (so every
sampled caption runs the full 16 words). The SCST step is 5 samples per image
with the greedy decode as baseline and the CIDEr-D reward (the peer's
``cider`` package against capstack's vectorised one, the same synthetic
references and document frequencies); beam search is K = 5 over 50 images.

The peer is not part of capstack: give a checkout of
https://github.com/ruotianluo/self-critical.pytorch with its ``cider``
submodule (``git clone --recursive``) and its requirements (``six``, ``yacs``). Its model,
loss wrapper and reward code are imported from there and driven as its
``tools/train.py`` drives them.

    python benchmarks/peer_steps.py --peer DIR [--steps 3] [--threads 2]
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
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from trainer.batch import TrainBatch, whole_batch  # noqa: E402
from trainer.decode import beam_search  # noqa: E402
from trainer.decoders import build_decoder  # noqa: E402
from trainer.decoders.top_down import TopDownConfig  # noqa: E402
from trainer.objectives import Setting, StepKey  # noqa: E402
from trainer.objectives.cross_entropy import CrossEntropy, CrossEntropyConfig  # noqa: E402
from trainer.objectives.scst import SelfCritical, SelfCriticalConfig  # noqa: E402
from trainer.rewards.cider import CiderD  # noqa: E402

VOCAB = 9487  # words + <pad>, <bos>, <eos>, <unk> in capstack; the peer's 9,486 words + 0
IMAGES, PER_IMAGE, LENGTH, REGIONS, DIM, WIDTH = 50, 5, 16, 36, 2048, 512
CLIP, LR, BEAM = 0.1, 5e-5, 5
SPECIALS = 4  # capstack's ids below this are <pad> <bos> <eos> <unk>


# ------------------------------------------------------------------------- the shared work

class Work:
    """Features, reference captions (ids of real words, 1..VOCAB-SPECIALS) and their words."""

    def __init__(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.feats = torch.from_numpy(np.abs(rng.standard_normal((IMAGES, REGIONS, DIM)))
                                      .astype(np.float32))
        words = VOCAB - SPECIALS
        frequent = rng.zipf(1.3, size=IMAGES * PER_IMAGE * LENGTH) % words + 1
        self.refs = frequent.reshape(IMAGES, PER_IMAGE, LENGTH)  # word w in 1..words


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

class Capstack:
    name = "capstack"

    def __init__(self, work: Work):
        torch.manual_seed(0)
        config = TopDownConfig(hidden=WIDTH, embed=WIDTH, att_hidden=WIDTH, feature_embed=WIDTH)
        self.model = build_decoder("top_down", config, VOCAB, DIM).train()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=LR)
        captions = torch.zeros(IMAGES * PER_IMAGE, LENGTH + 2, dtype=torch.long)
        captions[:, 0] = 1  # <bos>
        captions[:, 1:LENGTH + 1] = torch.from_numpy(work.refs.reshape(-1, LENGTH)) + SPECIALS - 1
        captions[:, LENGTH + 1] = 2  # <eos>
        mask = torch.ones(IMAGES, REGIONS, dtype=torch.bool)
        share = whole_batch(int((captions[:, 1:] != 0).sum()), IMAGES * PER_IMAGE, IMAGES)
        self.batch = TrainBatch(list(range(IMAGES)), work.feats, mask, captions, share,
                                seq_per_img=PER_IMAGE)
        setting = Setting(captions=None, max_len=LENGTH)
        self.xe = CrossEntropy(CrossEntropyConfig(), setting)
        names = ["<pad>", "<bos>", "<eos>", "<unk>"] + [str(w) for w in range(1, VOCAB - 3)]
        references = {i: [word_strings(c) for c in work.refs[i]] for i in range(IMAGES)}
        self.scst = SelfCritical(SelfCriticalConfig(reward=None, samples=PER_IMAGE,
                                                    baseline="greedy"), setting,
                                 scorer=CiderD.from_references(references, names))

    def _update(self, loss) -> None:
        self.opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)
        self.opt.step()

    def xe_step(self) -> None:
        self._update(self.xe.loss(self.model, self.batch, StepKey(0, 0, 0))[0])

    def scst_step(self) -> None:
        self._update(self.scst.loss(self.model, self.batch, StepKey(0, 0, 0))[0])

    def beam(self) -> None:
        self.model.eval()
        with torch.no_grad():
            beam_search(self.model, self.model.encode(self.batch.feats, self.batch.mask), BEAM,
                        LENGTH)
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
    sys.path[:0] = [str(peer), str(peer / "cider")]
    with tempfile.TemporaryDirectory() as tmp:
        before = os.getcwd()
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(before)


class Peer:
    name = "self-critical.pytorch"

    def __init__(self, work: Work, folder: Path):
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
        for key, value in dict(caption_model="updown", vocab_size=words, input_encoding_size=WIDTH,
                               rnn_size=WIDTH, att_hid_size=WIDTH, fc_feat_size=DIM,
                               att_feat_size=DIM, drop_prob_lm=0.5, seq_length=LENGTH,
                               max_length=LENGTH, seq_per_img=PER_IMAGE, train_sample_n=PER_IMAGE,
                               train_sample_method="sample", sc_sample_method="greedy",
                               sc_beam_size=1, train_beam_size=1, cider_reward_weight=1,
                               bleu_reward_weight=0, grad_clip_mode="norm", grad_clip_value=CLIP,
                               label_smoothing=0, cached_tokens="bench-idxs",
                               vocab={str(i): str(i) for i in range(1, words + 1)}).items():
            setattr(opt, key, value)
        (folder / "data").mkdir()
        with open(folder / "data" / "bench-idxs.p", "wb") as f:
            pickle.dump({"document_frequency": document_frequencies(work.refs),
                         "ref_len": IMAGES}, f)
        rewards.init_scorer(opt.cached_tokens)
        torch.manual_seed(0)
        self.opt = opt
        self.model = setup(opt).train()
        self.wrapper = LossWrapper(self.model, opt)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=LR)
        self.fc = work.feats.mean(1)
        self.att = work.feats
        labels = np.zeros((IMAGES * PER_IMAGE, LENGTH + 2), np.int64)
        labels[:, 1:LENGTH + 1] = work.refs.reshape(-1, LENGTH)  # 0: the peer's <bos> and <eos>
        self.labels = torch.from_numpy(labels)
        self.masks = torch.zeros(IMAGES * PER_IMAGE, LENGTH + 2)
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

    def beam(self) -> None:
        self.model.eval()
        with torch.no_grad():
            self.model(self.fc, self.att, None, opt={"beam_size": BEAM, "sample_method": "greedy", "sample_n": 1},
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

def seconds(run, steps: int) -> list[float]:
    """Seconds of each of ``steps`` calls after one warm-up call."""
    run()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", type=Path, required=True,
                    help="a checkout of self-critical.pytorch, with its cider submodule")
    ap.add_argument("--steps", type=int, default=3, help="timed calls of each (after a warm-up)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    work = Work()
    with peer_paths(args.peer.resolve()) as folder:
        sides = [Peer(work, folder), Capstack(work)]
        print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads; UpDown/top_down "
              f"hidden {WIDTH}, vocabulary {VOCAB}, {REGIONS}x{DIM} regions embedded to {WIDTH}, "
              f"{IMAGES} images x {PER_IMAGE} captions of {LENGTH} words, Adam, clip {CLIP}")
        print(f"{'':34} {'self-critical.pytorch':>22} {'capstack':>16} {'capstack vs peer':>17}")
        for label, method in [("XE step", "xe_step"),
                              ("SCST step (5 samples + greedy)", "scst_step"),
                              (f"beam K={BEAM}, {IMAGES} images", "beam")]:
            peer, ours = (seconds(getattr(side, method), args.steps) for side in sides)
            print(f"{label:34} {min(peer):9.2f}-{max(peer):.2f} s {min(ours):7.2f}-{max(ours):.2f} s"
                  f" {np.median(peer) / np.median(ours):16.2f}x")


if __name__ == "__main__":
    main()
