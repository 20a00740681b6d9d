"""capstack under torchrun, gloo on this CPU: DDP training as one process would, one merged store.

Every multi-process run here is a real ``torchrun`` (two processes, or two
one-process "nodes" meeting at 127.0.0.1); the one-process references run in
this test process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.captions.prepared import load_captions
from pipeline.core.ranks import Ranks
from pipeline.engine.torchrun import without_option
from pipeline.features.extract.kinds.grid import GridSettings, extract_grid
from pipeline.features.stores import open_store
from process_helpers import committed_records, wait_for
from trainer.config import load_experiment
from trainer.rewards.cider_cache import build_cache
from trainer.train import train
from trainer_fixtures import cider_d, make_prepared, write_experiment, write_feature_store

LAUNCH_TIMEOUT = 240


def capstack_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "cli", *map(str, args)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def step_lines(run_dir: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if x["kind"] == "train"]


def assert_same_steps(got: list[dict], expected: list[dict], keys=("loss",)) -> None:
    assert [x["step"] for x in got] == [x["step"] for x in expected]
    for key in keys:
        np.testing.assert_allclose([x[key] for x in got], [x[key] for x in expected], rtol=1e-5,
                                   atol=1e-6, err_msg=key)


def test_a_rank_share_covers_the_batch_once_in_rank_order():
    for n in range(0, 9):
        parts = [list(range(n))[Ranks(r, 3).share(n)] for r in range(3)]
        assert sum(parts, []) == list(range(n)) and max(map(len, parts)) - min(map(len, parts)) <= 1
    assert without_option(["train", "x.yaml", "--nproc", "2", "--out", "r"], "--nproc") == \
        ["train", "x.yaml", "--out", "r"]
    assert without_option(["train", "--nproc=2"], "--nproc") == ["train"]


# --------------------------------------------------------------------------- training

@pytest.fixture(scope="module")
def ddp_data(tmp_path_factory):
    """13 training images in batches of 6: global batches of 6, 6 and 1 (the last leaves a
    rank of two without an image). Dropout off: the one thing ranks draw on their own."""
    root = tmp_path_factory.mktemp("ddp")
    _, prepared = make_prepared(root, n_train=13, n_val=5)
    write_feature_store(root / "grid.lmdb", load_captions(prepared).image_ids)
    build_cache(prepared, "train", root / "cider.npz")
    return root, experiment_without_dropout(root, "top_down", root)


def experiment_without_dropout(root: Path, decoder: str, folder: Path) -> Path:
    """``decoder`` on the data under ``root``, its yaml in ``folder``."""
    exp = write_experiment(folder / f"{decoder}.yaml", decoder=decoder, captions=root / "prepared",
                           features=[root / "grid.lmdb"], epochs=2, batch_size=6, log_every=1)
    text = exp.read_text().replace("att_hidden: 16", "att_hidden: 16\n  dropout: 0.0")
    exp.write_text(text)
    assert "dropout: 0.0" in text
    return exp


@pytest.mark.slow
def test_two_nodes_train_as_one_process_does_and_their_run_resumes_on_one(ddp_data, tmp_path):
    """Two torchrun launchers (--nnodes 2, one process each) train the first epoch; one
    process resumes their checkpoint for the second: every step's loss equals the
    uninterrupted one-process run's."""
    root, exp = ddp_data
    train(load_experiment(exp), tmp_path / "one", progress=False)
    port = free_port()
    launchers = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}",
         "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}",
         "-m", "cli", "train", str(exp), "--out", str(tmp_path / "two"), "--set", "train.epochs=1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})  # two "machines" share this one's 2 cores
        for node in (0, 1)]
    outputs = [p.communicate(timeout=LAUNCH_TIMEOUT)[0] for p in launchers]
    assert [p.returncode for p in launchers] == [0, 0], outputs
    resumed = train(load_experiment(exp), tmp_path / "two", progress=False)
    assert resumed.resumed_at == (1, 0)
    assert_same_steps(step_lines(tmp_path / "two"), step_lines(tmp_path / "one"), ("loss", "xe"))
    assert len(step_lines(tmp_path / "one")) == 6  # 3 batches x 2 epochs, each logged


