"""``train.compile: steps`` (trainer/training/compiled.py): short XE and SCST runs with the
decoder's recurrence and step compiled give the losses and greedy captions of the same runs
eager, resume, fall back to eager when compiling fails, and leave checkpoints as they were.

The runs compile with the ``aot_eager`` backend: the graphs torch.compile captures (dynamo's
tracing, autograd's forward and backward graphs) run through torch's own kernels, with the
dropout masks drawn from the same generator in the same order, so the losses agree to float32
rounding of reassociated sums (stated: relative 1e-5). Inductor's generated kernels are the
one slow test here (a minute on a 2-core CPU for the step alone).
"""

from __future__ import annotations

import json
import logging

import pytest
import torch

from pipeline.captions.prepared import load_captions
from trainer.checkpoint import load_checkpoint
from trainer.config import load_experiment
from trainer.data import Features
from trainer.decoding import beam_search, greedy, sample
from trainer.evaluation.evaluate import load_model
from trainer.rewards.cider_cache import build_cache
from trainer.train import train
from trainer.training.build import build
from trainer.training import compiled
from trainer_fixtures import cider_d, make_decoder, make_prepared, write_experiment, \
    write_feature_store

RTOL = 1e-5  # compiled against eager: float32 sums taken in another order
TINY_TRANSFORMER = {"d_model": 16, "heads": 2, "d_ff": 32, "layers": 1}


@pytest.fixture(autouse=True)
def aot_eager(monkeypatch):
    """The backend of these runs: torch.compile's graphs without code generation."""
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """12 train images in batches of 5: the epoch's last batch (2 images) has other shapes."""
    root = tmp_path_factory.mktemp("compiled")
    _, prepared = make_prepared(root)
    store = write_feature_store(root / "grid.lmdb", load_captions(prepared).image_ids)
    exp = write_experiment(root / "xe.yaml", decoder="top_down", captions=prepared,
                           features=[store], epochs=2, batch_size=5,
                           log_every=1)
    build_cache(prepared, "train", root / "cider.npz")
    return root, prepared, store, exp


def logged(run_dir, key="loss") -> list[float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x[key] for x in lines if x["kind"] == "train"]


def val_cider(run_dir) -> list[float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x["cider"] for x in lines if x["kind"] == "val"]


def greedy_captions(checkpoint, store, prepared) -> torch.Tensor:
    """The checkpoint's greedy captions of the val images."""
    model, _, _ = load_model(load_checkpoint(checkpoint))
    captions = load_captions(prepared)
    ids = captions.image_ids[captions.rows("val")].tolist()
    feats, mask, _ = Features([store]).read(ids)
    with torch.no_grad():
        return greedy(model.eval(), model.encode(feats.float(), mask), 16).tokens


def compiled_calls(monkeypatch) -> list[str]:
    """The compiled methods' names, one per call through torch.compile."""
    calls: list[str] = []
    real = compiled.CompiledMethod.__call__

    def counting(self, *args):
        calls.append(self.name)
        return real(self, *args)

    monkeypatch.setattr(compiled.CompiledMethod, "__call__", counting)
    return calls


def assert_close(a: list[float], b: list[float]) -> None:
    assert len(a) == len(b) and len(a) > 0
    assert a == pytest.approx(b, rel=RTOL), (a, b)


def test_xe_run_compiled_gives_the_eager_losses_and_captions(data, tmp_path, monkeypatch):
    root, prepared, store, exp = data
    train(load_experiment(exp), tmp_path / "eager", progress=False)
    calls = compiled_calls(monkeypatch)
    train(load_experiment(exp, ["train.compile=steps"]), tmp_path / "compiled", progress=False)
    assert "recur" in calls  # teacher forcing went through the compiled recurrence
    assert_close(logged(tmp_path / "compiled"), logged(tmp_path / "eager"))
    assert_close(logged(tmp_path / "compiled", "xe"), logged(tmp_path / "eager", "xe"))
    assert val_cider(tmp_path / "compiled") == pytest.approx(val_cider(tmp_path / "eager"))
    assert torch.equal(greedy_captions(tmp_path / "compiled" / "best.pt", store, prepared),
                       greedy_captions(tmp_path / "eager" / "best.pt", store, prepared))
    eager, made = (torch.load(tmp_path / run / "last.pt", weights_only=True)["model"]
                   for run in ("eager", "compiled"))
    assert list(made) == list(eager) and not any("_orig_mod" in k for k in made)
    for key in eager:
        torch.testing.assert_close(made[key], eager[key], rtol=1e-4, atol=1e-6)


