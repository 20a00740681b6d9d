"""capstack's caption metrics beside self-critical.pytorch's ``eval_utils.language_eval``.

The peer's own function runs (a subprocess of this interpreter, in a scratch folder laid
out as it expects: ``coco-caption/annotations/captions_val2014.json``, ``eval_results/``)
with its ``coco-caption`` submodule (ruotianluo's fork of the COCO caption evaluation:
its PTB tokenizer, BLEU, METEOR, ROUGE-L, CIDEr) first on the path. capstack scores the
same captions against the same references with ``trainer.scoring.metrics.score``.
Compared: BLEU-1..4, METEOR, ROUGE-L and CIDEr, each to 1e-9.

Two of the fork's scorers cannot run here, and get stand-ins that score NaN, so that the
rest of the peer's path runs: SPICE (Stanford CoreNLP 3.6.0's jars are not in the
fork and cannot be fetched) and WMD (it loads the GoogleNews word2vec vectors). Neither is
compared; capstack reports SPICE as unavailable, with the reason, and has no WMD.

The captions are drawn here: 120 images with 5 to 7 references each (capitals,
punctuation, hyphenated words), and candidates that are references with words changed,
dropped or added, or other images' references, so that no metric is 0 or 1.
The submodule must be complete (``git clone --recursive``): its METEOR and tokenizer jars
are the same files pycocoevalcap installs, should a snapshot lack them.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.peer_parity import Difference

from trainer.scoring.metrics import score

BOUND = 1e-9
PEER_NAMES = {"BLEU-1": "Bleu_1", "BLEU-2": "Bleu_2", "BLEU-3": "Bleu_3", "BLEU-4": "Bleu_4",
              "METEOR": "METEOR", "ROUGE-L": "ROUGE_L", "CIDEr": "CIDEr"}
NEEDED = ("pycocoevalcap/eval.py", "pycocoevalcap/meteor/meteor-1.5.jar",
          "pycocoevalcap/meteor/data/paraphrase-en.gz",
          "pycocoevalcap/tokenizer/stanford-corenlp-3.4.1.jar")

# Run by the subprocess: the peer's language_eval with the two stand-ins, its scores to JSON.
DRIVER = r'''
import json, sys, types
peer, work = sys.argv[1], sys.argv[2]


class Unavailable:
    """A scorer that cannot run here: NaN for the whole set and for every image."""
    def __init__(self, *args, **kwargs):
        pass

    def method(self):
        return self.name

    def compute_score(self, gts, res):
        return float("nan"), [self.per_image() for _ in gts]


class Spice(Unavailable):
    name = "SPICE"

    def per_image(self):
        return {"All": {"f": float("nan")}}


class WMD(Unavailable):
    name = "WMD"

    def per_image(self):
        return float("nan")


import pycocoevalcap  # the fork's, first on the path
for name, stand_in in (("pycocoevalcap.spice.spice", Spice), ("pycocoevalcap.wmd.wmd", WMD)):
    module = types.ModuleType(name)
    setattr(module, stand_in.__name__, stand_in)
    sys.modules[name] = module
from captioning.utils import eval_utils

preds = json.load(open(work + "/preds.json"))
out = eval_utils.language_eval("coco", preds, [], {"id": "parity"}, "test")
json.dump({"scores": {k: v for k, v in out.items() if isinstance(v, float)},
           "pycocoevalcap": pycocoevalcap.__path__[0]}, open(work + "/peer.json", "w"))
'''

WORDS = ("a man woman dog cat red blue small large sitting standing on in the with next to "
         "table grass street t-shirt frisbee two of is are holding playing near bench "
         "white black young old bike riding down hill").split()


def drawn_captions(images: int = 120, seed: int = 0) -> tuple[dict[int, str], dict[int, list[str]]]:
    """Candidates and references, {image id: caption} and {image id: [captions]}."""
    rng = random.Random(seed)

    def sentence() -> list[str]:
        return [rng.choice(WORDS) for _ in range(rng.randint(5, 14))]

    def written(words: list[str]) -> str:
        text = " ".join(words)
        text = text[0].upper() + text[1:]
        if rng.random() < 0.3:
            text = text.replace(" ", ", ", 1)
        return text + rng.choice([".", "", " .", "!"])

    references = {1000 + i: [written(sentence()) for _ in range(rng.randint(5, 7))]
                  for i in range(images)}
    candidates = {}
    for image_id, refs in references.items():
        words = rng.choice(refs).rstrip(".! ").replace(",", "").lower().split()
        if rng.random() < 0.2:  # another image's caption
            words = rng.choice(references[rng.choice(list(references))]).lower().split()
        for _ in range(rng.randint(0, 4)):  # change, drop or add a word
            k = rng.randrange(len(words))
            move = rng.random()
            if move < 0.4:
                words[k] = rng.choice(WORDS)
            elif move < 0.7 and len(words) > 3:
                del words[k]
            else:
                words.insert(k, rng.choice(WORDS))
        candidates[image_id] = " ".join(words)
    return candidates, references


def coco_annotations(references: dict[int, list[str]]) -> dict:
    """The references as a COCO caption-annotation file (what the peer's COCO() reads)."""
    annotations = [{"image_id": image_id, "id": 10 * image_id + k, "caption": caption}
                   for image_id, refs in references.items() for k, caption in enumerate(refs)]
    return {"info": {}, "licenses": [], "type": "captions",
            "images": [{"id": image_id} for image_id in references], "annotations": annotations}


def run_peer(peer: Path, candidates: dict[int, str], references: dict[int, list[str]],
             work: Path) -> dict[str, float]:
    fork = peer / "coco-caption"
    absent = [name for name in NEEDED if not (fork / name).is_file()]
    if absent:
        raise SystemExit(f"{fork}: the coco-caption submodule lacks {', '.join(absent)}: clone "
                         f"with --recursive (the jars are those pycocoevalcap installs)")
    (work / "coco-caption" / "annotations").mkdir(parents=True)
    (work / "coco-caption" / "pycocoevalcap").symlink_to(fork / "pycocoevalcap")
    (work / "coco-caption" / "pycocotools").symlink_to(fork / "pycocotools")
    (work / "eval_results").mkdir()
    (work / "coco-caption" / "annotations" / "captions_val2014.json").write_text(
        json.dumps(coco_annotations(references)))
    preds = [{"image_id": image_id, "caption": caption, "perplexity": 0.0, "entropy": 0.0}
             for image_id, caption in candidates.items()]
    (work / "preds.json").write_text(json.dumps(preds))
    path = os.pathsep.join([str(work / "coco-caption"), str(peer),
                            *filter(None, [os.environ.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, "-c", DRIVER, str(peer), str(work)], cwd=work,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path})
    if done.returncode != 0:
        raise SystemExit(f"{peer}: eval_utils.language_eval failed (exit {done.returncode}):\n"
                         f"{done.stderr[-2000:]}")
    out = json.loads((work / "peer.json").read_text())
    if not Path(out["pycocoevalcap"]).resolve().is_relative_to(fork.resolve()):
        raise SystemExit(f"the peer ran {out['pycocoevalcap']}, not its submodule's")
    return out["scores"]


def check(peer_dir: Path, options) -> list[Difference]:
    candidates, references = drawn_captions()
    with tempfile.TemporaryDirectory() as tmp:
        peer = run_peer(peer_dir, candidates, references, Path(tmp))
    ours = score(candidates, references, spice=False)["metrics"]
    rows = []
    for name, peer_name in PEER_NAMES.items():
        theirs, mine = peer.get(peer_name, math.nan), ours[name]
        if mine is None:  # capstack could not score it (its reason is in "unavailable")
            rows.append(Difference("evaluation", f"{name}: capstack could not score it",
                                   math.inf, BOUND))
            continue
        rows.append(Difference("evaluation", f"{name}: capstack {mine:.6f}, language_eval "
                               f"{theirs:.6f} ({len(candidates)} images)", abs(mine - theirs),
                               BOUND))
    return rows