@pytest.mark.slow
@pytest.mark.parametrize("objective, decoder", [("scst", "top_down"), ("c2f", "stack_cap")])
def test_rl_on_two_processes_samples_and_learns_as_one_process(ddp_data, tmp_path, objective,
                                                                decoder):
    """``--nproc 2``: the same sampled captions (the draws follow the image, not the rank),
    rewards on each rank for its own samples, the same losses step by step."""
    root, _ = ddp_data
    exp = experiment_without_dropout(root, decoder, tmp_path)
    train(load_experiment(exp, ["train.epochs=1"]), tmp_path / "xe", progress=False)
    rl = [f"objective.name={objective}", f"train.init_from={tmp_path / 'xe' / 'best.pt'}",
          *cider_d(root / 'cider.npz'), "train.epochs=1", "objective.samples=3",
          "train.lr=1e-3"]
    train(load_experiment(exp, rl), tmp_path / "one", progress=False)
    sets = [word for item in rl for word in ("--set", item)]
    done = subprocess.run(capstack_cmd("train", exp, "--out", tmp_path / "two", "--nproc", 2,
                                       *sets), capture_output=True, text=True,
                          timeout=LAUNCH_TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "best val CIDEr" in done.stdout and done.stdout.count("best val CIDEr") == 1
    epoch_lines = [line for line in done.stdout.splitlines() if line.startswith("epoch ")]
    assert len(epoch_lines) == 1 and epoch_lines[0].startswith("epoch 1/1  loss ")  # rank 0's
    assert_same_steps(step_lines(tmp_path / "two"), step_lines(tmp_path / "one"),
                      ("loss", "reward", "baseline"))
    val = [[json.loads(x)["cider"] for x in (tmp_path / d / "metrics.jsonl").read_text()
            .splitlines() if '"val"' in x] for d in ("one", "two")]
    np.testing.assert_allclose(val[0], val[1], atol=1e-9)  # validation split, then gathered


@pytest.mark.slow
def test_hacaps_adversarial_phase_on_two_processes_trains_as_one_process(ddp_data, tmp_path):
    """Adversarial batches (rollouts ranked over the global batch), D's rounds on global sets
    and an ML interlude: the same losses and D losses step by step on 1 and 2 processes."""
    root, _ = ddp_data
    exp = experiment_without_dropout(root, "hacap", tmp_path)
    train(load_experiment(exp, ["train.epochs=1"]), tmp_path / "ml", progress=False)
    adversarial = ["objective.name=adversarial", f"train.init_from={tmp_path / 'ml' / 'best.pt'}",
                   "train.epochs=2", "objective.ml_every=3",
                   "objective.discriminator={sets: 1, epochs: 1, batch_size: 8, heldout_images: 4}",
                   "objective.ml_batches=1", "objective.rollouts=2", "train.lr=1e-3"]
    train(load_experiment(exp, adversarial), tmp_path / "one", progress=False)
    sets = [word for item in adversarial for word in ("--set", item)]
    done = subprocess.run(capstack_cmd("train", exp, "--out", tmp_path / "two", "--nproc", 2,
                                       *sets), capture_output=True, text=True,
                          timeout=LAUNCH_TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    one, two = step_lines(tmp_path / "one"), step_lines(tmp_path / "two")
    assert_same_steps(two, one, ("loss",))
    for key in ("d_loss", "intrinsic", "xe"):
        got, expected = ([x.get(key, 0.0) for x in lines] for lines in (two, one))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=key)
    assert {"d_loss", "intrinsic", "xe"} <= {k for x in one for k in x}  # every phase ran
    rounds = [[(x["round"], x["step"], x["heldout_accuracy"], x["d_loss"]) for x in map(
        json.loads, (run / "metrics.jsonl").read_text().splitlines())
        if x["kind"] == "discriminator"] for run in (tmp_path / "one", tmp_path / "two")]
    assert rounds[0] and [r[:3] for r in rounds[1]] == [r[:3] for r in rounds[0]]
    np.testing.assert_allclose([r[3] for r in rounds[1]], [r[3] for r in rounds[0]], rtol=1e-5)


DECODER_LOOP = """
import faulthandler
import sys
import torch.distributed as dist
from trainer.config import load_experiment
from trainer.train import train
dist.init_process_group("gloo")
for exp, out in zip(sys.argv[1::2], sys.argv[2::2]):
    train(load_experiment(exp), out, progress=False)
    assert faulthandler.is_enabled()  # a rank that aborts in C++ says where its Python was
dist.destroy_process_group()
"""


def objective_settings(cache: Path) -> dict[str, list[dict | None]]:
    """Every registered objective as a DDP check runs it: small, and each setting that
    changes which parameters its loss reaches (C2F's coarse term)."""
    reward = {"name": "cider-d", "cache": str(cache)}
    rounds = {"sets": 1, "epochs": 1, "batch_size": 8, "heldout_images": 4}
    return {"xe": [None],
            "scst": [{"name": "scst", "reward": reward, "samples": 2}],
            "c2f": [{"name": "c2f", "reward": reward, "samples": 2, "coarse_term": coarse}
                    for coarse in (False, True)],
            "interleaved_pretraining": [{"name": "interleaved_pretraining",
                                         "discriminator": rounds}],
            "adversarial": [{"name": "adversarial", "rollouts": 2, "ml_every": 2,
                             "ml_batches": 1, "discriminator": rounds}]}


def shipped(registry) -> list[str]:
    """The names of a registry's components that capstack ships (tests register toys too)."""
    return sorted(name for name in registry
                  if registry.get(name).__module__.startswith(("trainer.", "pipeline.")))


@pytest.mark.slow
def test_every_objective_trains_every_decoder_it_takes_under_ddp(ddp_data, tmp_path):
    """An epoch of each registered objective on each decoder it accepts, on two processes (one
    torchrun launch): DDP looks for unused parameters exactly where the objective says its
    loss leaves some out, and refuses a step otherwise; a rank's part of one image trains
    too (show_tell's batch norm)."""
    from trainer.decoders import DECODERS
    from trainer.objectives import OBJECTIVES

    root, exp = ddp_data
    settings = objective_settings(root / "cider.npz")
    objectives, decoders = shipped(OBJECTIVES), shipped(DECODERS)
    assert set(settings) == set(objectives)  # a new objective gets its DDP check here
    args, runs = [], []
    for objective in objectives:
        for decoder in decoders:
            if not issubclass(DECODERS.get(decoder), OBJECTIVES.get(objective).decoder_type):
                continue
            for k, setting in enumerate(settings[objective]):
                name = f"{objective}-{decoder}-{k}"
                path = write_experiment(tmp_path / f"{name}.yaml", decoder=decoder,
                                        captions=root / "prepared",
                                        features=[root / "grid.lmdb"], epochs=1,
                                        batch_size=6, objective=setting)
                args += [str(path), str(tmp_path / "runs" / name)]
                runs.append(name)
    assert len(runs) > len(decoders) + 2  # xe on each, and more
    (tmp_path / "loop.py").write_text(DECODER_LOOP)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", str(tmp_path / "loop.py"), *args],
                          capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-12000:]
    assert "find_unused_parameters=True was specified" not in done.stderr  # none looked in vain
    for name in runs:
        assert (tmp_path / "runs" / name / "best.pt").is_file(), name