def test_scst_run_compiled_gives_the_eager_losses_and_captions(data, tmp_path, monkeypatch):
    """Sampling (train mode, with gradients) and the greedy baseline (eval mode, none) each
    compile the step: both give what they give eagerly, samples and rewards alike."""
    root, prepared, store, exp = data
    train(load_experiment(exp, ["train.epochs=1"]), tmp_path / "xe", progress=False)
    overrides = ["objective.name=scst", f"train.init_from={tmp_path / 'xe' / 'best.pt'}",
                 *cider_d(root / "cider.npz"), "train.lr=5e-4", "train.epochs=2",
                 "objective.samples=3"]
    train(load_experiment(exp, overrides), tmp_path / "eager", progress=False)
    calls = compiled_calls(monkeypatch)
    train(load_experiment(exp, overrides + ["train.compile=steps"]), tmp_path / "compiled",
          progress=False)
    assert "step" in calls
    assert_close(logged(tmp_path / "compiled"), logged(tmp_path / "eager"))
    assert logged(tmp_path / "compiled", "reward") == pytest.approx(
        logged(tmp_path / "eager", "reward"), rel=RTOL)
    assert torch.equal(greedy_captions(tmp_path / "compiled" / "last.pt", store, prepared),
                       greedy_captions(tmp_path / "eager" / "last.pt", store, prepared))
    saved = torch.load(tmp_path / "compiled" / "last.pt", weights_only=True)["model"]
    assert not any("_orig_mod" in k for k in saved)


def test_a_compiled_run_resumes_exactly_and_may_switch_compiling(data, tmp_path):
    _, _, _, exp = data
    on = ["train.compile=steps"]
    train(load_experiment(exp, on), tmp_path / "whole", progress=False)
    train(load_experiment(exp, on + ["train.epochs=1"]), tmp_path / "split", progress=False)
    resumed = train(load_experiment(exp, on), tmp_path / "split", progress=False)
    assert resumed.resumed_at == (1, 0)
    assert logged(tmp_path / "split") == logged(tmp_path / "whole")
    # an eager run resumed compiled (and the other way): compile is no part of the recipe
    train(load_experiment(exp, ["train.epochs=1"]), tmp_path / "switch", progress=False)
    switched = train(load_experiment(exp, on), tmp_path / "switch", progress=False)
    assert switched.resumed_at == (1, 0)
    assert_close(logged(tmp_path / "switch"), logged(tmp_path / "whole"))


def failing_backend(graph, example_inputs):
    raise RuntimeError("no working C++ compiler (a stand-in)")


def test_a_step_that_cannot_be_compiled_runs_eagerly_said_once(data, tmp_path, monkeypatch,
                                                              caplog):
    _, _, _, exp = data
    monkeypatch.setattr(compiled, "BACKEND", failing_backend)
    train(load_experiment(exp, ["train.epochs=1"]), tmp_path / "eager", progress=False)
    with caplog.at_level(logging.WARNING, logger=compiled.__name__):
        run_dir = tmp_path / "fallback"
        train(load_experiment(exp, ["train.epochs=1", "train.compile=steps"]), run_dir,
              progress=False)
    said = [r.getMessage() for r in caplog.records if r.name == compiled.__name__]
    assert len(said) == 1 and "recur could not be compiled" in said[0] and "eagerly" in said[0]
    assert len(said[0].splitlines()) == 1
    assert logged(run_dir) == logged(tmp_path / "eager")  # eager through and through


