"""Smaller wrongs, each with its repro: a store not reused, a reward of weights 0, an override
dropping keys, a prepare of nothing, a NaN param, a foreach key naming the workdir, two stages
sharing a lock.

Real files and real processes, each ended by a timeout should it hang.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest
import yaml

from pipeline.captions.prepared import load_captions
from pipeline.core.entry import capstack_command
from pipeline.demo.shapes import write_shapes_dataset
from process_helpers import run_capstack, wait_for
from test_hardening import remount, small_disk  # noqa: F401 - the fixture, used by name
from trainer_fixtures import make_prepared, write_experiment, write_feature_store


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("smaller")
    dataset, prepared = make_prepared(root)
    grid = write_feature_store(root / "grid.lmdb", load_captions(prepared).image_ids)
    return root, dataset, prepared, grid


def last_line(result) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


def test_a_complete_store_on_a_read_only_root_is_reused(data, tmp_path, small_disk):
    root, dataset, _, _ = data
    disk = small_disk("features", "20m")
    args = ("extract-grid", dataset, dataset.parent, "--backbone", "resnet18", "--weights",
            "random", "--image-size", "64", "--grid", "2", "--workers", "0", "--features-root",
            disk, "--pointer")
    assert run_capstack(*args, "first.json", cwd=tmp_path).returncode == 0
    remount(disk, "ro")
    reused = run_capstack(*args, "grid.json", cwd=tmp_path)  # another user: recorded, once
    assert reused.returncode == 0, reused.stderr  # was: users.json: cannot write it ...
    store = next(disk.glob("grid-*.lmdb"))
    assert f"reusing store {store}" in reused.stdout
    assert f"{store}.users.json: this use of the store goes unrecorded (Read-only file " \
        f"system)" in reused.stderr
    assert json.loads((tmp_path / "grid.json").read_text())["store"] == str(store)


def test_a_reward_mix_of_weights_0_is_refused(data, tmp_path):
    _, _, prepared, grid = data
    mix = {"name": "mix", "parts": [{"name": "bleu", "weight": 0},
                                     {"name": "bleu", "n": 2, "weight": 0.0}]}
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=1,
                           objective={"name": "scst", "reward": mix})
    result = run_capstack("train", exp, "--out", "run", cwd=tmp_path)
    assert result.returncode == 1  # was: a training at loss 0
    assert last_line(result) == (
        f"Error: {exp}: objective.reward.parts: every weight is 0, so every caption would score "
        f"0 and nothing be learnt; give at least one part a weight above 0")
    assert not (tmp_path / "run").exists()


def test_a_mapping_given_to_set_is_laid_over_the_files_section(data, tmp_path):
    _, _, prepared, grid = data
    exp = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                           features=[grid], epochs=2, batch_size=3)
    result = run_capstack("train", exp, "--out", "run", "--set", "train={epochs: 1}",
                          "--set", "decoder={hidden: 16}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["train"]["epochs"] == 1  # given
    assert config["train"]["lr"] == 5e-3 and config["train"]["batch_size"] == 3  # was: dropped
    assert config["decoder"]["hidden"] == 16 and config["decoder"]["embed"] == 32


@pytest.mark.parametrize("case", ["no train images", "an empty vocabulary"])
def test_prepare_refuses_a_dataset_no_training_could_use(tmp_path, case):
    write_shapes_dataset(tmp_path / "shapes", n_train=4, n_val=2, n_test=2, seed=0, size=32)
    dataset = tmp_path / "shapes" / "dataset_shapes.json"
    args = ["--min-count", "1"]
    if case == "no train images":
        data = json.loads(dataset.read_text())
        for image in data["images"]:
            image["split"] = "val" if image["split"] == "train" else image["split"]
        dataset.write_text(json.dumps(data))
        problem = ("no train captions (images by split: train 0, val 6, test 2); the "
                   "vocabulary is chosen from them, and training needs them")
    else:
        args = ["--min-count", "1000"]
        problem = ("the vocabulary is empty: the rule 'capstack' keeps no word of the train "
                   "captions with --min-count 1000 (the most frequent, 'a', occurs ")
    result = run_capstack("prepare", dataset, "prepared", *args, cwd=tmp_path)
    assert result.returncode == 1  # was: 0, and a prepared folder no training could use
    assert last_line(result).startswith(f"Error: {dataset}: {problem}")
    assert not (tmp_path / "prepared").exists()


def write_stages(workdir, stages: dict, params: dict | None = None) -> None:
    (workdir / "stages.yaml").write_text(yaml.safe_dump(
        {**({"params": params} if params else {}), "stages": stages}, sort_keys=False))


def test_a_stage_with_a_nan_param_is_up_to_date_once_run(tmp_path):
    write_stages(tmp_path, {"s": {"cmd": f"{sys.executable} -c \"open('out.txt', 'w')"
                                  f".write('${{x}}')\"", "outs": ["out.txt"]}},
                 params={"x": float("nan")})
    assert run_capstack("run", "s", cwd=tmp_path).returncode == 0
    listing = run_capstack("stages", cwd=tmp_path)
    assert listing.returncode == 0 and "s  up to date" in listing.stdout, listing.stdout
    again = run_capstack("run", "s", cwd=tmp_path)
    assert "Stage 's' is up to date, skipping." in again.stdout, again.stdout


def test_a_foreach_key_or_an_out_naming_the_workdir_is_refused(tmp_path):
    make = f"{sys.executable} -c \"import os; os.makedirs('runs/${{key}}', exist_ok=True)\""
    write_stages(tmp_path, {"t": {"foreach": ["a", ".."],
                                  "do": {"cmd": make, "outs": ["runs/${key}"]}}})
    listing = run_capstack("stages", cwd=tmp_path)
    assert listing.returncode == 1
    assert last_line(listing) == (
        "Error: stages.yaml: stages.t.foreach: key '..': a key names a stage, and may be a path "
        "below the workdir (a/b), never with a '.' or '..' part")
    write_stages(tmp_path, {"u": {"cmd": make.replace("${key}", "x"), "outs": ["runs/.."]}})
    result = run_capstack("run", "u", cwd=tmp_path)
    assert result.returncode == 1
    assert last_line(result) == (f"Error: stages.yaml: stages.u.outs: '.' is the workdir "
                                 f"{tmp_path} itself; an out is a file or a folder inside it")
    assert not (tmp_path / "stages.lock").exists()


def test_stages_whose_keys_differ_by_a_slash_run_at_once(tmp_path):
    """``t@a/b`` and ``t@a--b`` shared one running-lock: each refused while the other ran."""
    (tmp_path / "slow.py").write_text(
        "import os, sys, time\n"
        "out = os.path.join('out', sys.argv[1])\n"
        "os.makedirs(os.path.dirname(out), exist_ok=True)\n"
        "open(out + '.started', 'w').close()\n"
        "time.sleep(4)\n"
        "open(out, 'w').close()\n")
    write_stages(tmp_path, {"t": {"foreach": ["a/b", "a--b"], "do": {
        "cmd": f"{sys.executable} slow.py ${{key}}", "outs": ["out/${key}"]}}})
    first = subprocess.Popen(capstack_command(["run", "t@a/b"]), cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        wait_for(lambda: (tmp_path / "out" / "a" / "b.started").exists(), timeout=60)
        assert not (tmp_path / "out" / "a" / "b").exists()  # t@a/b runs for 4 s more
        second = run_capstack("run", "t@a--b", cwd=tmp_path, timeout=60)
        assert second.returncode == 0, second.stderr  # was: t@a--b is already running
        assert first.wait(60) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
        first.communicate(timeout=60)
