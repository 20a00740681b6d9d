"""What a training step asks of the device (trainer/launches.py): the counter itself, then the
training step's host syncs, which must not grow with the caption's words (a CUDA graph holds
none, and each one leaves a GPU idle while the host issues the next kernels)."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

from trainer.batch import TrainBatch, whole_batch
from trainer.decoding.words import SamplingNoise, _EndCheck, sample
from trainer.launches import StepCount, host_side
from trainer.objectives import Setting, StepKey
from trainer.objectives.cross_entropy import CrossEntropy, CrossEntropyConfig
from trainer.objectives.scst import SelfCritical, SelfCriticalConfig
from trainer.precision import Precision
from trainer.rewards.cider import CiderD
from trainer.training.loop import on_host, optimizer_step
from trainer_fixtures import make_decoder, tiny_decoder_config

VOCAB, IMAGES, PER_IMAGE, DIM = 30, 3, 2, 16
WORDS = [f"w{i}" for i in range(VOCAB - 4)]  # ids 4.. (below: <pad> <bos> <eos> <unk>)


def test_a_sync_is_named_by_the_line_that_asked_for_it():
    x = torch.arange(6.0)
    with StepCount() as count:
        x.sum().item()
        if (x > 2).any():
            x[x > 2].tolist()
        x.add(1).mul(2)
    lines = list(count.where())
    assert count.syncs == 4
    assert [w.rsplit("(", 1)[1] for w in lines] == ["item)", "__bool__)", "__getitem__)",
                                                    "tolist)"]
    assert all(w.startswith("tests/test_launches.py:") for w in lines)


def test_views_allocations_non_blocking_copies_torch_internals_and_host_side_are_not_counted():
    x = torch.ones(4, 3, requires_grad=True)
    opt = torch.optim.Adam([x])
    with StepCount() as count:
        x.view(12).t()  # views: no kernel
        torch.empty(3)
        x.to("cpu", non_blocking=True)
        (x * 2).sum().backward()  # mul, sum, and their gradients: kernels
        opt.step()  # Adam's step counters live on the host, read by torch's own code
        with host_side():
            bool(x.detach().all())
    assert count.syncs == 0
    assert count.operators > 0
    with StepCount() as alone:
        x.view(12)
        torch.empty(3)
    assert alone.operators == 0


def test_a_tensor_made_from_host_data_is_a_copy_to_the_device():
    with StepCount() as count:
        torch.as_tensor(np.ones(3))
        torch.as_tensor(torch.ones(3))  # a tensor already: no copy
    assert count.copies == 1


def batch_and_objectives(seed: int = 0) -> tuple[TrainBatch, dict]:
    rng = np.random.default_rng(seed)
    feats = torch.from_numpy(rng.standard_normal((IMAGES, 4, DIM)).astype(np.float32))
    words = rng.integers(4, VOCAB, size=(IMAGES * PER_IMAGE, 6))
    captions = torch.zeros(IMAGES * PER_IMAGE, 8, dtype=torch.long)
    captions[:, 0], captions[:, 1:7], captions[:, 7] = 1, torch.from_numpy(words), 2
    captions[0, 4:] = 0  # one caption shorter
    captions[0, 4] = 2
    share = whole_batch(int((captions[:, 1:] != 0).sum()), len(captions), IMAGES)
    batch = TrainBatch(list(range(IMAGES)), feats, torch.ones(IMAGES, 4, dtype=torch.bool),
                       captions, share, seq_per_img=PER_IMAGE)
    references = {i: [" ".join(WORDS[w - 4] for w in words[i * PER_IMAGE + k])
                      for k in range(PER_IMAGE)] for i in range(IMAGES)}

    def objectives(max_len: int) -> dict:
        setting = Setting(captions=None, max_len=max_len)
        scorer = CiderD.from_references(references, ["<pad>", "<bos>", "<eos>", "<unk>", *WORDS])
        return {"xe": CrossEntropy(CrossEntropyConfig(), setting),
                "scst": SelfCritical(SelfCriticalConfig(reward=None, samples=2), setting,
                                     scorer=scorer)}
    return batch, objectives


def step_syncs(decoder: str, objective: str, max_len: int) -> StepCount:
    """The syncs of the training loop's own step (after a first one)."""
    batch, objectives = batch_and_objectives()
    torch.manual_seed(0)
    model = make_decoder(decoder, tiny_decoder_config(decoder), VOCAB, DIM).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    precision = Precision("off", torch.device("cpu"))
    loss_of = partial(objectives(max_len)[objective].loss, model)
    optimizer_step(loss_of, batch, StepKey(0, 0, 0), precision, opt, 0.1)
    with StepCount() as count:
        stats = optimizer_step(loss_of, batch, StepKey(0, 0, 1), precision, opt, 0.1)
    assert np.isfinite(stats["loss"])
    return count