def test_the_compiled_methods_are_in_place_only_during_a_step(data, tmp_path):
    _, _, _, exp = data
    run = build(load_experiment(exp, ["train.compile=steps"]), tmp_path / "run")
    assert run.compiled is not None and set(run.compiled.methods) == {"recur", "step"}
    assert run.compiled.mode == "default"  # auto, on a CPU
    assert "step" not in vars(run.model)
    with compiled.active(run.compiled):
        assert vars(run.model)["step"] is run.compiled.methods["step"]
    assert "step" not in vars(run.model) and "recur" not in vars(run.model)
    assert build(load_experiment(exp), tmp_path / "off").compiled is None


def test_modes_and_a_decoder_whose_state_grows():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert compiled.compile_mode("auto", cpu) == "default"
    assert compiled.compile_mode("auto", cuda) == "reduce-overhead"
    assert compiled.compile_mode("max-autotune", cpu) == "max-autotune"
    model = make_decoder("transformer", TINY_TRANSFORMER, 20, 8)
    assert set(compiled.CompiledSteps(model, "default").methods) == {"recur", "step"}
    model.steps_keep_shapes = False  # a decoder that says its state changes shape a word
    assert set(compiled.CompiledSteps(model, "default").methods) == {"recur"}


def sampled_eager_and_compiled(model, decode):
    """``decode(feats, mask)``, which samples a caption (its first result) and takes its
    log-probabilities' gradients, run eager, then with ``model``'s steps compiled, on the same
    features from the same random numbers: the samples, their log-probabilities and the output
    layer's gradients agree. What else each run returned, eager then compiled."""
    feats, mask = torch.randn(3, 4, 8), torch.ones(3, 4, dtype=torch.bool)
    steps = compiled.CompiledSteps(model, "default")
    results = []
    for compiling in (False, True):
        torch.manual_seed(1)
        model.zero_grad()
        with compiled.active(steps if compiling else None):
            drawn, *more = decode(feats, mask)
        results.append((drawn, model.out.weight.grad.clone(), more))
    (eager, eager_grad, eager_more), (made, made_grad, made_more) = results
    assert not steps.failed
    assert torch.equal(made.tokens, eager.tokens)
    torch.testing.assert_close(made.logprobs, eager.logprobs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(made_grad, eager_grad, rtol=1e-4, atol=1e-5)
    return eager_more, made_more


def test_the_transformers_compiled_step_samples_and_searches_as_its_eager_one():
    """Decoding gives the transformer's cache its room first: one compiled step serves every
    word (its shapes stay), sampling's log-probabilities and gradients and beam search's
    captions are the eager ones."""
    torch.manual_seed(0)
    model = make_decoder("transformer", TINY_TRANSFORMER, 30, 8)

    def sample_and_search(feats, mask):
        drawn = sample(model, model.encode(feats, mask), 6, n=2)
        drawn.logprobs.sum().backward()
        with torch.no_grad():
            model.eval()
            beams = beam_search(model, model.encode(feats, mask), 3, 6).tokens
            model.train()
        return drawn, beams

    [eager_beams], [made_beams] = sampled_eager_and_compiled(model, sample_and_search)
    assert torch.equal(made_beams, eager_beams)


@pytest.mark.slow
def test_inductor_step_gives_the_eager_logits_and_samples(monkeypatch):
    """Inductor's generated kernels (C++ on a CPU): a sampled caption's log-probabilities and
    their gradients as eager ones, with torch's random numbers (``fallback_random``) for the
    dropout masks."""
    import torch._inductor.config as inductor

    monkeypatch.setattr(compiled, "BACKEND", "inductor")
    monkeypatch.setattr(inductor, "fallback_random", True)
    torch.manual_seed(0)
    model = make_decoder("top_down", {"embed": 16, "hidden": 16, "att_hidden": 8}, 30, 8)

    def sample_once(feats, mask):
        drawn = sample(model, model.encode(feats, mask), 6, n=2)
        drawn.logprobs.sum().backward()
        return (drawn,)

    sampled_eager_and_compiled(model, sample_once)
