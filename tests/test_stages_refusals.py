"""The stage engine's refusals of hostile or careless stages files, locks and working folders:
modules planted in the working folder, YAML alias bombs, duplicate stages, damaged locks and
hash caches, outputs outside the workdir, vars and foreach that grow without bound."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.core.entry import capstack_command
from pipeline.demo.shapes import write_shapes_dataset
from pipeline.features.stores import open_store
from process_helpers import alias_bomb, capstack, last_line, limited, run_capstack, wait_for


PLANTED = 'open("PWNED", "w").write("ran")\n'


def plant_modules(folder: Path) -> None:
    """Modules capstack imports by name, planted where a careless user works."""
    for name in ("click.py", "cli.py", "yaml.py"):
        (folder / name).write_text(PLANTED)


def test_a_stage_never_runs_modules_lying_in_the_working_folder(tmp_path):
    (tmp_path / "stages.yaml").write_text(yaml.safe_dump({"stages": {"shapes": {
        "cmd": "capstack shapes data/shapes --train 4 --val 2 --test 2 --size 32",
        "outs": ["data/shapes"]}}}))
    plant_modules(tmp_path)
    result = capstack("run", "shapes", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "data/shapes/dataset_shapes.json").is_file()
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.slow
def test_torchrun_processes_never_run_modules_lying_in_the_working_folder(tmp_path):
    write_shapes_dataset(tmp_path / "shapes", n_train=4, n_val=1, n_test=1, seed=0, size=32)
    plant_modules(tmp_path)
    result = capstack("extract-grid", "shapes/dataset_shapes.json", "shapes", "--backbone",
                      "resnet18", "--weights", "random", "--image-size", "64", "--grid", "2",
                      "--workers", "0", "--features-root", "features", "--nproc", "2",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "features").glob("grid-resnet18-*.lmdb"))
    assert not (tmp_path / "PWNED").exists()


def test_a_yaml_alias_bomb_in_a_stages_file_is_refused_at_once(tmp_path):
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [
        f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 10)}]" for k in range(1, 9)]
    (tmp_path / "stages.yaml").write_text("\n".join(levels) + "\nstages:\n  s:\n    foreach: *a8\n"
                                          "    do: {cmd: capstack shapes out}\n")
    started = time.perf_counter()
    result = capstack("stages", cwd=tmp_path)
    assert time.perf_counter() - started < 30 and len(result.stderr) < 1000
    assert result.returncode == 1 and "more than 100000 values once its YAML aliases are " \
        "expanded" in result.stderr, result.stderr[:500]


def test_a_stage_declared_twice_or_a_non_utf8_stages_file_is_named(tmp_path):
    stage = "  s:\n    cmd: capstack shapes out\n    outs: [out]\n"
    (tmp_path / "stages.yaml").write_text("stages:\n" + stage + stage)
    result = capstack("stages", cwd=tmp_path)
    assert result.returncode == 1 and "the key 's' appears twice" in result.stderr, result.stderr
    (tmp_path / "stages.yaml").write_bytes(b"stages:\n  s:\n    cmd: capstack shapes caf\xe9\n")
    result = capstack("stages", cwd=tmp_path)
    assert result.returncode == 1 and "stages.yaml: not UTF-8 text (byte 41 is 0xe9)" in \
        result.stderr, result.stderr


def test_a_damaged_lock_file_or_hash_cache_is_set_aside_and_said(tmp_path):
    (tmp_path / "stages.yaml").write_text(yaml.safe_dump({"stages": {"shapes": {
        "cmd": "capstack shapes data/shapes --train 4 --val 2 --test 2 --size 32",
        "outs": ["data/shapes"]}}}))
    assert capstack("run", "shapes", cwd=tmp_path).returncode == 0
    lock, cache = tmp_path / "stages.lock", tmp_path / ".capstack" / "hashes.sqlite"
    damaged_lock = b"stages: {shapes: [unclosed\n\xff"
    lock.write_bytes(damaged_lock)
    cache.write_bytes(b"not a database, just bytes" * 100)
    result = capstack("stages", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "stages.lock: damaged lock file (not UTF-8 text); moved to" in result.stderr
    assert "hashes.sqlite: damaged hash cache" in result.stderr and "rebuilt" in result.stderr
    assert (tmp_path / "stages.lock.damaged").read_bytes() == damaged_lock  # nothing lost
    assert "never run" in result.stdout
    again = capstack("run", "shapes", cwd=tmp_path)
    assert again.returncode == 0 and "Running stage 'shapes'" in again.stdout, again.stderr
    assert "up to date" in capstack("stages", cwd=tmp_path).stdout


def test_a_deleted_shared_store_makes_its_stage_stale_and_the_rerun_extracts_it(tmp_path):
    import shutil

    from test_feature_stages import STAGES

    data = tmp_path / "shapes"
    write_shapes_dataset(data, n_train=4, n_val=1, n_test=1, seed=2, size=32)
    (tmp_path / "stages.yaml").write_text(STAGES.format(data=data, root=tmp_path / "root"))
    assert capstack("run", "extract_grid", cwd=tmp_path).returncode == 0
    store = Path(json.loads((tmp_path / "features/grid.json").read_text())["store"])
    shutil.rmtree(store)  # another experiment's owner cleaned the shared root
    listing = capstack("stages", cwd=tmp_path)
    assert f"out features/grid.json points to {store}, which is gone" in listing.stdout, \
        listing.stdout
    rerun = capstack("run", "extract_grid", cwd=tmp_path)
    assert rerun.returncode == 0 and "extracted 6 images" in rerun.stdout, rerun.stderr
    assert len(open_store(store)) == 6


@pytest.mark.parametrize("out", ["../elsewhere", "/tmp/capstack-outside-{name}"])
def test_an_out_outside_the_workdir_is_refused_unless_the_user_opts_in(tmp_path, out):
    out = out.format(name=tmp_path.name)
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "stages.yaml").write_text(yaml.safe_dump({"stages": {"shapes": {
        "cmd": f"capstack shapes {out} --train 2 --val 1 --test 1 --size 32", "outs": [out]}}}))
    written = (workdir / out).resolve()
    refused = capstack("run", "shapes", cwd=workdir)
    assert refused.returncode == 1 and f"stages.shapes.outs: '{out}' is outside the workdir " \
        f"{workdir}" in refused.stderr and "--outs-outside-workdir" in refused.stderr
    assert not written.exists()
    try:
        allowed = capstack("run", "shapes", "--outs-outside-workdir", cwd=workdir)
        assert allowed.returncode == 0, allowed.stderr
        assert (written / "dataset_shapes.json").is_file()
    finally:
        import shutil
        shutil.rmtree(written, ignore_errors=True)


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
