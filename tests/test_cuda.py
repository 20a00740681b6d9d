"""On a CUDA GPU: bfloat16 steps against float32, beam search against the CPU's, torchrun on
one GPU.

Marked ``cuda`` and skipped where torch sees no GPU (CI has none): run them on a GPU machine
with ``pytest -m cuda``. The stated tolerances are bfloat16's: 8 bits of mantissa, a relative
2^-8 per rounding, a few of them per product.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from pipeline.captions.prepared import load_captions
from trainer.checkpoint import load_checkpoint
from trainer.config import load_experiment
from trainer.data import Features
from trainer.decoding import beam_search, sample
from trainer.evaluation.evaluate import load_model
from trainer.objectives.scst import generated_mask, scst_loss
from trainer.precision import Precision
from trainer.train import train
from trainer_fixtures import (make_decoder, make_prepared, mean_xe, teacher_forced,
                              tiny_decoder_config, write_experiment, write_feature_store)

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")]
CUDA = torch.device("cuda")
LOSS_RTOL, GRADIENT_RTOL = 2e-2, 5e-2  # bfloat16 against float32: the loss, the gradients' norm


@pytest.fixture(scope="module")
def cuda_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("cuda")
    dataset, prepared = make_prepared(root, n_train=24, n_val=6, n_test=6)
    ids = load_captions(prepared).image_ids
    grid = write_feature_store(root / "grid.lmdb", ids, kind="grid", image_root=dataset.parent)
    return prepared, grid


def words(n_captions: int, length: int, vocab: int) -> torch.Tensor:
    captions = torch.randint(4, vocab, (n_captions, length), device=CUDA)
    captions[:, 0] = 1
    return captions


def relative_gradient_gap(model, loss_of) -> tuple[float, float]:
    """(the loss's relative gap, the gradients' relative gap) of bfloat16 against float32."""
    results = []
    for amp in ("off", "bfloat16"):
        model.zero_grad()
        with Precision(amp, CUDA).autocast():
            loss = loss_of()
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                        if p.grad is not None}))
    (exact, grads), (cast, cast_grads) = results
    total = sum(g.norm() ** 2 for g in grads.values()) ** 0.5
    gap = sum((cast_grads[n] - g).norm() ** 2 for n, g in grads.items()) ** 0.5
    return float(abs(cast - exact) / abs(exact)), float(gap / total)


@pytest.mark.parametrize("name", ["top_down", "soft_attention", "stack_cap", "transformer"])
def test_a_bfloat16_xe_step_matches_float32(name):
    torch.manual_seed(0)
    model = make_decoder(name, tiny_decoder_config(name), 50, 16).to(CUDA).eval()
    feats, mask = torch.rand(4, 9, 16, device=CUDA), torch.ones(4, 9, dtype=torch.bool, device=CUDA)
    captions = words(8, 10, 50)
    loss_gap, gradient_gap = relative_gradient_gap(model, lambda: mean_xe(
        teacher_forced(model, feats, mask, captions, seq_per_img=2).logits, captions[:, 1:]))
    assert loss_gap < LOSS_RTOL and gradient_gap < GRADIENT_RTOL


def test_a_bfloat16_scst_loss_matches_float32_on_the_same_samples():
    """SCST's loss on the same sampled captions and advantages (sampling itself is a draw:
    a rounding moves a sample only when a uniform draw falls on a boundary)."""
    torch.manual_seed(0)
    model = make_decoder("top_down", tiny_decoder_config("top_down"), 50, 16).to(CUDA).eval()
    feats, mask = torch.rand(4, 9, 16, device=CUDA), torch.ones(4, 9, dtype=torch.bool, device=CUDA)
    with torch.no_grad():
        drawn = sample(model, model.encode(feats, mask), 12, n=3)
    tokens = drawn.tokens
    advantage = torch.randn(tokens.shape[0], device=CUDA)
    inputs = torch.cat([torch.ones_like(tokens[:, :1]), tokens[:, :-1]], 1)

    def loss():
        logits = model(model.encode(feats, mask), torch.cat(
            [inputs, tokens[:, -1:]], 1)).logits
        logprobs = torch.log_softmax(logits.float(), -1).gather(2, tokens[:, :, None]).squeeze(2)
        return scst_loss(logprobs, generated_mask(tokens), advantage)

    loss_gap, gradient_gap = relative_gradient_gap(model, loss)
    assert loss_gap < LOSS_RTOL and gradient_gap < GRADIENT_RTOL


def test_beam_search_on_cuda_equals_the_cpu_s_for_a_trained_decoder(cuda_data, tmp_path):
    prepared, grid = cuda_data
    exp = write_experiment(tmp_path / "td.yaml", decoder="top_down", captions=prepared,
                           features=[grid], epochs=4, device="cpu")
    train(load_experiment(exp), tmp_path / "run", progress=False)
    model, _, _ = load_model(load_checkpoint(tmp_path / "run" / "best.pt"))
    captions = load_captions(prepared)
    feats, mask, _ = Features([grid]).read(captions.image_ids.tolist())
    decoded = {}
    for device in ("cpu", "cuda"):
        on = model.to(device).eval()
        with torch.no_grad():
            found = beam_search(on, on.encode(feats.float().to(device), mask.to(device)), 3, 12)
        decoded[device] = found
    assert torch.equal(decoded["cpu"].tokens, decoded["cuda"].tokens.cpu())
    torch.testing.assert_close(decoded["cuda"].scores.cpu(), decoded["cpu"].scores,
                               rtol=1e-4, atol=1e-4)


def test_torchrun_with_one_gpu_trains_as_a_plain_process_does(cuda_data, tmp_path):
    """``--nproc 1`` under torchrun on the GPU: a world of one, the same steps as without it."""
    prepared, grid = cuda_data
    exp = write_experiment(tmp_path / "td.yaml", decoder="top_down", captions=prepared,
                           features=[grid], epochs=1, device="cuda", log_every=1)
    train(load_experiment(exp), tmp_path / "plain", progress=False)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
         "-m", "cli", "train", str(exp), "--out", str(tmp_path / "torchrun")],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    losses = [[json.loads(line)["loss"] for line in (tmp_path / run / "metrics.jsonl")
               .read_text().splitlines() if json.loads(line)["kind"] == "train"]
              for run in ("plain", "torchrun")]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


@pytest.mark.parametrize("decoder", ["top_down", "transformer"])
@pytest.mark.parametrize("objective", ["xe", "scst"])
def test_compiled_steps_with_cuda_graphs_give_the_eager_losses(cuda_data, tmp_path, objective,
                                                               decoder):
    """``train.compile: steps`` at ``auto`` (CUDA graphs, inductor's kernels) against eager:
    XE and SCST runs without dropout (inductor draws its own random numbers), the epoch's last
    batch smaller (other shapes: compiled once more); float32 sums reassociated by the fused
    kernels, stated as a relative 1e-3 on the losses."""
    from trainer.rewards.cider_cache import build_cache
    from trainer.training import compiled
    from trainer_fixtures import cider_d

    prepared, grid = cuda_data
    exp = write_experiment(tmp_path / "td.yaml", decoder=decoder, captions=prepared,
                           features=[grid], epochs=2, batch_size=5, device="cuda", log_every=1)
    base = ["decoder.dropout=0"]
    if objective == "scst":
        train(load_experiment(exp, base + ["train.epochs=1"]), tmp_path / "xe", progress=False)
        build_cache(prepared, "train", tmp_path / "cider.npz")
        base += ["objective.name=scst", f"train.init_from={tmp_path / 'xe' / 'best.pt'}",
                 *cider_d(tmp_path / "cider.npz"), "train.lr=5e-4", "objective.samples=3"]
    made = {}
    for setting in ("off", "steps"):
        train(load_experiment(exp, base + [f"train.compile={setting}"]), tmp_path / setting,
              progress=False)
        made[setting] = [json.loads(line)["loss"] for line in (tmp_path / setting /
                         "metrics.jsonl").read_text().splitlines()
                         if json.loads(line)["kind"] == "train"]
    assert compiled.compile_mode("auto", CUDA) == "reduce-overhead"
    assert made["steps"] == pytest.approx(made["off"], rel=1e-3)