# --------------------------------------------------------------------------- extraction

GRID = ["--backbone", "resnet18", "--weights", "random", "--grid", "2", "--workers", "0"]


SHAPES = dict(n_train=36, n_val=2, n_test=2, seed=4)  # conftest's shapes


def one_process_store(shapes, root: Path, image_size: int, batch: int) -> Path:
    """The store one process makes, on one thread as each torchrun process runs (OMP_NUM_THREADS=1):
    a convolution's sums are split differently over 2 threads, which moves the last bit."""
    image_root, dataset = shapes
    settings = GridSettings("resnet18", "random", image_size, 2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return extract_grid(dataset, image_root, settings, root=root, batch_size=batch,
                            workers=0, progress=False).store
    finally:
        torch.set_num_threads(threads)


def assert_same_store(got: Path, expected: Path) -> None:
    a, b = open_store(got), open_store(expected)
    assert a.meta["fingerprint"] == b.meta["fingerprint"] and a.meta["count"] == b.meta["count"]
    assert list(a.ids()) == list(b.ids())  # the one-process order, too
    for i in b.ids():
        ra, rb = a.get(i), b.get(i)
        np.testing.assert_array_equal(ra.features, rb.features)
        assert (ra.height, ra.width) == (rb.height, rb.width)


@pytest.mark.slow
def test_two_process_extraction_makes_the_one_process_store(shapes, tmp_path):
    image_root, dataset = shapes
    expected = one_process_store(shapes, tmp_path / "one", 64, 2)
    done = subprocess.run(capstack_cmd("extract-grid", dataset, image_root, *GRID,
                                       "--image-size", 64, "--batch", 2, "--nproc", 2,
                                       "--features-root", tmp_path / "two",
                                       "--pointer", tmp_path / "grid.json"),
                          capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "merged 2 shards" in done.stdout and "extracted 40 images" in done.stdout
    merged = tmp_path / "two" / expected.name  # the same name: the same fingerprint
    assert_same_store(merged, expected)
    assert not list((tmp_path / "two").glob("*shard*"))
    assert json.loads((tmp_path / "grid.json").read_text())["store"] == str(merged)


def _pid_of_rank(tag: str, rank: int) -> int | None:
    """The process of a torchrun job (tagged in its environment) that is rank ``rank``."""
    wanted = {f"CAPSTACK_TEST_TAG={tag}".encode(), f"RANK={rank}".encode()}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                env = set((entry / "environ").read_bytes().split(b"\0"))
            except OSError:
                continue
            if wanted <= env:
                return int(entry.name)
    return None


@pytest.mark.slow
def test_a_killed_rank_leaves_its_shard_and_the_rerun_completes_the_store(shapes, tmp_path):
    """SIGKILL rank 1 mid-shard: torchrun stops the job, rank 1's shard stays partial; the
    same command again resumes every shard and merges: nothing lost, nothing twice."""
    image_root, dataset = shapes
    root, tag = tmp_path / "features", uuid.uuid4().hex
    cmd = capstack_cmd("extract-grid", dataset, image_root, *GRID, "--image-size", 192,
                       "--batch", 1, "--nproc", 2, "--features-root", root)
    with open(tmp_path / "log.txt", "w") as log:
        job = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "CAPSTACK_TEST_TAG": tag})
        shard = wait_for(lambda: next(root.glob("*.shard-1-of-2.lmdb.partial"), None),
                         LAUNCH_TIMEOUT)
        wait_for(lambda: committed_records(shard) >= 2)
        os.kill(wait_for(lambda: _pid_of_rank(tag, 1)), signal.SIGKILL)
        assert job.wait(LAUNCH_TIMEOUT) != 0
    kept = committed_records(shard)
    assert 2 <= kept < 20, kept  # rank 1 holds 20 of the 40 images
    assert not [p for p in root.glob("grid-*.lmdb") if "shard" not in p.name]
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "merged 2 shards" in rerun.stdout
    extracted = int(rerun.stdout.split("extracted ")[1].split()[0])
    assert extracted <= 40 - kept  # the kept records were not extracted again
    expected = one_process_store(shapes, tmp_path / "one", 192, 1)
    assert_same_store(root / expected.name, expected)
    assert not list(root.glob("*shard*"))
