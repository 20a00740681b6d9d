"""Training, resuming, refusing other data, evaluating, and the report: real files end to end."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from pipeline.captions.prepared import load_captions
from pipeline.core.errors import CapstackError
from trainer.checkpoint import load_checkpoint, save_checkpoint
from trainer.config import load_experiment
from trainer.data import Features, TrainBatches
from trainer.evaluation.evaluate import evaluate_checkpoint
from trainer.train import train
from trainer.training import loop
from trainer_fixtures import (cider_d, train_losses, write_experiment,
                              write_feature_store)


def test_one_length_batches_hold_captions_of_one_length_each_caption_once_an_epoch(data):
    """Show, Attend and Tell's minibatches: batch_size x seq_per_img captions of one length,
    each with its own image's features, every train caption once per epoch, in an order fixed
    by (seed, epoch)."""
    _, prepared, grid, _ = data
    captions = load_captions(prepared)
    batches = TrainBatches(captions, Features([grid]), batch_size=2, seq_per_img=2, seed=3,
                           batching="one_length")
    epoch = list(batches.epoch(0))
    assert len(epoch) == len(batches)
    train_rows = captions.rows("train")
    caption_rows = [c for r in train_rows
                    for c in range(captions.label_start[r], captions.label_end[r])]
    expected = sorted(tuple(batches.all_captions[c].tolist()) for c in caption_rows)
    seen = []
    for b in epoch:
        lengths = (b.captions[:, 1:] != 0).sum(1)  # words and <eos>
        assert len(set(lengths.tolist())) == 1 and 1 <= len(b.captions) <= 4
        assert b.seq_per_img == 1 and len(b.image_ids) == len(b.captions) == b.feats.shape[0]
        seen += [tuple(c.tolist()) for c in b.captions]
        for image_id, caption in zip(b.image_ids, b.captions):  # each caption with its image
            row = int(np.flatnonzero(captions.image_ids == image_id)[0])
            own = batches.all_captions[captions.label_start[row]:captions.label_end[row]]
            assert any(torch.equal(caption, c) for c in own)
    assert sorted(seen) == expected  # every caption once
    again, other = list(batches.epoch(0)), list(batches.epoch(1))
    assert all(torch.equal(a.captions, b.captions) for a, b in zip(again, epoch))
    assert any(not torch.equal(a.captions, b.captions) for a, b in zip(other, epoch))


def test_batches_hold_seq_per_img_captions_and_a_fixed_order(data):
    _, prepared, grid, regions = data
    captions = load_captions(prepared)
    batches = TrainBatches(captions, Features([regions]), batch_size=5, seq_per_img=3, seed=7,
                           batching="length_buckets")
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
    with pytest.raises(CapstackError,
                       match=r"box_geometry: needs stores with boxes \(.*grid.lmdb: 2x2 grid"):
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
    assert ckpt["stores"][0]["fingerprint"] == "feedbeef" and ckpt["stores"][0]["meta"]["grid"] == 2
    assert ckpt["identity"]["decoder"]["hidden"] == 32


@pytest.mark.parametrize("decoder", ["soft_attention", "hard_attention"])
def test_resume_gives_the_same_next_losses(data, tmp_path, decoder):
    _, prepared, grid, _ = data
    path = write_experiment(tmp_path / "exp.yaml", decoder=decoder, captions=prepared,
                            features=[grid], epochs=3,
                            objective={"name": "xe", "scheduled_sampling_start": 1,
                                       "scheduled_sampling_increase_every": 1,
                                       "scheduled_sampling_increase": 0.5,
                                       "scheduled_sampling_max": 0.5})
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
    real_step, calls = loop.train_step, []

    def dies_at_step_3(parts, position, batch):
        calls.append(1)
        if len(calls) == 3:  # after the step-2 checkpoint: a kill in the middle of epoch 0
            raise KeyboardInterrupt
        return real_step(parts, position, batch)

    monkeypatch.setattr(loop, "train_step", dies_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        train(load_experiment(path), tmp_path / "split", progress=False)
    monkeypatch.setattr(loop, "train_step", real_step)
    resumed = train(load_experiment(path), tmp_path / "split", progress=False)
    assert resumed.resumed_at == (0, 2)
    assert train_losses(tmp_path / "split") == train_losses(tmp_path / "whole")


def test_resume_refuses_an_optimiser_state_of_other_weight_shapes(data, tmp_path):
    """A run saved when top_down's attention LSTM was one nn.LSTMCell resumes its weights
    (converted on load) but not Adam's moments of the old shapes: the error names the file."""
    _, prepared, grid, _ = data
    path = write_experiment(tmp_path / "exp.yaml", decoder="top_down", captions=prepared,
                            features=[grid], epochs=2)
    train(load_experiment(path, ["train.epochs=1"]), tmp_path / "run", progress=False)
    last = tmp_path / "run" / "last.pt"
    ckpt = load_checkpoint(last)
    moments = next(s for s in ckpt["optimizer"]["state"].values() if s["exp_avg"].dim() == 2)
    moments["exp_avg"] = moments["exp_avg"][:, :-1]  # as the old weight_ih's wider moments differ
    save_checkpoint(last, {k: v for k, v in ckpt.items() if k != "path"})
    with pytest.raises(CapstackError, match=r"last\.pt: its optimiser state does not fit this "
                                            r"model .*exp_avg.*train\.init_from"):
        train(load_experiment(path), tmp_path / "run", progress=False)


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
    with pytest.raises(CapstackError, match="decoder.hidden: the checkpoint has 32"):
        train(load_experiment(path, ["decoder.hidden=16", "train.epochs=2"]),
              tmp_path / "run", progress=False)


