"""docs/api.md runs as it is written: its python blocks, in order, in one namespace.

The page is written against the demo's outputs (``data/features/grid.json``,
``data/features/regions.json``, ``data/prepared``, ``runs/top_down``). This test
makes small stand-ins of them in a tmp dir: a tiny shapes dataset prepared as
``capstack prepare`` prepares it, stores of the demo's shapes (7x7 grid of 512-d,
regions of 256-d with boxes) in a features root of their own with pointers to
them, the repository's ``configs/experiments/top_down.yaml``, and a one-epoch
``runs/top_down`` trained by ``trainer.train.train``. Then it runs the page there.
"""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

from pipeline.captions.prepared import load_captions
from pipeline.core.pointer import write_pointer
from trainer.config import load_experiment
from trainer.train import train
from trainer_fixtures import make_prepared, write_feature_store

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "api.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.M | re.S)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line of the block's first code line, code) of every ```python block, in order."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in BLOCK.finditer(text)]


def demo_outputs(workdir: Path, root: Path) -> None:
    """What the page reads of `make demo`, small, under ``workdir``; the stores under ``root``."""
    data = workdir / "data"
    _, prepared = make_prepared(data, n_train=4, n_val=4, n_test=4)  # data/shapes, data/prepared
    ids = load_captions(prepared).image_ids
    root.mkdir()
    grid = write_feature_store(root / "grid-resnet10-0123456789abcdef.lmdb", ids, kind="grid",
                               rows=49, dim=512, fingerprint="0123456789abcdef")
    regions = write_feature_store(root / "regions-bottom-up-r14-fedcba9876543210.lmdb", ids,
                                  kind="regions", dim=256, seed=1, fingerprint="fedcba9876543210")
    write_pointer(data / "features" / "grid.json", grid, "0123456789abcdef")
    write_pointer(data / "features" / "regions.json", regions, "fedcba9876543210")
    experiments = workdir / "configs" / "experiments"
    experiments.mkdir(parents=True)
    shutil.copy(REPO / "configs" / "experiments" / "top_down.yaml", experiments)
    small = ["decoder.embed=16", "decoder.hidden=16", "decoder.att_hidden=16",
             "decoder.feature_embed=16", "data.seq_per_img=2", "train.epochs=1",
             "train.batch_size=6", "train.device=cpu", "eval.beam_size=2"]
    train(load_experiment(experiments / "top_down.yaml", small), "runs/top_down", progress=False)


def test_the_page_runs_as_written(tmp_path, monkeypatch):
    workdir, root = tmp_path / "capstack", tmp_path / "features"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("CAPSTACK_FEATURES", str(root))
    demo_outputs(workdir, root)

    blocks = python_blocks(PAGE.read_text())
    assert len(blocks) >= 7, "docs/api.md: expected its python blocks"
    namespace = {"__name__": "docs_api"}
    for line, code in blocks:
        # blank lines first, so a traceback names the page's own line numbers
        exec(compile("\n" * (line - 1) + code, str(PAGE), "exec"), namespace)

    losses = namespace["losses"]
    assert len(losses) == namespace["max_steps"] and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]
    assert namespace["by_beam"].tokens.shape[0] == 4
    assert [p.image_id for p in namespace["predictions"]] == namespace["test_ids"]
