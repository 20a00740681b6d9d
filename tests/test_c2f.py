"""Stack-Cap's coarse-to-fine reward: eq 15 on hand-made rewards, and a C2F run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.captions.prepared import load_captions
from pipeline.core.errors import CapstackError
from trainer.config import load_experiment
from trainer.objectives.c2f import c2f_advantages
from trainer.rewards.cider_cache import build_cache
from trainer.train import train
from trainer_fixtures import cider_d, make_prepared, write_experiment, write_feature_store


def test_advantage_is_equation_15():
    sampled = np.array([[0.2, 0.5], [0.6, 0.4], [0.9, 0.3]])  # stages 0, 1, 2 x two images
    greedy = np.array([[0.3, 0.3], [0.5, 0.5], [0.7, 0.2]])
    expected = np.array([
        [(0.6 - 0.5) + (0.6 - 0.2), (0.4 - 0.5) + (0.4 - 0.5)],  # stage 1
        [(0.9 - 0.7) + (0.9 - 0.6), (0.3 - 0.2) + (0.3 - 0.4)],  # stage 2
    ])
    np.testing.assert_allclose(c2f_advantages(sampled, greedy), expected)


@pytest.fixture(scope="module")
def stack_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("c2f")
    dataset, prepared = make_prepared(root)
    store = write_feature_store(root / "grid.lmdb", load_captions(prepared).image_ids,
                                image_root=dataset.parent)
    exp = write_experiment(root / "stack.yaml", decoder="stack_cap", captions=prepared,
                           features=[store], epochs=1)
    train(load_experiment(exp), root / "xe", progress=False)
    build_cache(prepared, "train", root / "cider.npz")
    return root, exp, store, prepared


def test_c2f_run_logs_every_stage_reward(stack_run, tmp_path):
    root, exp, _, _ = stack_run
    config = load_experiment(exp, ["objective.name=c2f",
                                   f"train.init_from={root / 'xe' / 'best.pt'}",
                                   *cider_d(root / 'cider.npz'), "train.lr=5e-5",
                                   "train.epochs=1", "objective.samples=2"])
    train(config, tmp_path / "c2f", progress=False)
    lines = [json.loads(x) for x in (tmp_path / "c2f" / "metrics.jsonl").read_text().splitlines()]
    step = [x for x in lines if x["kind"] == "train"][-1]
    assert {"reward_stage0", "reward_stage1", "reward_stage2", "time_sample"} <= set(step)


def test_c2f_needs_a_coarse_to_fine_decoder(stack_run, tmp_path):
    """Said when the experiment file is read: before a store, a cache or a model is opened
    (here none of them exists)."""
    exp = write_experiment(tmp_path / "td.yaml", decoder="top_down", captions=tmp_path / "none",
                           features=[tmp_path / "none.lmdb"], epochs=1)
    with pytest.raises(CapstackError, match=r"td.yaml: objective.name: c2f needs a staged "
                                            r"\(coarse-to-fine\) decoder \(stack_cap, "
                                            r"stack_cap_star\); decoder.name is top_down"):
        load_experiment(exp, ["objective.name=c2f", *cider_d(tmp_path / 'no.npz')])


@pytest.mark.slow
def test_evaluation_draws_every_stage_like_figure_3(stack_run, tmp_path):
    from trainer.evaluation.evaluate import evaluate_checkpoint

    root = stack_run[0]
    evaluate_checkpoint(root / "xe", tmp_path / "eval", beam_size=2, figures=2, spice=False)
    assert len(list((tmp_path / "eval" / "stages").glob("*.png"))) == 2
    assert len(list((tmp_path / "eval" / "attention").glob("*.png"))) == 2


def test_c2f_leaves_the_eos_forced_after_max_len_words_out_of_every_stages_term(stack_run,
                                                                              tmp_path):
    """Every stage's samples run to max_len words (each head's <eos> logit far below the
    rest), so decoding puts <eos> after them. The policy never drew it: no stage's term pulls at
    P(<eos>) (counted, its gradient would be about -advantage per caption), while the words
    drawn get their gradients."""
    import torch

    from pipeline.core.tokens import EOS_ID
    from trainer.objectives.base import StepKey
    from trainer.training.build import build

    root, exp, _, _ = stack_run
    config = load_experiment(exp, ["objective.name=c2f", *cider_d(root / 'cider.npz'),
                                   "objective.samples=2", "train.max_len=3",
                                   "objective.coarse_term=true"])
    (tmp_path / "run").mkdir()
    run = build(config, tmp_path / "run")
    model = run.model
    with torch.no_grad():
        for head in model.outputs:
            head.bias[EOS_ID] = -1e4
    batch = next(iter(run.batches.epoch(0))).to(run.device)
    model.zero_grad(set_to_none=True)
    loss, _ = run.objective.loss(model, batch, StepKey(0, 0, 0))
    loss.backward()
    for head in model.outputs:
        assert head.bias.grad is not None and head.bias.grad.abs().sum() > 0
        assert head.bias.grad[EOS_ID].abs() < 1e-6