def test_a_start_may_change_only_the_dropout_and_a_resume_nothing(data, tmp_path):
    """train.init_from loads the weights into a run without dropout (RL after XE with it);
    any other decoder setting is still refused, and so is a resume with another dropout."""
    root, prepared, grid, regions = data
    path = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                            features=[grid], epochs=1)
    train(load_experiment(path), tmp_path / "xe", progress=False)
    start = [f"train.init_from={tmp_path / 'xe' / 'best.pt'}", "decoder.dropout=0.0"]
    train(load_experiment(path, start), tmp_path / "rl", progress=False)
    rl = load_checkpoint(tmp_path / "rl" / "last.pt")
    assert rl["identity"]["decoder"]["dropout"] == 0.0
    with pytest.raises(CapstackError, match="decoder.hidden: the checkpoint has 32"):
        train(load_experiment(path, [*start, "decoder.hidden=16"]), tmp_path / "rl16",
              progress=False)
    with pytest.raises(CapstackError, match="decoder.dropout: the checkpoint has 0.5"):
        train(load_experiment(path, ["decoder.dropout=0.1", "train.epochs=2"]),
              tmp_path / "xe", progress=False)


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
    ("data.seq_per_img=0", "seq_per_img: must be from 1 to 100, got 0"),
    ("eval.split=dev", "eval.split: expected one of train, val, test, got 'dev'"),
    ("decoder.hiden=3", r"decoder.hiden: unknown key 'hiden' \(known: dropout, embed, hidden"),
    ("decoder.name=nope", r"decoder.name: unknown decoder 'nope' \(choose gru_init,"),
    ("objective.name=nope",
     r"objective.name: unknown objective 'nope' \(choose adversarial, c2f, .*scst, .*xe"),
    ("objective.scheduled_sampling_max=high", "objective.scheduled_sampling_max: expected float"),
])
def test_experiment_file_errors_name_the_field(data, tmp_path, override, problem):
    _, prepared, grid, _ = data
    path = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                            features=[grid])
    with pytest.raises(CapstackError, match=problem) as error:
        load_experiment(path, [override])
    assert str(path) in str(error.value)


@pytest.mark.slow
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
        runs[decoder] = tmp_path / "evals" / decoder  # evals/NAME beside the run
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
    assert list(table.columns) == ["Approach", "Training", "decoder", "features", "B@1", "B@2",
                                   "B@3", "B@4", "METEOR", "ROUGE-L", "CIDEr", "SPICE"]
    assert table["Approach"].tolist() == ["soft_attention", "top_down"]
    assert table["features"].tolist() == ["grid", "regions"]  # what differs between the rows
    assert table["Training"].tolist() == ["XE", "XE"]  # evaluate records the objective
    assert (table["SPICE"] == "n/a").all()
    scored = capstack("evaluate", runs["top_down"] / "results_test.json", "--refs",
                      prepared / "refs_test.json")
    assert "BLEU-4" in scored.output


def test_decoders_command_lists_one_per_line(capstack):
    lines = capstack("decoders").output.strip().splitlines()
    from trainer.decoders import DECODERS

    assert [line.split()[0] for line in lines] == sorted(DECODERS)


def test_restart_on_change_moves_the_old_run_aside(data, tmp_path):
    _, prepared, grid, _ = data
    path = write_experiment(tmp_path / "exp.yaml", decoder="gru_init", captions=prepared,
                            features=[grid], epochs=1)
    train(load_experiment(path), tmp_path / "run", progress=False)
    changed = load_experiment(path, ["decoder.hidden=16"])
    with pytest.raises(CapstackError, match="decoder.hidden"):
        train(changed, tmp_path / "run", progress=False)
    result = train(changed, tmp_path / "run", progress=False, restart_on_change=True)
    assert result.resumed_at is None and result.epochs == 1
    old = torch.load(tmp_path / "run.old" / "last.pt", weights_only=True)
    new = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert (old["identity"]["decoder"]["hidden"], new["identity"]["decoder"]["hidden"]) == (32, 16)


