"""A command's decode under Ctrl-C and SIGTERM (ends at once, in one line, writing nothing), its
progress bar on a terminal, and evaluate writing every caption of n with its rank."""

from __future__ import annotations

import io
import json
import os
import re
import signal
from functools import partial
from dataclasses import asdict

import pytest
import torch
from click.testing import CliRunner

from decoding_models import VOCAB, Markov, Random, options
from pipeline.core.errors import CapstackError
from trainer.batch import EvalBatch
from trainer.config import load_experiment
from trainer.bounds import MAX_CAPTION_WORDS
from trainer.decoding import DecodingConfig, decode
from trainer.evaluation.predict import predict


# ------------------------------------------------------------------------- progress, Ctrl-C


def batches(images: int, per_batch: int = 2) -> list[EvalBatch]:
    return [EvalBatch(list(range(start, min(start + per_batch, images))),
                      torch.arange(start, min(start + per_batch, images), dtype=torch.float32)
                      [:, None, None], torch.ones(min(per_batch, images - start), 1,
                                                  dtype=torch.bool), None)
            for start in range(0, images, per_batch)]


class Signalled(Markov):
    """Random(0)'s table; sends itself ``signum`` at its ``at``-th step and counts the steps
    run after it (a decode honouring the signal at once runs none)."""

    def __init__(self, signum: int, at: int):
        super().__init__(Random(0, images=6).table)
        self.signum, self.at, self.steps, self.after = signum, at, 0, 0

    def step(self, words, state, ctx):
        self.steps += 1
        if self.steps == self.at:
            os.kill(os.getpid(), self.signum)
        elif self.steps > self.at:
            self.after += 1
        return super().step(words, state, ctx)