@pytest.mark.parametrize("decoder", ["top_down", "soft_attention", "transformer"])
def test_an_xe_step_waits_for_the_device_once_at_its_end(decoder):
    count = step_syncs(decoder, "xe", max_len=8)
    assert count.syncs == 1, count.where()
    assert [w.split(" ")[0].rsplit(":", 1)[0] for w in count.where()] == \
        ["trainer/training/loop.py"]  # its statistics, brought to the host together


@pytest.mark.parametrize("decoder", ["top_down", "transformer"])
def test_an_scst_steps_syncs_do_not_grow_with_the_words(decoder):
    """Sampling and the greedy baseline decode word by word: neither waits for the device
    at a word (the end check reads without waiting on a GPU, the draws are copied once);
    the captions come to the host once each, for the reward, and the statistics at the end."""
    short, long = step_syncs(decoder, "scst", max_len=4), step_syncs(decoder, "scst", max_len=12)
    assert short.syncs == long.syncs == 3, long.where()
    assert long.copies == short.copies == 1  # the sampling draws, all words at once
    assert long.operators > short.operators  # while the kernels do grow with the words


def test_the_draws_copied_at_once_are_the_draws_of_each_word():
    noise = SamplingNoise((1, 2, 3), rows=10, offset=4)
    table = noise.table(5, 6, torch.device("cpu"))
    for t in range(5):
        assert torch.equal(table[t], torch.as_tensor(noise(t, 6), dtype=torch.float32))


def test_statistics_come_to_the_host_in_their_order_with_their_values():
    stats = {"loss": torch.tensor(1.25), "reward": 0.5, "xe": torch.tensor([2.0]) * 0.5,
             "time_forward": 0.1}
    assert on_host(stats) == {"loss": 1.25, "reward": 0.5, "xe": 1.0, "time_forward": 0.1}
    assert list(on_host(stats)) == list(stats)


@pytest.mark.cuda
def test_on_a_gpu_decoding_ends_without_waiting_and_samples_as_when_it_waits(monkeypatch):
    """The end check that reads without waiting may decode a few more words: only <pad> columns
    at log-probability 0, the captions and their scores those of the check that waits."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = make_decoder("top_down", tiny_decoder_config("top_down"), VOCAB, DIM).to(device)
    feats = torch.randn(IMAGES, 4, DIM, device=device)
    ctx = model.encode(feats, torch.ones(IMAGES, 4, dtype=torch.bool, device=device))
    noise = SamplingNoise((0,), IMAGES * 3)
    quick = sample(model, ctx, 20, n=3, noise=noise)
    monkeypatch.setattr(_EndCheck, "__init__", lambda self, device, words: setattr(
        self, "waits", True))
    waited = sample(model, ctx, 20, n=3, noise=noise)
    width = waited.tokens.shape[1]
    assert quick.tokens.shape[1] >= width
    assert torch.equal(quick.tokens[:, :width], waited.tokens)
    assert (quick.tokens[:, width:] == 0).all() and (quick.logprobs[:, width:] == 0).all()
    torch.testing.assert_close(quick.logprobs[:, :width], waited.logprobs)