def test_an_old_form_experiment_is_refused_showing_its_new_form(data, tmp_path, capstack):
    """The flat form (decoder: NAME, decoder_config, the objective's settings under train) is
    refused by `capstack train`, naming the file and printing the same experiment in the new
    form, which then loads as it is."""
    _, prepared, grid, _ = data
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump({
        "name": "old", "decoder": "show_tell", "decoder_config": {"hidden": 32, "embed": 32},
        "data": {"captions": str(prepared), "features": [str(grid)], "seq_per_img": 2},
        "train": {"epochs": 1, "batch_size": 4, "objective": "scst", "scst_samples": 3,
                  "scst_baseline": "mean", "cider_cache": "data/cider/train.npz"}},
        sort_keys=False))
    result = capstack("train", old, "--out", tmp_path / "run", expect_ok=False)
    assert result.exit_code != 0 and not (tmp_path / "run").exists()
    message = result.output
    assert f"{old}: decoder_config, decoder, train.objective, train.cider_cache" in message
    shown = message.split("Write it as:")[1]
    assert "decoder: {name: show_tell, hidden: 32, embed: 32}" in shown
    assert "objective:\n  name: scst\n  reward: {name: cider-d, cache: data/cider/train.npz}\n" \
           "  samples: 3\n  baseline: mean\n" in shown
    new = tmp_path / "new.yaml"
    new.write_text(shown)
    config = load_experiment(new)
    assert (config.decoder.name, config.decoder.config.hidden) == ("show_tell", 32)
    assert (config.objective.name, config.objective.config.samples,
            config.objective.config.baseline) == ("scst", 3, "mean")
    assert config.train.epochs == 1


def test_old_form_overrides_are_refused_with_their_new_key(data, tmp_path):
    _, prepared, grid, _ = data
    path = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                            features=[grid])
    with pytest.raises(CapstackError, match=r"--set train.objective=scst: train.objective is "
                                            r"objective.name now"):
        load_experiment(path, ["train.objective=scst"])
    with pytest.raises(CapstackError, match=r"decoder_config.hidden is decoder.hidden now"):
        load_experiment(path, ["decoder_config.hidden=8"])


def test_another_objective_name_starts_its_section_afresh(data, tmp_path):
    """--set objective.name=OTHER drops the settings of the objective it replaces (they would
    not fit); the same name keeps them."""
    _, prepared, grid, _ = data
    path = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                            features=[grid],
                            objective={"name": "xe", "scheduled_sampling_start": 2})
    assert load_experiment(path).objective.config.scheduled_sampling_start == 2
    same = load_experiment(path, ["objective.name=xe", "objective.scheduled_sampling_max=0.5"])
    assert (same.objective.config.scheduled_sampling_start,
            same.objective.config.scheduled_sampling_max) == (2, 0.5)
    scst = load_experiment(path, ["objective.name=scst", *cider_d("c.npz"),
                                  "objective.baseline=mean"])
    assert scst.objective.name == "scst" and scst.objective.config.baseline == "mean"
    assert scst.to_dict()["objective"] == {"name": "scst",
                                           "reward": {"name": "cider-d", "cache": "c.npz"},
                                           "samples": 5, "baseline": "mean", "temperature": 1.0}
    with pytest.raises(CapstackError, match="objective.baseline: expected one of greedy, mean"):
        load_experiment(path, ["objective.name=scst", *cider_d("c.npz"),
                               "objective.baseline=max"])
    with pytest.raises(CapstackError, match=r"objective.baseline: 'mean' .* needs samples >= 2"):
        load_experiment(path, ["objective.name=scst", *cider_d("c.npz"),
                               "objective.baseline=mean", "objective.samples=1"])


