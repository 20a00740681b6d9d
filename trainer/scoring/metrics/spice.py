"""SPICE (Anderson et al. 2016): F-score over scene-graph tuples, pycocoevalcap's Java scorer.

It needs Java, ``spice-1.0.jar`` and Stanford CoreNLP's jars beside pycocoevalcap.
pycocoevalcap's wrapper downloads CoreNLP when it is built; nothing is downloaded at
run time here: the jars are checked for, and without them SPICE is unavailable with the
reason (where to put which file), never a made-up value.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from trainer.scoring.metrics import METRICS
from trainer.scoring.metrics.base import Metric, Texts
from trainer.scoring.text import java_missing

SPICE_JAR = "spice-1.0.jar"
CORENLP_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")


def _pkg_dir() -> Path:
    """The installed pycocoevalcap folder (a namespace package: no ``__file__``)."""
    spec = importlib.util.find_spec("pycocoevalcap")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("pycocoevalcap is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def spice_missing() -> str | None:
    """Why SPICE cannot run here, or ``None`` when Java and all its jars are present."""
    reasons = []
    java = java_missing()
    if java:
        reasons.append(java)
    spice_dir = _pkg_dir() / "spice"
    if not (spice_dir / SPICE_JAR).is_file():
        reasons.append(f"{SPICE_JAR} missing: put it in {spice_dir}")
    lib = spice_dir / "lib"
    absent = [name for name in CORENLP_JARS if not (lib / name).is_file()]
    if absent:
        reasons.append(f"Stanford CoreNLP jar(s) {', '.join(absent)} missing: put them in {lib} "
                       "(from stanford-corenlp-full-2015-12-09; not downloaded at run time)")
    return "; ".join(reasons) or None


@METRICS.register("spice")
class Spice(Metric):
    """SPICE 1.0 through pycocoevalcap (needs Java and the CoreNLP jars, never downloaded)."""

    values = ("SPICE",)
    columns = ("SPICE",)
    place = 50

    def missing(self) -> str | None:
        return spice_missing()

    def compute(self, texts: Texts) -> list[float]:
        from pycocoevalcap.spice.spice import Spice as Scorer

        # Spice.__init__ only calls get_stanford_models (a downloader); skip it.
        scorer = Scorer.__new__(Scorer)
        return [scorer.compute_score(texts.references, texts.candidates)[0]]
