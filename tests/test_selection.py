"""Which epoch best.pt keeps (train.select_on), and what epochs without a better one do
(train.lr_decay_patience, train.early_stop_patience): trainer/training/selection.py.

Real runs on the shapes captions, with the validation scores scripted: which epoch is best is
then known beforehand, whatever the tiny decoder learns.
"""

from __future__ import annotations

import json
import pytest

from trainer.checkpoint import load_checkpoint, save_checkpoint
from pipeline.core.errors import CapstackError
from trainer.config import load_experiment
from trainer.evaluation.evaluate import evaluate_checkpoint
from trainer.scoring.metrics import selectable
from trainer.train import train
from trainer_fixtures import write_experiment

NEW_TOP_DOWN = ("att_activation", "att_dropout", "weight_norm", "word_dropout")


@pytest.fixture
def scripted(monkeypatch):
    """Each validation returns the next of the given epochs' scores."""
    def script(*epochs: dict[str, float]):
        given = iter(epochs)
        monkeypatch.setattr("trainer.training.loop.greedy_scores", lambda *a, scores, **k: {
            name: value for name, value in next(given).items() if name in scores})
    return script


def run(data, tmp_path, epochs: int, **train_settings):
    _, prepared, grid, _ = data
    path = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                            features=[grid], epochs=epochs, **train_settings)
    return train(load_experiment(path), tmp_path / "run", progress=False)


def val_log(run_dir) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if x["kind"] == "val"]


SCORES = [{"cider": 0.10, "bleu4": 0.30}, {"cider": 0.50, "bleu4": 0.20},
          {"cider": 0.30, "bleu4": 0.25}]  # BLEU-4 best at epoch 1, CIDEr at epoch 2


@pytest.mark.parametrize("select_on, kept", [("bleu4", 0), ("cider", 1)])
def test_best_pt_is_the_epoch_with_the_best_score_select_on_names(data, tmp_path, scripted,
                                                                  select_on, kept):
    scripted(*SCORES)
    result = run(data, tmp_path, 3, select_on=select_on)
    best = load_checkpoint(tmp_path / "run" / "best.pt")
    assert best["experiment"]["train"]["select_on"] == select_on
    assert (best["epoch"], best["best_epoch"], result.best_epoch) == (kept + 1, kept, kept)
    assert best["best_score"] == result.best_score == SCORES[kept][select_on]
    assert best["best_cider"] == result.best_cider == SCORES[kept]["cider"]
    assert result.select_on == select_on and not result.stopped_early
    logged = [sorted(k for k in x if k in ("cider", "bleu4")) for x in val_log(tmp_path / "run")]
    assert logged == [sorted({"cider", select_on})] * 3  # BLEU-4 scored only when kept on it


def test_a_nan_validation_is_never_kept_and_the_best_finite_one_is(data, tmp_path, scripted):
    scripted({"cider": 0.10}, {"cider": float("nan")}, {"cider": 0.05})
    result = run(data, tmp_path, 3)
    assert (result.best_epoch, result.best_cider) == (0, 0.10)
    assert load_checkpoint(tmp_path / "run" / "best.pt")["epoch"] == 1
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert (state["best_cider"], state["best_epoch"]) == (0.10, 1)

    # a run whose last.pt kept a NaN (a capstack that took it for better) resumes keeping none
    last = load_checkpoint(tmp_path / "run" / "last.pt")
    last.update(best_cider=float("nan"), best_score=float("nan"), best_epoch=1)
    save_checkpoint(tmp_path / "run" / "last.pt", {k: v for k, v in last.items() if k != "path"})
    scripted({"cider": 0.01})
    resumed = train(load_experiment(tmp_path / "exp.yaml", ["train.epochs=4"]),
                    tmp_path / "run", progress=False)
    assert (resumed.best_epoch, resumed.best_cider) == (3, 0.01)
    assert load_checkpoint(tmp_path / "run" / "best.pt")["epoch"] == 4


def test_a_run_whose_every_validation_is_nan_says_it_has_no_best(data, tmp_path, scripted,
                                                                 capstack):
    scripted({"cider": float("nan")}, {"cider": float("nan")})
    _, prepared, grid, _ = data
    path = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions=prepared,
                            features=[grid], epochs=2)
    out = capstack("train", path, "--out", tmp_path / "run").output
    assert "best val CIDEr n/a (no validation scored a finite number; best.pt holds the last " \
        f"epoch) -> {tmp_path / 'run'}/best.pt" in out
    assert "inf" not in out.replace("n/a", "")
    assert load_checkpoint(tmp_path / "run" / "best.pt")["epoch"] == 2