@pytest.mark.slow
def test_evaluation_reads_the_eval_settings_of_the_experiment(data, tmp_path):
    """`eval:` of the experiment the checkpoint carries, unless the command line says otherwise;
    a finished run given new eval settings records them (its training is unchanged)."""
    _, prepared, grid, _ = data
    path = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                            features=[grid], epochs=1)
    train(load_experiment(path, ["eval.beam_size=3", "eval.figures=0"]), tmp_path / "run",
          progress=False)
    weights = load_checkpoint(tmp_path / "run" / "best.pt")["model"]
    first = evaluate_checkpoint(tmp_path / "run", tmp_path / "e1", spice=False)
    assert (first["beam_size"], first["split"], first["figures"]) == (3, "test", 0)
    again = train(load_experiment(path, ["eval.beam_size=2", "eval.split=val", "eval.figures=0"]),
                  tmp_path / "run", progress=False)
    assert again.resumed_at == (1, 0)  # nothing trained
    ckpt = load_checkpoint(tmp_path / "run" / "best.pt")
    assert ckpt["experiment"]["eval"]["beam_size"] == 2
    assert all(torch.equal(weights[k], ckpt["model"][k]) for k in weights)
    second = evaluate_checkpoint(tmp_path / "run", tmp_path / "e2", spice=False)
    assert (second["beam_size"], second["split"]) == (2, "val")
    assert (tmp_path / "e2" / "results_val.json").is_file()
    given = evaluate_checkpoint(tmp_path / "run", tmp_path / "e3", beam_size=1, split="test",
                                spice=False)
    assert (given["beam_size"], given["split"]) == (1, "test")
    with pytest.raises(CapstackError,
                       match="capstack evaluate: eval.beam_size: must be from 1 to 100, got 0"):
        evaluate_checkpoint(tmp_path / "run", tmp_path / "e4", beam_size=0, spice=False)


@pytest.fixture
def one_run(data, tmp_path):
    _, prepared, grid, _ = data
    path = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                            features=[grid], epochs=1)
    train(load_experiment(path, ["eval.figures=0"]), tmp_path / "run", progress=False)
    return tmp_path / "run"


def _folder_bytes(folder) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_an_evaluation_stopped_part_way_leaves_the_one_before_whole(one_run, tmp_path,
                                                                    monkeypatch, capstack):
    """metrics.json and image_statistics.json (which --compare resamples) change together: a
    stop between them left the new metrics beside the old statistics."""
    import cli
    import trainer.evaluation.evaluate as evaluate
    from pipeline.core.jsonfile import write_json

    out = tmp_path / "eval"
    evaluate_checkpoint(one_run, out, beam_size=1, spice=False)
    before = _folder_bytes(out)

    def fails_on_statistics(path, value, indent=1):  # a full disk on the last file
        if path.name == "image_statistics.json":
            raise OSError(28, "No space left on device", str(path))
        return write_json(path, value, indent)

    with monkeypatch.context() as patched:
        patched.setattr(evaluate, "write_json", fails_on_statistics)
        with pytest.raises(CapstackError, match="eval: cannot write it .*No space left on "
                                                "device.*nothing written before was changed"):
            evaluate_checkpoint(one_run, out, beam_size=2, spice=False)
    assert _folder_bytes(out) == before  # the beam-1 evaluation, whole

    def terminated(*args, **kwargs):  # SIGTERM while scoring
        raise cli.Terminated("stopped by SIGTERM")

    with monkeypatch.context() as patched:
        patched.setattr(evaluate, "scored_images", terminated)
        result = capstack("evaluate", one_run, "--out", out, "--beam", 2, expect_ok=False)
    assert result.exit_code == 143
    assert "stopped by SIGTERM: its evaluation folder is as it was before" in result.output
    assert "resumes" not in result.output
    assert _folder_bytes(out) == before
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []
    assert evaluate_checkpoint(one_run, out, beam_size=2, spice=False)["beam_size"] == 2
    assert json.loads((out / "metrics.json").read_text())["beam_size"] == 2


def test_an_evaluation_replaces_its_folder_whole_and_nothing_else(one_run, tmp_path, capstack):
    out = tmp_path / "eval"
    out.mkdir()
    (out / "attention").mkdir()
    (out / "attention" / "7.png").write_bytes(b"an older evaluation's picture")
    (out / "metrics.json").write_text("{}")  # an evaluation folder of an older capstack
    capstack("evaluate", one_run, "--out", out, "--beam", 1, "--figures", 0)
    assert not (out / "attention").exists()  # nothing of the evaluation before is left
    assert json.loads((out / "metrics.json").read_text())["beam_size"] == 1
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    refused = capstack("evaluate", one_run, "--out", mine, expect_ok=False)
    assert refused.exit_code != 0
    assert f"{mine}: holds what an evaluation does not write (notes.txt)" in refused.output
    assert (mine / "notes.txt").read_text() == "mine"
    file = tmp_path / "a-file"
    file.write_text("x")
    with pytest.raises(CapstackError, match="a-file: not a folder; an evaluation writes a "
                                            "folder of its own"):
        evaluate_checkpoint(one_run, file, spice=False)
    assert file.read_text() == "x"
