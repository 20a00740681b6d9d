"""What the benchmark scripts share: the capstack checkout importable, a timer, made-up photos,
the CLI as a process of its own.

A script runs as ``python benchmarks/NAME.py``: Python puts ``benchmarks/`` first on the import
path, so ``from common import ...`` finds this file, and importing it makes this checkout's
``cli``, ``pipeline`` and ``trainer`` importable (step_profile.py's ``--root DIR`` puts another
checkout before it). This file is the benchmarks' one change to the import path:
:func:`importable`, which a peer's checkout goes through too.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def importable(*folders: str | Path) -> Callable[[], None]:
    """``folders`` first on the import path, in their order (those not on it yet); returns what
    takes them off again."""
    path = sys.path  # the one place benchmarks/ changes it
    added = [str(folder) for folder in folders if str(folder) not in path]
    path[:0] = added

    def undo() -> None:
        for folder in added:
            path.remove(folder)

    return undo


@contextmanager
def imports_from(*folders: str | Path) -> Iterator[None]:
    """``folders`` importable (first on the path) inside the block only."""
    undo = importable(*folders)
    try:
        yield
    finally:
        undo()


def checkout(argv: list[str]) -> Path:
    """The capstack checkout ``--root DIR`` names in ``argv``, else this one (read before
    capstack is imported, by step_profile.py)."""
    for i, arg in enumerate(argv):
        if arg == "--root" and i + 1 < len(argv):
            return Path(argv[i + 1]).resolve()
        if arg.startswith("--root="):
            return Path(arg.split("=", 1)[1]).resolve()
    return ROOT


importable(ROOT)


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, Any]:
    """Seconds ``fn(*args, **kwargs)`` took, and what it returned."""
    started = time.perf_counter()
    value = fn(*args, **kwargs)
    return time.perf_counter() - started, value


def median_timed(fn: Callable[..., Any], *args: Any, repeat: int, cuda: bool = False,
                 **kwargs: Any) -> tuple[float, Any]:
    """Median seconds of ``repeat`` calls after a warm-up call (``cuda``: the device
    synchronised before and inside each timing), and the last call's result."""
    synchronize = (__import__("torch").cuda.synchronize if cuda else lambda: None)

    def call() -> Any:
        out = fn(*args, **kwargs)
        synchronize()
        return out

    out = call()
    times = []
    for _ in range(repeat):
        synchronize()
        seconds, out = timed(call)
        times.append(seconds)
    return statistics.median(times), out


def write_images(folder: Path, n: int, *, size: tuple[int, int] = (640, 480), seed: int = 0,
                 quality: int = 90) -> Path:
    """``n`` photo-like JPEGs (six filled circles on a flat colour) in ``folder/images`` and a
    Karpathy json of them (one train caption each); returns the json's path."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    (folder / "images").mkdir(parents=True)
    width, height = size
    d = min(80, width // 4, height // 4)  # the circles' diameter
    images = []
    for i in range(n):
        im = Image.new("RGB", size, tuple(int(c) for c in rng.integers(120, 255, 3)))
        draw = ImageDraw.Draw(im)
        for _ in range(6):
            x, y = rng.integers(0, width - d), rng.integers(0, height - d)
            draw.ellipse([x, y, x + d, y + d],
                         fill=tuple(int(c) for c in rng.integers(0, 255, 3)))
        im.save(folder / "images" / f"{i:05d}.jpg", quality=quality)
        images.append({"filepath": "images", "filename": f"{i:05d}.jpg", "imgid": i,
                       "split": "train", "sentences": [{"tokens": ["x"], "sentid": i}]})
    path = folder / "dataset_bench.json"
    path.write_text(json.dumps({"dataset": "bench", "images": images}))
    return path


def capstack(*args: str, cwd: Path, show: bool = False, log: TextIO | None = None,
             stages: Path | None = None) -> tuple[float, str]:
    """``capstack ARGS`` as a process of its own in ``cwd`` (this checkout's ``cli.py``): its
    wall time and stdout. ``show``: the command and its output printed (to ``log`` if given,
    with its stderr); ``stages``: ``--workdir cwd -c STAGES`` added. A failure ends the
    benchmark, naming the command."""
    if stages is not None:
        args = (*args, "--workdir", str(cwd), "-c", str(stages))
    shown = log or sys.stdout
    if show:
        print("$ capstack " + " ".join(args), file=shown, flush=True)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], cwd=cwd, text=True,
                          stdout=subprocess.PIPE, stderr=log and subprocess.STDOUT)
    seconds = time.perf_counter() - started
    if show:
        print(done.stdout, end="", file=shown, flush=True)
    if done.returncode != 0:
        raise SystemExit(f"capstack {' '.join(args)}: exited with status {done.returncode}")
    return seconds, done.stdout
