"""Caption metrics (BLEU, METEOR, ROUGE-L, CIDEr, SPICE) through pycocoevalcap.

Two rules shape this module:

* A run never dies over a metric. A scorer that cannot run (no Java for METEOR,
  no CoreNLP jars for SPICE) or that raises gives ``None`` plus a reason in
  ``"unavailable"``; a value is never made up.
* Nothing is downloaded at run time. pycocoevalcap's SPICE wrapper fetches
  Stanford CoreNLP on construction; we check for the jars ourselves and build
  the scorer without calling that helper.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import re
import shutil
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

from pipeline.core.errors import CapstackError, where
from pipeline.core.jsonfile import read_json

ALL_METRICS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr", "SPICE")

SPICE_JAR = "spice-1.0.jar"
CORENLP_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")
JAVA_MISSING = "java not found"

# Characters the simple tokenizer drops. PTB's post-filter removes quotes,
# brackets, sentence punctuation and dashes; in-word hyphens ("t-shirt") stay
# one token there, so they stay here too.
_PUNCT = re.compile(r"""[.,;:!?'"`()\[\]{}/\\]|(?<!\w)-+|-+(?!\w)""")


# ---------------------------------------------------------------- availability

def java_missing() -> str | None:
    """``None`` when ``java`` is on PATH, else the reason ``"java not found"``."""
    return None if shutil.which("java") else JAVA_MISSING


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


# ---------------------------------------------------------------- tokenizing

def simple_tokenize(text: str) -> str:
    """Lowercase, drop punctuation (as PTB's post-filter does), collapse whitespace."""
    return " ".join(_PUNCT.sub(" ", text.lower()).split())


_END = object()  # the key of the end marker caption, never a caller's
_END_CAPTION = "capstackendofcaptions"


def _ptb_tokenize(captions: dict[Hashable, list[str]]) -> dict[Hashable, list[str]]:
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    wrapped = {k: [{"caption": c} for c in caps] for k, caps in captions.items()}
    wrapped[_END] = [{"caption": _END_CAPTION}]
    out = PTBTokenizer().tokenize(wrapped)
    # PTB pairs output lines with ids by position and drops lines past the last id (zip): a
    # lost line or an extra one shifts every later caption. The end marker, last in, must
    # come back whole and last.
    if out.pop(_END, None) != [_END_CAPTION] or any(
            len(out.get(k, ())) != len(caps) for k, caps in captions.items()):
        raise RuntimeError("PTB tokenizer's lines out do not match the captions' lines in")
    return out


def one_line(text: str) -> str:
    """``text`` with every run of whitespace as one space, and no ``|``.

    The PTB tokenizer and METEOR read one caption per line, and pair lines with images by
    position: a ``\\r``, U+2028 or U+2029 inside one caption (each of which Java or Python may
    end a line at) made an extra line and shifted every later caption onto another image's
    references (one ``\\r`` in 10 results took CIDEr from 318.9 to 35.3). METEOR's protocol
    separates fields with ``|||``."""
    return " ".join(text.replace("|", " ").split())


def _tokenize_any(captions: dict[Hashable, list[str]]) -> tuple[dict[Hashable, list[str]], str]:
    captions = {k: [one_line(c) for c in caps] for k, caps in captions.items()}
    if java_missing() is None:
        try:
            return _ptb_tokenize(captions), "ptb"
        except Exception as exc:  # noqa: BLE001 - fall back rather than lose the run
            name = f"simple (ptb failed: {type(exc).__name__}: {exc})"
    else:
        name = f"simple ({JAVA_MISSING})"
    return {k: [simple_tokenize(c) for c in caps] for k, caps in captions.items()}, name


def tokenize(captions: dict[int, list[str]]) -> tuple[dict[int, list[str]], str]:
    """PTB-tokenize (Java) or simple-tokenize captions; returns them and the tokenizer's name."""
    return _tokenize_any(captions)  # type: ignore[return-value]


# ---------------------------------------------------------------- scoring

def _check_inputs(candidates: dict[int, str],
                  references: dict[int, list[str]]) -> dict[int, list[str]]:
    """References restricted to the candidates' ids; user mistakes raise."""
    if not candidates:
        raise CapstackError("no candidate captions to score")
    for image_id in candidates:
        if not references.get(image_id):
            raise CapstackError(f"image_id {image_id}: candidate caption has no references")
    return {image_id: list(references[image_id]) for image_id in candidates}


def cider(candidates: dict[int, str], references: dict[int, list[str]]) -> float:
    """CIDEr-D of already-tokenized text; fast (no Java), for per-epoch validation."""
    return _pretokenized(_cider, candidates, references)[0]


def bleu4(candidates: dict[int, str], references: dict[int, list[str]]) -> float:
    """BLEU-4 (corpus level, closest reference length) of already-tokenized text; for a
    per-epoch validation that keeps the best BLEU-4 (``train.select_on: bleu4``)."""
    return _pretokenized(_bleu, candidates, references)[3]


def _pretokenized(scorer, candidates: dict[int, str], references: dict[int, list[str]]
                 ) -> list[float]:
    """``scorer``'s values for text tokenized already (no PTB, no Java)."""
    refs = _check_inputs(candidates, references)
    res = {image_id: [caption] for image_id, caption in candidates.items()}
    return [float(v) for v in scorer(refs, res)]


def _close_meteor(meteor: Any) -> None:
    """Stop METEOR's Java process now, without waiting for garbage collection.

    Its ``__del__`` takes the lock; if ``compute_score`` raised while holding
    it, that would hang, so the lock is released here too.
    """
    if hasattr(meteor, "close"):
        meteor.close()
        return
    proc = getattr(meteor, "meteor_p", None)
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.stdin.close()
        with contextlib.suppress(Exception):
            proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            with contextlib.suppress(Exception):
                stream.close()
    lock = getattr(meteor, "lock", None)
    if lock is not None and lock.locked():
        with contextlib.suppress(RuntimeError):
            lock.release()


def _bleu(gts, res) -> list[float]:
    from pycocoevalcap.bleu.bleu import Bleu

    values, _ = Bleu(4).compute_score(gts, res, verbose=0)
    return list(values)


def _meteor(gts, res) -> list[float]:
    from pycocoevalcap.meteor.meteor import Meteor

    # METEOR's stdin protocol: one "SCORE ||| ref ||| ... ||| hypothesis" line per image. A
    # tokenizer's output is one line already; this holds whatever the caller passes.
    gts = {k: [one_line(c) for c in caps] for k, caps in gts.items()}
    res = {k: [one_line(c) for c in caps] for k, caps in res.items()}
    meteor = Meteor()
    try:
        value, _ = meteor.compute_score(gts, res)
    finally:
        _close_meteor(meteor)
    return [value]


def _rouge(gts, res) -> list[float]:
    from pycocoevalcap.rouge.rouge import Rouge

    return [Rouge().compute_score(gts, res)[0]]


def _cider(gts, res) -> list[float]:
    from pycocoevalcap.cider.cider import Cider

    return [Cider().compute_score(gts, res)[0]]


def _spice(gts, res) -> list[float]:
    from pycocoevalcap.spice.spice import Spice

    # Spice.__init__ only calls get_stanford_models (a downloader); skip it.
    scorer = Spice.__new__(Spice)
    return [scorer.compute_score(gts, res)[0]]


# (metric names, scorer, reason it cannot run or None)
_Scorer = Callable[[dict, dict], list[float]]


def _scorers(spice: bool) -> list[tuple[tuple[str, ...], _Scorer, str | None]]:
    if not spice:
        spice_reason: str | None = "not requested (spice=False)"
    else:
        spice_reason = spice_missing()
    return [
        (("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4"), _bleu, None),
        (("METEOR",), _meteor, java_missing()),
        (("ROUGE-L",), _rouge, None),
        (("CIDEr",), _cider, None),
        (("SPICE",), _spice, spice_reason),
    ]


def _run_scorer(names: tuple[str, ...], scorer: _Scorer, gts: dict, res: dict,
                metrics: dict, unavailable: dict) -> None:
    """Fill ``metrics`` for ``names``; any failure becomes None plus a reason."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # pycocoevalcap prints
            values = [float(v) for v in scorer(gts, res)]
        if len(values) != len(names):
            raise RuntimeError(f"scorer returned {len(values)} values for {len(names)} metrics")
    except Exception as exc:  # noqa: BLE001 - a metric must never end the run
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        for name in names:
            metrics[name], unavailable[name] = None, f"scorer failed: {reason}"
        return
    for name, value in zip(names, values):
        if math.isfinite(value):
            metrics[name] = value
        else:
            metrics[name], unavailable[name] = None, f"scorer returned {value}"


def score(candidates: dict[int, str], references: dict[int, list[str]], *,
          spice: bool = True, max_refs: int = 0) -> dict:
    """Tokenize, then score every metric in ALL_METRICS (None + reason where one cannot run).
    ``max_refs``: against each image's first that many references (0: all of them; Show,
    Attend and Tell scores against 5 of COCO's 5 to 7)."""
    refs = first_references(_check_inputs(candidates, references), max_refs)
    merged: dict[Hashable, list[str]] = {("c", k): [v] for k, v in candidates.items()}
    merged.update({("r", k): v for k, v in refs.items()})
    tokenized, tokenizer = _tokenize_any(merged)  # one Java start for both sides
    res = {k: tokenized[("c", k)] for k in candidates}
    gts = {k: tokenized[("r", k)] for k in candidates}

    metrics: dict[str, float | None] = {name: None for name in ALL_METRICS}
    unavailable: dict[str, str] = {}
    for names, scorer, missing in _scorers(spice):
        if missing:
            unavailable.update({name: missing for name in names})
        else:
            _run_scorer(names, scorer, gts, res, metrics, unavailable)
    return {"metrics": metrics, "unavailable": unavailable, "tokenizer": tokenizer,
            "images": len(candidates), "max_refs": max_refs}


def first_references(references: dict[int, list[str]], n: int) -> dict[int, list[str]]:
    """Each image's first ``n`` references, in their file's order (0: all)."""
    if n < 0:
        raise CapstackError(f"max_refs: must be 0 (all) or more, got {n}")
    return {k: list(v[:n] if n else v) for k, v in references.items()}


# ---------------------------------------------------------------- files

def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _field(path, entry: Any, index: int, kind: str, name: str, check, expected: str) -> Any:
    """``entry[name]`` after checking it; errors name the file, entry index and field."""
    if not isinstance(entry, dict):
        raise CapstackError(f"{where(path, f'{kind} {index}')}: not an object")
    if name not in entry:
        raise CapstackError(f"{where(path, f'{kind} {index}')}: missing {name!r}")
    value = entry[name]
    if not check(value):
        raise CapstackError(f"{where(path, f'{kind} {index}')}: {name!r} must be {expected}, "
                            f"got {value!r}")
    return value


def load_results(path: str | Path) -> dict[int, str]:
    """A COCO results file (JSON list of {"image_id": int, "caption": str}) as {id: caption}."""
    data = read_json(path)
    if not isinstance(data, list):
        raise CapstackError(f"{where(path)}: expected a JSON list of results, "
                            f"got {type(data).__name__}")
    results: dict[int, str] = {}
    for i, entry in enumerate(data):
        image_id = _field(path, entry, i, "entry", "image_id", _is_int, "an integer")
        caption = _field(path, entry, i, "entry", "caption",
                         lambda v: isinstance(v, str), "a string")
        if image_id in results:
            raise CapstackError(f"{where(path, f'entry {i}')}: duplicate image_id {image_id}")
        results[image_id] = caption
    return results


def _image_ids(path, images: Any) -> set[int]:
    if not isinstance(images, list):
        raise CapstackError(f"{where(path, 'images')}: must be a list")
    return {_field(path, im, i, "image", "id", _is_int, "an integer")
            for i, im in enumerate(images)}


def load_references(path: str | Path) -> dict[int, list[str]]:
    """A COCO caption-annotation file (prepare's refs_{split}.json) as {id: [captions]}."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise CapstackError(f"{where(path)}: expected a JSON object with 'annotations'")
    annotations = data.get("annotations")
    if not isinstance(annotations, list):
        raise CapstackError(f"{where(path, 'annotations')}: missing or not a list")
    known = _image_ids(path, data["images"]) if "images" in data else None
    references: dict[int, list[str]] = {}
    for i, ann in enumerate(annotations):
        image_id = _field(path, ann, i, "annotation", "image_id", _is_int, "an integer")
        caption = _field(path, ann, i, "annotation", "caption",
                         lambda v: isinstance(v, str), "a string")
        if known is not None and image_id not in known:
            raise CapstackError(f"{where(path, f'annotation {i}')}: image_id {image_id} "
                                "is not in 'images'")
        references.setdefault(image_id, []).append(caption)
    return references


def score_files(results_path: str | Path, references_path: str | Path, *,
                spice: bool = True, max_refs: int = 0) -> dict:
    """Score a COCO results file against a COCO references file."""
    candidates = load_results(results_path)
    references = load_references(references_path)
    try:
        scored = score(candidates, references, spice=spice, max_refs=max_refs)
    except CapstackError as exc:
        raise CapstackError(f"{where(results_path)}: {exc} (references: {references_path})") \
            from None
    scored.update({"results": str(results_path), "references": str(references_path)})
    return scored
