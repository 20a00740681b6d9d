"""Training, resuming, refusing other data, evaluating, and the report: real files end to end."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from pipeline.core.errors import CapstackError
from trainer.config import load_experiment
from trainer.data import Features, TrainBatches, load_captions
from trainer.evaluation.evaluate import evaluate_checkpoint
from trainer.train import Run, train
from trainer_fixtures import make_prepared, write_experiment, write_feature_store


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    dataset, prepared = make_prepared(root)
    ids = load_captions(prepared).image_ids
    grid = write_feature_store(root / "grid.lmdb", ids, kind="grid", image_root=dataset.parent)
    regions = write_feature_store(root / "regions.h5", ids, kind="regions", seed=1,
                                  fingerprint="0ddba11", image_root=dataset.parent)
    return root, prepared, grid, regions


def train_losses(run_dir) -> list[float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x["loss"] for x in lines if x["kind"] == "train"]


def test_batches_hold_seq_per_img_captions_and_a_fixed_order(data):
    _, prepared, grid, regions = data
    captions = load_captions(prepared)
    batches = TrainBatches(captions, Features([regions]), batch_size=5, seq_per_img=3, seed=7,
                           bucket_by_length=True)
    first = list(batches.epoch(0))
    assert len(first) == len(batches) == 3
    b = first[0]
    assert b.captions.shape[0] == 3 * len(b.image_ids) and (b.captions[:, 0] == 1).all()
    assert b.feats.shape[:2] == b.mask.shape and b.feats.dtype == torch.float16
    assert sorted(i for x in first for i in x.image_ids) == sorted(captions.image_ids[:12].tolist())
    again = list(batches.epoch(0, start=1))
    assert [x.image_ids for x in again] == [x.image_ids for x in first[1:]]
    assert all(torch.equal(x.captions, y.captions) for x, y in zip(again, first[1:]))
    assert [x.image_ids for x in batches.epoch(1)] != [x.image_ids for x in first]
    # bucketed: each batch holds images of neighbouring mean caption length
    spans = sorted((lengths.min(), lengths.max()) for lengths in
                   (batches.mean_caption_length(rows) for rows in batches.order(0)))
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    expected = [np.mean(captions.lengths[captions.label_start[r]:captions.label_end[r]])
                for r in range(4)]
    np.testing.assert_allclose(batches.mean_caption_length(np.arange(4)), expected)


def test_stores_are_concatenated_and_box_geometry_appended(data):
    _, prepared, grid, regions = data
    both = Features([grid, regions])
    feats, mask, _ = both.read([0, 1])
    assert feats.shape[1] == 4 + 3 and mask[:, :4].all()  # 4 cells + 2 or 3 regions
    assert mask.sum(1).tolist() == [4 + 2, 4 + 3]
    geo = Features([regions], box_geometry=True)
    feats, mask, boxes = geo.read([0])
    assert geo.feature_dim == 16 + 5
    np.testing.assert_allclose(feats[0, :, 16:20].float().numpy()[mask[0].numpy()],
                               (boxes[0] / 64).numpy()[mask[0].numpy()], atol=1e-3)
    with pytest.raises(CapstackError, match="only region stores"):
        Features([grid], box_geometry=True)


def test_training_writes_checkpoints_and_a_log(data, tmp_path):
    root, prepared, grid, _ = data
    exp = load_experiment(write_experiment(tmp_path / "st.yaml", decoder="show_tell",
                                           captions=prepared, features=[grid]))
    result = train(exp, tmp_path / "run", progress=False)
    assert result.epochs == 2 and result.steps == 6 and result.resumed_at is None
    for name in ("best.pt", "last.pt", "metrics.jsonl", "config.json", "summary.json"):
        assert (tmp_path / "run" / name).is_file()
    log = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in log if x["kind"] == "val"] == [0, 1]
    ckpt = torch.load(tmp_path / "run" / "best.pt", weights_only=True)
    assert ckpt["vocab"]["itow"][:4] == ["<pad>", "<bos>", "<eos>", "<unk>"]
    assert ckpt["stores"][0]["fingerprint"] == "feedbeef" and ckpt["stores"][0]["meta"]["kind"] == "grid"
    assert ckpt["identity"]["decoder_config"]["hidden"] == 32


@pytest.mark.parametrize("decoder", ["soft_attention", "hard_attention"])
def test_resume_gives_the_same_next_losses(data, tmp_path, decoder):
    _, prepared, grid, _ = data
    path = write_experiment(tmp_path / "exp.yaml", decoder=decoder, captions=prepared,
                            features=[grid], epochs=3, scheduled_sampling_start=1,
                            scheduled_sampling_increase_every=1, scheduled_sampling_increase=0.5,
                            scheduled_sampling_max=0.5)
    whole = train(load_experiment(path), tmp_path / "whole", progress=False)
    train(load_experiment(path, ["train.epochs=1"]), tmp_path / "split", progress=False)
    resumed = train(load_experiment(path), tmp_path / "split", progress=False)
    assert resumed.resumed_at == (1, 0)
    assert train_losses(tmp_path / "split") == train_losses(tmp_path / "whole")
    assert resumed.best_cider == whole.best_cider


def test_resume_mid_epoch_from_a_step_checkpoint(data, tmp_path, monkeypatch):
    _, prepared, grid, _ = data
    path = write_experiment(tmp_path / "exp.yaml", decoder="top_down", captions=prepared,
                            features=[grid], epochs=2, checkpoint_every=2)
    train(load_experiment(path), tmp_path / "whole", progress=False)
    real_step, calls = Run.train_step, []

    def dies_at_step_3(self, batch, sample_prob):
        calls.append(1)
        if len(calls) == 3:  # after the step-2 checkpoint: a kill in the middle of epoch 0
            raise KeyboardInterrupt
        return real_step(self, batch, sample_prob)

    monkeypatch.setattr(Run, "train_step", dies_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        train(load_experiment(path), tmp_path / "split", progress=False)
    monkeypatch.setattr(Run, "train_step", real_step)
    resumed = train(load_experiment(path), tmp_path / "split", progress=False)
    assert resumed.resumed_at == (0, 2)
    assert train_losses(tmp_path / "split") == train_losses(tmp_path / "whole")


def test_checkpoint_refused_on_other_stores_or_config(data, tmp_path):
    root, prepared, grid, regions = data
    path = write_experiment(tmp_path / "exp.yaml", decoder="gru_init", captions=prepared,
                            features=[grid], epochs=1)
    train(load_experiment(path), tmp_path / "run", progress=False)
    other = write_feature_store(tmp_path / "other.lmdb", load_captions(prepared).image_ids,
                                fingerprint="c0ffee")
    with pytest.raises(CapstackError, match=r"stores\[0\].fingerprint: the checkpoint has "
                                            r"'feedbeef', this run has 'c0ffee'"):
        train(load_experiment(path, [f"data.features=[{other}]", "train.epochs=2"]),
              tmp_path / "run", progress=False)
    with pytest.raises(CapstackError, match="decoder_config.hidden: the checkpoint has 32"):
        train(load_experiment(path, ["decoder_config.hidden=16", "train.epochs=2"]),
              tmp_path / "run", progress=False)



def test_evaluation_refuses_a_pointer_now_naming_other_features(data, tmp_path):
    _, prepared, grid, _ = data
    pointer = tmp_path / "grid.json"
    pointer.write_text(json.dumps({"store": str(grid)}))
    path = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                            features=[pointer], epochs=1)
    train(load_experiment(path), tmp_path / "run", progress=False)
    other = write_feature_store(tmp_path / "other.lmdb", load_captions(prepared).image_ids,
                                fingerprint="c0ffee")
    pointer.write_text(json.dumps({"store": str(other)}))  # features extracted again, otherwise
    with pytest.raises(CapstackError, match=r"best.pt: stores\[0\].fingerprint: the checkpoint "
                                            r"has 'feedbeef', this run has 'c0ffee'"):
        evaluate_checkpoint(tmp_path / "run", tmp_path / "eval", beam_size=2, figures=0)


def test_training_refuses_stores_lacking_images(data, tmp_path):
    _, prepared, _, _ = data
    ids = load_captions(prepared).image_ids
    partial = write_feature_store(tmp_path / "partial.lmdb", ids[:-1])
    path = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                            features=[partial])
    with pytest.raises(CapstackError, match=f"lacks image {ids[-1]}"):
        train(load_experiment(path), tmp_path / "run", progress=False)


@pytest.mark.parametrize("override, problem", [
    ("train.epochs=many", "train.epochs: expected int, got 'many'"),
    ("train.epoch=3", "unknown key 'epoch'"),
    ("data.seq_per_img=0", "seq_per_img: must be at least 1"),
    ("eval.split=dev", "eval.split: expected train, val or test"),
])
def test_experiment_file_errors_name_the_field(data, tmp_path, override, problem):
    _, prepared, grid, _ = data
    path = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                            features=[grid])
    with pytest.raises(CapstackError, match=problem) as error:
        load_experiment(path, [override])
    assert str(path) in str(error.value)


def test_evaluate_and_report_through_the_cli(data, tmp_path, capstack):
    root, prepared, grid, regions = data
    runs = {}
    for decoder, features, extra in (("soft_attention", grid, {}),
                                     ("top_down", regions, {})):
        path = write_experiment(tmp_path / f"{decoder}.yaml", decoder=decoder, captions=prepared,
                                features=[features], epochs=1, **extra)
        capstack("train", path, "--out", tmp_path / decoder)
        result = capstack("evaluate", tmp_path / decoder, "--beam", 2, "--figures", 2)
        assert "CIDEr" in result.output and "SPICE" in result.output
        runs[decoder] = tmp_path / decoder / "eval"
    metrics = json.loads((runs["soft_attention"] / "metrics.json").read_text())
    assert metrics["approach"] == "soft_attention" and metrics["metrics"]["SPICE"] is None
    assert "SPICE" in metrics["unavailable"] and metrics["beam_size"] == 2
    results = json.loads((runs["soft_attention"] / "results_test.json").read_text())
    assert len(results) == 4 and set(results[0]) == {"image_id", "caption"}
    assert len(list((runs["soft_attention"] / "attention").glob("*.png"))) == 2
    assert len(list((runs["top_down"] / "attention").glob("*.png"))) == 2
    assert (runs["soft_attention"] / "curves.png").is_file()
    capstack("report", runs["soft_attention"], runs["top_down"], "--out", tmp_path / "reports")
    table = pd.read_csv(tmp_path / "reports" / "metrics.csv", keep_default_na=False)
    assert list(table.columns) == ["Approach", "Training", "B@1", "B@2", "B@3", "B@4", "METEOR",
                                   "ROUGE-L", "CIDEr", "SPICE"]
    assert table["Approach"].tolist() == ["soft_attention", "top_down"]
    assert table["Training"].tolist() == ["XE", "XE"]  # evaluate records the objective
    assert (table["SPICE"] == "n/a").all()
    scored = capstack("evaluate", runs["top_down"] / "results_test.json", "--refs",
                      prepared / "refs_test.json")
    assert "BLEU-4" in scored.output


def test_decoders_command_lists_one_per_line(capstack):
    lines = capstack("decoders").output.strip().splitlines()
    assert [line.split()[0] for line in lines] == sorted(
        ["show_tell", "lstm3", "gru_init", "soft_attention", "hard_attention", "top_down",
         "stack_cap", "stack_cap_star"])


def test_restart_on_change_moves_the_old_run_aside(data, tmp_path):
    _, prepared, grid, _ = data
    path = write_experiment(tmp_path / "exp.yaml", decoder="gru_init", captions=prepared,
                            features=[grid], epochs=1)
    train(load_experiment(path), tmp_path / "run", progress=False)
    changed = load_experiment(path, ["decoder_config.hidden=16"])
    with pytest.raises(CapstackError, match="decoder_config.hidden"):
        train(changed, tmp_path / "run", progress=False)
    result = train(changed, tmp_path / "run", progress=False, restart_on_change=True)
    assert result.resumed_at is None and result.epochs == 1
    old = torch.load(tmp_path / "run.old" / "last.pt", weights_only=True)
    new = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert (old["identity"]["decoder_config"]["hidden"], new["identity"]["decoder_config"]["hidden"]) == (32, 16)
