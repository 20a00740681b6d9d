"""train.amp: autocast on the decoders matches float32; float16's scaler; the read-ahead thread."""

from __future__ import annotations

import pytest
import torch

from pipeline.core.errors import CapstackError
from trainer.checkpoint import load_checkpoint
from trainer.config import load_experiment
from trainer.decoders import DECODERS
from trainer.precision import Precision, autocast_dtype
from trainer.read_ahead import _Reader, read_ahead
from trainer.train import train
from trainer_fixtures import (make_decoder, mean_xe, teacher_forced,
                              tiny_decoder_config, write_experiment)

CPU = torch.device("cpu")


def xe_and_gradients(model, feats, mask, captions, precision: Precision):
    model.zero_grad()
    with precision.autocast():
        out = teacher_forced(model, feats, mask, captions, seq_per_img=2)
        loss = mean_xe(out.logits, captions[:, 1:])
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                           if p.grad is not None}


@pytest.mark.parametrize("name", sorted(name for name, _ in DECODERS.items()))
def test_bfloat16_autocast_on_the_cpu_matches_float32(name):
    """Every decoder's XE loss and gradients under CPU bfloat16 autocast are float32's within
    bfloat16's rounding (8 bits of mantissa: a relative 2^-8 per product)."""
    torch.manual_seed(0)
    model = make_decoder(name, tiny_decoder_config(name), 20, 16).eval()  # no dropout draws
    feats, mask = torch.rand(3, 4, 16), torch.ones(3, 4, dtype=torch.bool)
    captions = torch.randint(4, 20, (6, 7))
    captions[:, 0] = 1
    exact = xe_and_gradients(model, feats, mask, captions, Precision("off", CPU))
    cast = xe_and_gradients(model, feats, mask, captions, Precision("bfloat16", CPU))
    assert cast[0].dtype == torch.float32  # the loss is reduced in float32
    torch.testing.assert_close(cast[0], exact[0], rtol=2e-2, atol=0)
    total = sum(g.norm() ** 2 for g in exact[1].values()) ** 0.5
    difference = sum((cast[1][n] - g).norm() ** 2 for n, g in exact[1].items()) ** 0.5
    assert difference / total < 5e-2, f"{name}: gradients {difference / total:.3f} apart"


def test_auto_casts_on_cuda_only():
    assert autocast_dtype("auto", CPU) is None
    assert autocast_dtype("auto", torch.device("cuda")) is torch.bfloat16
    assert autocast_dtype("float16", CPU) is torch.float16 and autocast_dtype("off", CPU) is None


def test_a_cpu_run_trains_in_float16_with_a_scaler_and_resumes_with_it(small_data, tmp_path):
    prepared, grid = small_data
    path = write_experiment(tmp_path / "fp16.yaml", decoder="top_down", captions=prepared,
                            features=[grid], epochs=2, amp="float16")
    train(load_experiment(path, ["train.epochs=1"]), tmp_path / "run", progress=False)
    saved = load_checkpoint(tmp_path / "run" / "last.pt")
    assert saved["precision"]["scaler"]["scale"] > 0
    resumed = train(load_experiment(path), tmp_path / "run", progress=False)
    assert resumed.resumed_at == (1, 0) and resumed.epochs == 2


def test_float16_is_refused_beside_an_objective_s_own_optimiser(small_data, tmp_path):
    prepared, grid = small_data
    path = write_experiment(tmp_path / "hacap.yaml", decoder="hacap", captions=prepared,
                            features=[grid], amp="float16",
                            objective={"name": "interleaved_pretraining"})
    with pytest.raises(CapstackError, match="train.amp: float16 .* discriminator .* bfloat16"):
        train(load_experiment(path), tmp_path / "run", progress=False)


def test_amp_true_and_false_read_as_auto_and_off(small_data, tmp_path):
    prepared, grid = small_data
    for old, now in ((True, "auto"), (False, "off")):
        path = write_experiment(tmp_path / f"{old}.yaml", decoder="show_tell",
                                captions=prepared, features=[grid], amp=old)
        assert load_experiment(path).train.amp == now
    with pytest.raises(CapstackError, match="train.amp: expected one of auto, bfloat16"):
        load_experiment(path, ["train.amp=half"])


class Pinned(int):
    def pin_memory(self):
        return Pinned(self + 1000)


def test_the_reader_thread_keeps_the_order_and_pins_each_batch():
    assert list(_Reader(iter(map(Pinned, range(5))), depth=2)) == [1000, 1001, 1002, 1003, 1004]


def test_the_reader_thread_raises_the_batches_error_in_the_loop():
    def failing():
        yield Pinned(0)
        raise CapstackError("store.lmdb: record of image 7 is missing")

    reader = _Reader(failing(), depth=2)
    with pytest.raises(CapstackError, match="image 7 is missing"):
        list(reader)
    reader.close()


def test_the_reader_thread_stops_when_the_loop_stops():
    made = []

    def endless():
        while True:
            made.append(len(made))
            yield Pinned(made[-1])

    loop = read_ahead(endless(), torch.device("cuda"), depth=2)
    assert [next(loop) for _ in range(3)] == [1000, 1001, 1002]
    loop.close()  # the training loop left: its thread is joined, no batch made after
    assert len(made) <= 3 + 2 + 1


def test_a_cpu_run_reads_in_its_own_thread():
    batches = iter([1, 2, 3])
    assert list(read_ahead(batches, CPU)) == [1, 2, 3]
