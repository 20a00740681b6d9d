"""Small files that took the machine, written as the repros, kept fixed: YAML aliases expanded
into an error message, a stages file whose vars make millions of words or thousands of stages,
and a graph check that compared every pair of stages.

A repro that would take gigabytes without its fix runs as a child process of this source
tree's ``cli.py`` whose data is limited to 1 GiB (``RLIMIT_DATA``: the libraries it maps do not
count) and whose time is limited too: a regression fails, it does not take the machine.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.captions.prepared import load_captions
from pipeline.core.entry import capstack_command
from trainer_fixtures import make_prepared, write_experiment, write_feature_store

DATA_LIMIT = 1 << 30


def limited(*args, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """``capstack ARGS`` with its data limited to 1 GiB and its time to ``timeout`` s."""
    def limit():
        resource.setrlimit(resource.RLIMIT_DATA, (DATA_LIMIT, DATA_LIMIT))

    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.run(capstack_command([str(a) for a in args]), cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, preexec_fn=limit)


def alias_bomb(levels: int, leaf: str = "lol", width: int = 9) -> str:
    """A flow sequence of ``width ** (levels + 1)`` leaves once its aliases are expanded, in a
    few hundred bytes: each level is the one below it ``width`` times."""
    text = f"&l0 [{', '.join([leaf] * width)}]"
    for level in range(1, levels + 1):
        text = f"&l{level} [{text}, {', '.join([f'*l{level - 1}'] * (width - 1))}]"
    return text


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    root = tmp_path_factory.mktemp("sizes")
    _, prepared = make_prepared(root, n_train=4, n_val=2, n_test=2)
    store = write_feature_store(root / "grid.lmdb", load_captions(prepared).image_ids)
    return write_experiment(root / "exp.yaml", decoder="show_tell", captions=prepared,
                            features=[store], epochs=1)


# -- YAML aliases ----------------------------------------------------------------------------

BOMBS = {"values": (alias_bomb(6), "more than 100000 values once its YAML aliases are "
                                   "expanded"),
         "text": (alias_bomb(4, leaf="x" * 2000), "more than 16 MiB of text once its YAML "
                                                   "aliases are expanded")}


@pytest.mark.parametrize("kind", sorted(BOMBS))
def test_an_alias_bomb_in_an_experiment_or_a_set_value_is_refused_at_once(experiment, tmp_path,
                                                                          kind):
    """425 bytes once made 2.8 GB and 580 MB of stderr; 472 bytes 22 GB."""
    bomb, message = BOMBS[kind]
    file = yaml.safe_load(experiment.read_text())
    text = yaml.safe_dump({k: v for k, v in file.items() if k != "eval"}) + \
        f"eval: {{split: {bomb}}}\n"
    (tmp_path / "bomb.yaml").write_text(text)
    assert len(text) < 30_000
    for args, where in ((("bomb.yaml",), "bomb.yaml"),
                        ((experiment, "--set", f"eval.split={bomb}"), "--set eval.split")):
        result = limited("train", *args, "--out", tmp_path / "run", cwd=tmp_path)
        assert result.returncode == 1, result.stderr[-2000:]
        assert f"{where}: {message}" in result.stderr, result.stderr[-2000:]
        assert len(result.stderr) < 2000
    assert not (tmp_path / "run").exists()


def test_an_alias_bomb_in_an_experiment_manifest_is_refused_at_once(tmp_path):
    (tmp_path / "stages.yaml").write_text(yaml.safe_dump({"stages": {"shapes": {
        "cmd": "capstack shapes data --train 1 --val 1 --test 1", "outs": ["data"]}}}))
    manifest = tmp_path / "exps" / "x" / "experiment.yaml"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(f"name: x\ngroup: x\nroots: [shapes]\nparams: {{seed: {alias_bomb(6)}}}\n")
    result = limited("exp", "list", cwd=tmp_path)
    # never expanded; a damaged manifest, set aside and said, that hides no other experiment
    assert result.returncode == 0, result.stderr
    assert "experiment.yaml: damaged experiment manifest (more than 100000 values once its " \
        "YAML aliases" in result.stderr
    assert not manifest.exists() and manifest.with_name("experiment.yaml.damaged").is_file()


def test_a_value_shown_in_a_message_is_bounded(experiment, tmp_path):
    from pipeline.core.errors import CapstackError
    from trainer.config import load_experiment

    listed = "[" + ", ".join(["'circle'"] * 5000) + "]"
    with pytest.raises(CapstackError) as refused:
        load_experiment(experiment, [f"eval.split={listed}"])
    assert "eval.split: expected one of train, val, test, got ['circle', " in str(refused.value)
    assert len(str(refused.value)) < 1000


# -- a stages file's vars and foreach --------------------------------------------------------

def stages_with_vars(path: Path, keys: int, cmd: str, foreach: list | None = None) -> Path:
    body: dict = {"cmd": cmd, "outs": ["out/${key}" if foreach else "out"]}
    stage = {"foreach": foreach, "do": body} if foreach else body
    path.write_text(yaml.safe_dump({"vars": {"v": [f"k{i}" for i in range(keys)],
                                             "w": [f"j{i}" for i in range(keys)]},
                                    "stages": {"s": stage}}))
    return path


def test_vars_that_would_make_millions_of_words_or_stages_are_refused_at_once(tmp_path):
    """1.6 KB once made one command of 2.56 M words; 2.1 KB 10,000 stages (16 s)."""
    words = stages_with_vars(tmp_path / "words.yaml", 40,
                             "capstack shapes data/${v}${v}${v}${v} --train 1")
    stages = stages_with_vars(tmp_path / "stages.yaml", 100,
                              "capstack shapes out/${key} --train 1", foreach=["${v}-${w}"])
    assert words.stat().st_size < 2000 and stages.stat().st_size < 3000
    started = time.perf_counter()
    result = limited("stages", "-c", words, cwd=tmp_path, timeout=60)
    assert result.returncode == 1
    assert "stages.s.cmd: its vars make it more than 100000 words" in result.stderr
    result = limited("stages", "-c", stages, cwd=tmp_path, timeout=60)
    assert result.returncode == 1
    assert "stages.s: makes the file's stages more than 2000" in result.stderr
    assert time.perf_counter() - started < 60


def load_seconds(path: Path) -> float:
    """The best of three loads of a stages file, in a fresh process each (no cache)."""
    code = ("import sys, time, cli; from pipeline.engine.stagefile import load_stages_file; "
            "t = time.perf_counter(); load_stages_file(sys.argv[1], cli.stage_commands()); "
            "print(time.perf_counter() - t)")
    root = Path(__file__).resolve().parents[1]
    return min(float(subprocess.run([sys.executable, "-c", code, str(path)], cwd=root,
                                    capture_output=True, text=True, check=True,
                                    timeout=120).stdout) for _ in range(3))


def test_the_graph_of_a_stages_file_is_checked_in_n_log_n(tmp_path):
    """Checking that no two outs overlap, and finding each stage's upstream, compared every
    pair of stages: 2,000 stages took 57 times as long as 250, where 8 is linear."""
    sizes = {}
    for n in (250, 2000):
        path = tmp_path / f"stages{n}.yaml"
        path.write_text(yaml.safe_dump({"vars": {"v": [f"k{i}" for i in range(n)]}, "stages": {
            "s": {"foreach": "${v}", "do": {"cmd": "capstack shapes data/${key} --train 1",
                                            "deps": ["in/${key}.json"],
                                            "outs": ["data/${key}"]}}}}))
        sizes[n] = load_seconds(path)
    assert sizes[2000] < 25 * sizes[250], sizes


def test_an_alias_bomb_in_a_hand_edited_lock_is_shown_in_bounded_words(tmp_path):
    (tmp_path / "stages.yaml").write_text(yaml.safe_dump({"stages": {"shapes": {
        "cmd": "capstack shapes data --train ${x} --val 1 --test 1", "params": {"x": 1},
        "outs": ["data"]}}}))
    (tmp_path / "stages.lock").write_text(
        "schema: 1\nstages:\n  shapes:\n    cmd: capstack shapes data --train ${x} --val 1 "
        f"--test 1\n    params: {{x: {alias_bomb(6)}}}\n    deps: {{}}\n    outs: {{}}\n")
    result = limited("stages", cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "param x [[[" in result.stdout and "-> 1" in result.stdout
    assert len(result.stdout) < 2000