def test_the_choices_of_select_on_are_the_values_the_metrics_score_each_epoch(tmp_path):
    assert {"cider", "bleu4", "bleu1", "rouge_l"} <= set(selectable())
    assert not {"meteor", "spice"} & set(selectable())  # Java: not every epoch
    assert selectable()["bleu4"].label == "BLEU-4" and selectable()["cider"].label == "CIDEr"
    path = write_experiment(tmp_path / "exp.yaml", decoder="show_tell", captions="p",
                            features=["f"], select_on="spice")
    with pytest.raises(CapstackError, match=r"train.select_on: expected one of .*bleu4.*cider"):
        load_experiment(path)


def test_a_run_stops_after_early_stop_patience_epochs_without_a_better_one(data, tmp_path,
                                                                             scripted):
    scripted(*[{"bleu4": b, "cider": 0.1} for b in (0.2, 0.3, 0.3, 0.25, 0.9, 0.9)])
    result = run(data, tmp_path, 6, select_on="bleu4", early_stop_patience=2)
    assert (result.epochs, result.best_epoch, result.stopped_early) == (4, 1, True)
    assert [x["epoch"] for x in val_log(tmp_path / "run")] == [0, 1, 2, 3]
    # more patience continues the run where it stopped
    scripted({"bleu4": 0.9, "cider": 0.2}, {"bleu4": 0.1, "cider": 0.2})
    more = train(load_experiment(tmp_path / "exp.yaml", ["train.early_stop_patience=3"]),
                 tmp_path / "run", progress=False)
    assert (more.resumed_at, more.epochs, more.best_epoch, more.best_score) == ((4, 0), 6, 4, 0.9)


def test_the_lr_falls_each_time_lr_decay_patience_epochs_pass_without_a_better_one(
        data, tmp_path, scripted):
    """The peer's lr x 0.8 after 8 and 16 epochs without a better one, at 1 here: after epochs
    2 and 3 (none better than epoch 1), not after epoch 4 (better)."""
    scripted(*[{"cider": c} for c in (0.5, 0.4, 0.3, 0.6)])
    run(data, tmp_path, 4, lr_decay_patience=1, lr_decay_rate=0.5, log_every=100)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    lrs = [x["lr"] for x in lines if x["kind"] == "train"]  # the last step of each epoch
    assert lrs == pytest.approx([5e-3, 5e-3, 2.5e-3, 1.25e-3])
    last = load_checkpoint(tmp_path / "run" / "last.pt")
    assert last["optimizer"]["param_groups"][0]["lr"] == pytest.approx(1.25e-3)


def test_a_checkpoint_saved_before_these_settings_resumes_and_evaluates(data, tmp_path):
    """No best_score (kept on CIDEr, its only score then), and no top_down settings added since
    in its identity or experiment: it resumes, and reads as the default top_down it was."""
    _, prepared, grid, _ = data
    path = write_experiment(tmp_path / "td.yaml", decoder="top_down", captions=prepared,
                            features=[grid], epochs=1)
    train(load_experiment(path), tmp_path / "run", progress=False)
    for name in ("best.pt", "last.pt"):
        ckpt = load_checkpoint(tmp_path / "run" / name)
        for setting in NEW_TOP_DOWN:
            del ckpt["identity"]["decoder"][setting], ckpt["experiment"]["decoder"][setting]
        for setting in ("select_on", "lr_decay_patience", "early_stop_patience"):
            del ckpt["experiment"]["train"][setting]
        del ckpt["best_score"], ckpt["path"]
        save_checkpoint(tmp_path / "run" / name, ckpt)
    old = load_checkpoint(tmp_path / "run" / "best.pt")
    assert {k: old["identity"]["decoder"][k] for k in NEW_TOP_DOWN} == {
        "att_activation": "tanh", "att_dropout": 0.0, "weight_norm": False, "word_dropout": True}
    assert evaluate_checkpoint(tmp_path / "run", tmp_path / "eval", spice=False,
                               figures=0)["epoch"] == 1
    resumed = train(load_experiment(path, ["train.epochs=2"]), tmp_path / "run", progress=False)
    assert resumed.resumed_at == (1, 0) and resumed.epochs == 2
    assert resumed.best_score >= old["best_cider"]  # the old best, CIDEr, carried on
