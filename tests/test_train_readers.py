"""data.readers: training batches made by reader processes are the batches the trainer's own
thread makes, in the same order, and a run's losses (resumed or not) do not change with them."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal

import pytest
import torch

from pipeline.captions.prepared import load_captions
from pipeline.core.errors import CapstackError
from trainer.config import load_experiment
from trainer.data import Features, TrainBatches
from trainer.runs import RunRecord
from trainer.train import train
from trainer.training import loop
from trainer_fixtures import train_losses, write_experiment


def batches(prepared, stores, readers: int, batching: str) -> TrainBatches:
    return TrainBatches(load_captions(prepared), Features(stores), batch_size=3, seq_per_img=2,
                        seed=7, batching=batching, readers=readers)


@pytest.mark.parametrize("batching", ["images", "one_length"])
def test_reader_processes_make_the_same_batches_in_the_same_order(data, batching):
    _, prepared, grid, regions = data
    stores = [grid, regions]  # LMDB and HDF5, concatenated
    here = batches(prepared, stores, 0, batching)
    there = batches(prepared, stores, 2, batching)
    for epoch, start in [(0, 0), (1, 2)]:  # a resumed epoch starts at its next batch
        mine = [(b.image_ids, b.feats.clone(), b.mask.clone(), b.captions, b.index, b.share)
                for b in here.epoch(epoch, start)]
        theirs = list(there.epoch(epoch, start))
        assert len(mine) == len(theirs) == len(here) - start
        for (ids, feats, mask, captions, index, share), b in zip(mine, theirs):
            assert b.image_ids == ids and b.index == index
            assert torch.equal(b.feats, feats) and b.feats.dtype == feats.dtype
            assert torch.equal(b.mask, mask) and torch.equal(b.captions, captions)
            assert (b.share.tokens, b.share.captions, b.share.images, b.share.first,
                    b.share.weight) == (share.tokens, share.captions, share.images,
                                        share.first, share.weight)
            assert b.share.total == there.ranks.sum  # the trainer's, not the reader's


def test_losses_with_and_without_readers_are_identical_and_resume_alike(data, tmp_path,
                                                                        monkeypatch):
    _, prepared, grid, _ = data
    path = write_experiment(tmp_path / "exp.yaml", decoder="top_down", captions=prepared,
                            features=[grid], epochs=2, checkpoint_every=2)
    train(load_experiment(path), tmp_path / "readers0", progress=False)
    train(load_experiment(path, ["data.readers=2"]), tmp_path / "readers2", progress=False)
    assert train_losses(tmp_path / "readers2") == train_losses(tmp_path / "readers0")

    real_step, calls = loop.train_step, []

    def dies_at_step_3(parts, position, batch):
        calls.append(1)
        if len(calls) == 3:  # after the step-2 checkpoint: a kill in the middle of epoch 0
            raise KeyboardInterrupt
        return real_step(parts, position, batch)

    monkeypatch.setattr(loop, "train_step", dies_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        train(load_experiment(path, ["data.readers=2"]), tmp_path / "split", progress=False)
    monkeypatch.setattr(loop, "train_step", real_step)
    # resumed with another number of readers: readers may change between a run and its resume
    resumed = train(load_experiment(path, ["data.readers=1"]), tmp_path / "split",
                    progress=False)
    assert resumed.resumed_at == (0, 2)
    assert train_losses(tmp_path / "split") == train_losses(tmp_path / "readers0")


def test_a_killed_reader_is_named_and_the_run_recorded_failed_with_its_checkpoint(
        data, tmp_path, monkeypatch):
    _, prepared, grid, _ = data
    path = write_experiment(tmp_path / "exp.yaml", decoder="top_down", captions=prepared,
                            features=[grid], epochs=1, checkpoint_every=1)
    overrides = ["data.readers=2", "train.batch_size=1"]  # more batches than the readers' lead
    real_step, real_end, calls = loop.train_step, RunRecord.end, []

    def kills_a_reader_at_step_3(parts, position, batch):
        calls.append(1)
        if len(calls) == 3:  # as the out-of-memory killer does
            os.kill(multiprocessing.active_children()[0].pid, signal.SIGKILL)
        return real_step(parts, position, batch)

    def ends_with_another_child_gone(self, error=None):
        os.kill(os.getpid(), signal.SIGCHLD)  # another child ending as the run records its end
        real_end(self, error)

    monkeypatch.setattr(loop, "train_step", kills_a_reader_at_step_3)
    monkeypatch.setattr(RunRecord, "end", ends_with_another_child_gone)
    with pytest.raises(CapstackError, match=r"^data\.readers: reader process \d of 2 \(pid \d+\) "
                                            r"was killed by SIGKILL .* batch \d+ of epoch 1") \
            as stopped:
        train(load_experiment(path, overrides), tmp_path / "run", progress=False)
    awaited = int(re.search(r"batch (\d+) of", str(stopped.value)).group(1))
    assert awaited >= 4  # the batches the live reader had made came first
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["state"] == "failed" and "SIGKILL" in state["error"]
    assert "\n" not in state["error"]
    monkeypatch.setattr(loop, "train_step", real_step)
    resumed = train(load_experiment(path, overrides[1:]), tmp_path / "run", progress=False)
    assert resumed.resumed_at == (0, awaited - 1)  # from the last checkpoint, kept
