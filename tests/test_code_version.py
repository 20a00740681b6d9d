"""A stage's code version on real source: a copy of capstack, a real training stage, real edits.

No function is replaced: the copied ``cli.py`` runs the copied packages (a script's own folder
comes first on ``sys.path``), so editing a file of the copy is what a researcher editing
capstack does.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.engine.codeversion import code_digest, code_files
from trainer_fixtures import prepared_with_grid, write_experiment

REPO = Path(__file__).resolve().parents[1]
STAGES = """
stages:
  train:
    cmd: capstack train exp.yaml --out runs/exp
    deps: [exp.yaml]
    outs: [runs/exp]
"""
# (file of the copy, text there, an edit of its executable code): one per plug point
EDITS = [
    ("trainer/decoders/top_down.py", "dropout: float = 0.5", "dropout: float = 0.3"),
    ("trainer/rewards/bleu.py", "TINY, SMALL = 1e-15, 1e-9", "TINY, SMALL = 1e-14, 1e-9"),
    ("trainer/optimizers/adamax.py", "weight_decay=config.weight_decay)",
     "weight_decay=2 * config.weight_decay)"),
    ("trainer/objectives/c2f.py", "coarse_term: bool = False", "coarse_term: bool = True"),
]


def capstack_copy(root: Path) -> Path:
    """capstack's packages and command script copied under ``root``; the script's path."""
    for package in ("pipeline", "trainer"):
        shutil.copytree(REPO / package, root / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "cli.py", root / "cli.py")
    return root / "cli.py"


def run(script: Path, workdir: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, str(script), *args, "-c", str(workdir / "stages.yaml"),
                           "--workdir", str(workdir)], cwd=workdir,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def train_status(script: Path, workdir: Path) -> tuple[str, list[str]]:
    status = json.loads(run(script, workdir, "stages", "--json"))["train"]
    return status["state"], status["reasons"]


def trained_in_a_copy(root: Path) -> tuple[Path, Path]:
    """(a copy of capstack's cli.py under ``root``, a workdir whose ``train`` stage, a show_tell
    run of one epoch, ran once with that copy)."""
    script = capstack_copy(root)
    work = root / "work"
    prepared, grid = prepared_with_grid(work)
    write_experiment(work / "exp.yaml", decoder="show_tell", captions=prepared,
                     features=[grid], epochs=1)
    (work / "stages.yaml").write_text(STAGES)
    out = run(script, work, "run", "train")
    assert "Running stage 'train'" in out
    return script, work


@pytest.fixture(scope="module")
def trained_copy(tmp_path_factory):
    return trained_in_a_copy(tmp_path_factory.mktemp("copy"))


@pytest.mark.slow  # a copy of capstack, a real training stage, a capstack process per status
def test_the_copy_runs_its_own_code(trained_copy):
    script, work = trained_copy
    lock = (work / "stages.lock").read_text()
    assert "trainer/decoders/top_down.py" in lock  # a decoder the run did not train on
    assert str(REPO) not in lock


@pytest.mark.slow
@pytest.mark.parametrize("relative, before, after", EDITS, ids=[e[0] for e in EDITS])
def test_editing_a_plug_in_turns_the_stage_stale_and_names_it(trained_copy, relative, before,
                                                               after):
    script, work = trained_copy
    path = script.parent / relative
    original = path.read_text()
    assert original.count(before) == 1
    assert train_status(script, work) == ("up to date", [])
    try:
        path.write_text(original.replace(before, after))
        state, reasons = train_status(script, work)
        assert state == "stale" and reasons == [f"code changed: {relative}"]
    finally:
        path.write_text(original)
    assert train_status(script, work) == ("up to date", [])


@pytest.mark.slow
def test_comments_and_docstrings_leave_the_stage_up_to_date(trained_copy):
    script, work = trained_copy
    path = script.parent / "trainer/decoders/top_down.py"
    original = path.read_text()
    try:
        path.write_text(original.replace('"""', '"""Reworded. ', 1)
                        .replace("dropout: float = 0.5", "dropout: float = 0.5  # a note")
                        + "\n# a trailing comment\n")
        assert train_status(script, work) == ("up to date", [])
    finally:
        path.write_text(original)


def test_code_digest_ignores_comments_and_docstrings_only(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('"""Doc."""\n\n\ndef f(x):\n    """Twice."""\n    return 2 * x\n')
    digest = code_digest(path)
    path.write_text('"""Other doc."""\n# a comment\ndef f(x):  # why\n    return 2 * x\n')
    assert code_digest(path) == digest
    path.write_text('"""Doc."""\ndef f(x):\n    return 3 * x\n')
    assert code_digest(path) != digest
    path.write_text('def f(x):\n    return "a string that is no docstring"\n')
    other = code_digest(path)
    path.write_text('def f(x):\n    return "another string"\n')
    assert code_digest(path) != other
    path.write_text("def f(:\n")  # does not parse: still a version of its own
    assert len(code_digest(path)) == 32


def test_a_plug_package_brings_every_module_in_its_folder(tmp_path):
    pkg = tmp_path / "pipeline"
    (pkg / "plugs").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "user.py").write_text("from pipeline.plugs import REGISTRY\n")
    (pkg / "plugs" / "__init__.py").write_text(
        "from pipeline.core.registry import import_modules\nREGISTRY = {}\n"
        "import_modules(__name__, __path__)\n")
    (pkg / "plugs" / "one.py").write_text("")
    (pkg / "plugs" / "two.py").write_text("")
    (pkg / "loose.py").write_text("")
    files = {str(p.relative_to(tmp_path)) for p in code_files("pipeline.user", tmp_path)}
    assert files == {"pipeline/__init__.py", "pipeline/user.py", "pipeline/plugs/__init__.py",
                     "pipeline/plugs/one.py", "pipeline/plugs/two.py"}


@pytest.mark.slow  # a copy of capstack of its own (it is edited), two real trainings
def test_a_stage_stale_by_an_edit_of_its_decoder_trains_afresh(tmp_path):
    """The edit of a decoder the run trains, then `capstack run`: a training that trains (not
    the finished run resumed, "already complete"), the old run kept beside it."""
    import torch

    script, work = trained_in_a_copy(tmp_path)
    decoder = script.parent / "trainer/decoders/show_tell.py"
    decoder.write_text(decoder.read_text().replace("dropout: float = 0.5", "dropout: float = 0.1"))
    assert train_status(script, work) == ("stale", ["code changed: trainer/decoders/show_tell.py"])
    out = run(script, work, "run", "train")
    assert "runs/exp set aside as runs/exp.old" in out
    assert "train exp: 1 epochs" in out and "already complete" not in out
    new, old = (torch.load(work / f"runs/{name}/best.pt", weights_only=False)
                for name in ("exp", "exp.old"))
    assert new["experiment"]["decoder"]["dropout"] == 0.1
    assert old["experiment"]["decoder"]["dropout"] == 0.5
    assert any(not torch.equal(new["model"][k], old["model"][k]) for k in new["model"])
    assert train_status(script, work) == ("up to date", [])
    forced = run(script, work, "run", "train", "--force")
    assert "runs/exp set aside as runs/exp.old.2" in forced
    assert "train exp: 1 epochs" in forced and "already complete" not in forced