@pytest.fixture
def default_sigint():
    """Python's own Ctrl-C handler (KeyboardInterrupt), whatever the test runner set."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("how", [dict(beam_size=3), dict(beam_size=3, block_trigrams=True),
                                 dict(search="greedy", sample_method="sample", n=2)])
def test_a_ctrl_c_ends_a_commands_decode_at_once_in_one_line(default_sigint, how):
    """Batches of 2 images; the Ctrl-C comes while the second batch decodes."""
    config = options(max_len=20, **how)
    torch.manual_seed(0)
    first = Signalled(signal.SIGINT, at=10 ** 6)  # never: how many steps the first batch takes
    predict(first, VOCAB, batches(2), torch.device("cpu"), config)
    torch.manual_seed(0)
    model = Signalled(signal.SIGINT, at=first.steps + 2)
    with pytest.raises(CapstackError, match=r"^interrupted \(Ctrl-C\) while decoding, after 2 "
                                            r"of 6 images: nothing written$"):
        predict(model, VOCAB, batches(6), torch.device("cpu"), config, progress=6)
    assert model.after == 0
    # a decode that is no command's (a training's validation) is interrupted as it was
    model = Signalled(signal.SIGINT, at=3)
    with pytest.raises(KeyboardInterrupt):
        predict(model, VOCAB, batches(6), torch.device("cpu"), config)
    assert model.after == 0


def test_sigterm_passes_through_a_commands_decode_at_once():
    from cli import Terminated, stop_on_sigterm

    before = signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        model = Signalled(signal.SIGTERM, at=4)
        with pytest.raises(Terminated, match="stopped by SIGTERM"):
            predict(model, VOCAB, batches(6), torch.device("cpu"), options(beam_size=3), progress=6)
        assert model.after == 0
    finally:
        signal.signal(signal.SIGTERM, before)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_commands_decode_shows_a_progress_bar_over_the_images_on_a_terminal(monkeypatch):
    import trainer.evaluation.predict as predicting

    monkeypatch.setattr(predicting, "tqdm", partial(predicting.tqdm, mininterval=0))
    model, config = Random(0, images=6), options(beam_size=3)
    for stderr, shown in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr("sys.stderr", stderr)
        preds = predict(model, VOCAB, batches(6), torch.device("cpu"), config,
                        progress=6)
        assert [p.image_id for p in preds] == list(range(6))
        bar = stderr.getvalue()
        assert all(f"decode: {percent:>3}%" in bar and f"| {n}/6 [" in bar
                   for n, percent in ((0, 0), (2, 33), (4, 67), (6, 100))) == shown
        assert (bar == "") == (not shown)
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    predict(model, VOCAB, batches(6), torch.device("cpu"), config)  # no command's
    assert terminal.getvalue() == ""


@pytest.fixture(scope="module")
def checkpoint(small_data, tmp_path_factory):
    from trainer.train import train
    from trainer_fixtures import write_experiment

    root = tmp_path_factory.mktemp("decoding")
    prepared, grid = small_data
    experiment = write_experiment(root / "exp.yaml", decoder="show_tell", captions=prepared,
                                  features=[grid], epochs=1)
    train(load_experiment(experiment), root / "run", progress=False)
    return root / "run"


@pytest.mark.slow
def test_evaluate_writes_every_caption_with_its_rank_and_scores_the_first(checkpoint, tmp_path):
    from trainer.evaluation.evaluate import evaluate_checkpoint

    one = evaluate_checkpoint(checkpoint, tmp_path / "one", figures=0, spice=False)
    results_one = json.loads((tmp_path / "one" / "results_test.json").read_text())
    assert all(set(r) == {"image_id", "caption"} for r in results_one)
    assert one["setting"]["decoding"] == ""
    three = evaluate_checkpoint(checkpoint, tmp_path / "three", figures=0, spice=False,
                                decoding={"beam_size": 3, "n": 3})
    results = json.loads((tmp_path / "three" / "results_test.json").read_text())
    assert [r["rank"] for r in results] == [1, 2, 3] * len(results_one)
    firsts = [r for r in results if r["rank"] == 1]
    beam3 = evaluate_checkpoint(checkpoint, tmp_path / "beam3", figures=0, spice=False,
                                beam_size=3)
    assert firsts == [{**r, "rank": 1} for r in json.loads(
        (tmp_path / "beam3" / "results_test.json").read_text())]
    assert three["metrics"] == beam3["metrics"]  # rank 1 is what is scored
    assert three["n"] == 3 and three["setting"]["decoding"] == "n=3"
    whole = evaluate_checkpoint(checkpoint, tmp_path / "whole", figures=0, spice=False,
                                decoding=DecodingConfig(beam_size=2, block_trigrams=True))
    assert whole["beam_size"] == 2 and whole["block_trigrams"]
    with pytest.raises(CapstackError, match="capstack evaluate: eval.top_p: the nucleus"):
        evaluate_checkpoint(checkpoint, tmp_path / "no", decoding={"top_p": 0.9})
    assert asdict(DecodingConfig()).keys() <= one.keys()


@pytest.mark.slow
@pytest.mark.parametrize("signum, exit_code, message", [
    (signal.SIGINT, 1, r"Error: interrupted \(Ctrl-C\) while decoding, after 0 of \d+ images: "
                       r"nothing written"),
    (signal.SIGTERM, 143, r"Error: stopped by SIGTERM: ")])
def test_evaluate_stopped_while_decoding_ends_at_once_writing_nothing(
        checkpoint, tmp_path, monkeypatch, default_sigint, signum, exit_code, message):
    """The widest, longest decode the bounds allow, stopped at its third step."""
    import trainer.evaluation.predict as predicting
    from cli import main

    steps = []

    def signalling(model, ctx, config, vocab=None):
        step = model.step

        def counted(*args):
            steps.append(len(steps))
            if len(steps) == 3:
                os.kill(os.getpid(), signum)
            return step(*args)

        monkeypatch.setattr(model, "step", counted)
        return decode(model, ctx, config, vocab)

    monkeypatch.setattr(predicting, "decode", signalling)
    before = signal.getsignal(signal.SIGTERM)
    try:
        out = CliRunner().invoke(main, ["evaluate", str(checkpoint), "--out", str(tmp_path / "e"),
                                        "--beam", "100", "--max-len", str(MAX_CAPTION_WORDS),
                                        "--block-trigrams", "--figures", "0"])
    finally:
        signal.signal(signal.SIGTERM, before)
    assert out.exit_code == exit_code, out.output
    assert len(steps) == 3  # not one step more
    assert len(out.output.strip().splitlines()) == 1
    assert re.match(message, out.output.strip()), out.output
    assert not (tmp_path / "e").exists()
