"""Ensembles (trainer/ensemble.py): the mean of the members' probabilities at every step, under
every search; one member is that member exactly; runs of another vocabulary or other features
are refused, by the command line, naming both."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from click.testing import CliRunner

from pipeline.captions.vocab import BOS_ID, EOS_ID, PAD_ID, Vocabulary
from trainer.decoding import beam_search, greedy, sample
from trainer.decoders.base import Decoder, per_row
from trainer.decoding import DecodingConfig, decode
from trainer.ensemble import Ensemble, mean_probability_logits

WORDS = ["a", "dog", "cat", "grass"]
VOCAB = Vocabulary(WORDS)
ID = VOCAB.wtoi
V = len(VOCAB)
TINY = -30.0  # the logit of a word a hand-built decoder all but forbids


class Timed(Decoder):
    """Next-word probabilities set by hand per step t alone; <eos> once they run out."""

    has_attention = False

    def __init__(self, steps: list[dict]):
        super().__init__(None, V, 1)
        self.table = torch.full((len(steps) + 1, V), TINY)
        self.table[len(steps), EOS_ID] = 0.0
        for t, nexts in enumerate(steps):
            for word, p in nexts.items():
                self.table[t, ID[word]] = math.log(p)

    def encode(self, feats, mask):
        return {"image": feats[:, 0, 0]}

    def init_state(self, ctx, rows):
        return (torch.zeros(rows, dtype=torch.long),)

    def step(self, words, state, ctx):
        t = state[0].clamp(max=self.table.shape[0] - 1)
        return self.table[t].clone(), (state[0] + 1,), None


class RandomMarkov(Decoder):
    """Random next-word logits per (image, previous word), two state tensors: any search's
    captions differ from image to image and step to step."""

    has_attention = False

    def __init__(self, seed: int, images: int = 3):
        super().__init__(None, V, 1)
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(images, V, V, generator=g) * 2

    def encode(self, feats, mask):
        return {"image": feats[:, 0, 0].long(), "unused": feats[:, :, 0]}

    def init_state(self, ctx, rows):
        image = per_row(ctx["image"], rows)
        return image, torch.zeros(rows)

    def step(self, words, state, ctx):
        return self.table[state[0], words], (state[0], state[1] + 1), None


def context(model: Decoder, images: int = 1):
    feats = torch.arange(images, dtype=torch.float32)[:, None, None]
    return model.encode(feats, torch.ones(images, 1, dtype=torch.bool))


def words_of(decoded) -> list[list[str]]:
    return [VOCAB.decode(row) for row in decoded.tokens.tolist()]


# ------------------------------------------------------------------------ the rule


def test_two_members_average_probabilities_not_log_probabilities():
    # step 0: A says dog 0.9, cat 0.1; B says dog 0.01, cat 0.6, grass 0.39. The mean of the
    # probabilities is dog 0.455, cat 0.35, grass 0.195: dog. The mean of the log-probabilities
    # (and of the logits) would pick cat: sqrt(0.9 * 0.01) = 0.095 < sqrt(0.1 * 0.6) = 0.245.
    a = Timed([{"dog": 0.9, "cat": 0.1}])
    b = Timed([{"dog": 0.01, "cat": 0.6, "grass": 0.39}])
    both = Ensemble([a, b])
    ctx = context(both)
    for decoded in (greedy(both, ctx, 5), beam_search(both, ctx, 3, 5),
                    decode(both, ctx, DecodingConfig(beam_size=3, block_trigrams=True))):
        assert words_of(decoded) == [["dog"]]
        # log 0.455 for dog, then <eos> certain in both (log 1 = 0), up to the members' TINY
        assert decoded.logprobs[0, 0].item() == pytest.approx(math.log(0.455), abs=1e-6)
        assert decoded.scores.item() == pytest.approx(math.log(0.455), abs=1e-6)
        assert decoded.alphas is None  # an ensemble draws no attention


def test_the_combined_logits_are_the_log_of_the_mean_distribution():
    g = torch.Generator().manual_seed(0)
    logits = [torch.randn(4, 9, generator=g) * 3 for _ in range(3)]
    mean = sum(torch.softmax(x, 1) for x in logits) / 3
    assert torch.allclose(mean_probability_logits(logits), mean.log(), atol=1e-6)
    assert torch.allclose(mean_probability_logits(logits).exp().sum(1), torch.ones(4))


def test_no_probability_underflows_in_the_mean():
    far = torch.tensor([[0.0, -200.0]])  # e^-200 is 0 in float32 after a softmax
    combined = mean_probability_logits([far, far.flip(1)])
    assert torch.allclose(combined, torch.tensor([[math.log(0.5), math.log(0.5)]]))


# ------------------------------------------------------------------- one member


OPTIONS = [DecodingConfig(), DecodingConfig(beam_size=1),
           DecodingConfig(search="greedy", no_repeats=True),
           DecodingConfig(beam_size=4, n=3, length_penalty="wu_0.2"),
           DecodingConfig(beam_size=4, block_trigrams=True, temperature=0.7),
           DecodingConfig(search="diverse", beam_size=4, group_size=2, n=4),
           DecodingConfig(search="greedy", sample_method="sample", top_p=0.8, n=3),
           DecodingConfig(search="greedy", sample_method="gumbel", top_k=3, temperature=1.5),
           DecodingConfig(search="greedy", sample_method="sample", n=2)]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: o.describe() or "defaults")
@pytest.mark.parametrize("seed", range(2))
def test_an_ensemble_of_one_decodes_as_its_member_exactly(options, seed):
    member = RandomMarkov(seed)
    one = Ensemble([member])
    torch.manual_seed(7)
    alone = decode(member, context(member, 3), options, VOCAB)
    torch.manual_seed(7)
    ensembled = decode(one, context(one, 3), options, VOCAB)
    assert torch.equal(alone.tokens, ensembled.tokens)
    assert torch.equal(alone.logprobs, ensembled.logprobs)


def real_decoders(vocab_size=12, feature_dim=8):
    from trainer_fixtures import make_decoder, tiny_decoder_config

    torch.manual_seed(0)
    return [make_decoder(name, tiny_decoder_config(name), vocab_size, feature_dim).eval()
            for name in ("top_down", "transformer")]


def features(images=3, locations=5, dim=8):
    g = torch.Generator().manual_seed(1)
    return torch.randn(images, locations, dim, generator=g), torch.ones(images, locations,
                                                                        dtype=torch.bool)


@torch.no_grad()
def test_an_ensemble_of_one_real_decoder_is_it_under_beam_and_sampling():
    top_down = real_decoders()[0]
    one = Ensemble([top_down])
    feats, mask = features()
    for search in (lambda m, c: beam_search(m, c, 3, 8), lambda m, c: greedy(m, c, 8),
                   lambda m, c: sample(m, c, 8, n=2)):
        torch.manual_seed(3)
        alone = search(top_down, top_down.encode(feats, mask))
        torch.manual_seed(3)
        ensembled = search(one, one.encode(feats, mask))
        assert torch.equal(alone.tokens, ensembled.tokens)
        assert torch.equal(alone.logprobs, ensembled.logprobs)


@torch.no_grad()
def test_decoders_of_different_types_decode_together_under_every_search():
    members = real_decoders()
    both = Ensemble(members)
    feats, mask = features()
    ctx = both.encode(feats, mask)
    # the first step's distribution is the members' mean
    state = both.init_state(ctx, 3)
    words = torch.full((3,), BOS_ID)
    logits, _, alpha = both.step(words, state, ctx)
    expected = sum(torch.softmax(m.step(words, m.init_state(m.encode(feats, mask), 3),
                                        m.encode(feats, mask))[0], 1) for m in members) / 2
    assert alpha is None and torch.allclose(logits.exp(), expected, atol=1e-6)
    for options in OPTIONS:
        decoded = decode(both, ctx, options)
        assert decoded.tokens.shape[0] == 3 * options.n
        assert ((decoded.tokens >= 0) & (decoded.tokens < 12)).all()
        ended = (decoded.tokens == EOS_ID).any(1) | (decoded.tokens[:, -1] != PAD_ID)
        assert ended.all()


def test_an_ensemble_needs_one_vocabulary_size_and_a_member():
    with pytest.raises(ValueError, match="at least one"):
        Ensemble([])
    with pytest.raises(ValueError, match="one vocabulary"):
        Ensemble([RandomMarkov(0), real_decoders()[0]])


# ----------------------------------------------------------- runs and the command line


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny trained runs: top_down and transformer on one vocabulary and store; a run of
    another vocabulary (the same images, words seen twice or more kept); a run of other
    features (another store of the same images)."""
    from pipeline.captions.prepare import prepare_captions
    from pipeline.captions.prepared import load_captions
    from trainer.config import load_experiment
    from trainer.train import train
    from trainer_fixtures import make_prepared, write_experiment, write_feature_store

    root = tmp_path_factory.mktemp("ensemble")
    dataset, prepared = make_prepared(root, n_train=10, n_val=4, n_test=3)
    grid = write_feature_store(root / "grid.lmdb", load_captions(prepared).image_ids)
    other_grid = write_feature_store(root / "other.lmdb", load_captions(prepared).image_ids,
                                     seed=5, fingerprint="0ther5")
    smaller = root / "smaller"
    prepare_captions(dataset, smaller, min_count=3, max_len=16)
    assert len(load_captions(smaller).vocab) != len(load_captions(prepared).vocab)
    made = {}
    for name, decoder, captions, store in (
            ("top_down", "top_down", prepared, grid),
            ("transformer", "transformer", prepared, grid),
            ("other_vocab", "top_down", smaller, grid),
            ("other_features", "top_down", prepared, other_grid)):
        experiment = write_experiment(root / f"{name}.yaml", decoder=decoder, captions=captions,
                                      features=[store], epochs=1)
        train(load_experiment(experiment), root / "runs" / name, progress=False)
        made[name] = root / "runs" / name
    return made


def invoke(*args):
    from cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize("command", ["evaluate", "caption"])
def test_mixed_vocabularies_are_refused_naming_both_runs(runs, tmp_path, command):
    a, b = runs["top_down"], runs["other_vocab"]
    image = tmp_path / "image.png"
    image.write_bytes(b"")
    args = (["evaluate", a, b, "--ensemble", "--out", tmp_path / "out"] if command == "evaluate"
            else ["caption", "--checkpoint", a, "--checkpoint", b, "--ensemble", image])
    out = invoke(*args)
    assert out.exit_code != 0
    assert f"ensemble: {a} and {b} have different vocabularies" in out.output
    assert "words against" in out.output or "word id" in out.output
    assert not (tmp_path / "out" / "metrics.json").exists()


def test_mixed_features_are_refused_naming_both_runs_and_what_differs(runs, tmp_path):
    a, b = runs["top_down"], runs["other_features"]
    out = invoke("evaluate", a, b, "--ensemble", "--out", tmp_path / "out")
    assert out.exit_code != 0
    assert (f"ensemble: {a} and {b} read different features: stores (fingerprints) "
            f"['feedbeef'] in {a}, ['0ther5'] in {b}") in out.output


def test_several_runs_without_ensemble_are_refused(runs, tmp_path):
    out = invoke("evaluate", runs["top_down"], runs["transformer"], "--out", tmp_path / "o")
    assert out.exit_code == 2 and "add --ensemble to decode them as one" in out.output
    image = tmp_path / "image.png"
    image.write_bytes(b"")
    out = invoke("caption", "--checkpoint", runs["top_down"], "--checkpoint",
                 runs["transformer"], image)
    assert out.exit_code == 2 and "add --ensemble" in out.output
    out = invoke("caption", "--checkpoint", runs["top_down"], "--ensemble", "--attention",
                 tmp_path / "a.png", image)
    assert out.exit_code == 2 and "an ensemble draws no attention" in out.output


@pytest.mark.slow
def test_evaluating_an_ensemble_writes_its_own_row(runs, tmp_path):
    from trainer.evaluation.evaluate import evaluate_checkpoint
    from trainer.evaluation.evaluations import recipe_digest
    from trainer.evaluation.report import write_report

    alone = evaluate_checkpoint(runs["top_down"], tmp_path / "alone", figures=0, spice=False)
    one = evaluate_checkpoint([runs["top_down"]], tmp_path / "one", figures=0, spice=False)
    assert (tmp_path / "one" / "results_test.json").read_text() == \
        (tmp_path / "alone" / "results_test.json").read_text()
    assert one["metrics"] == alone["metrics"]
    assert one["setting"] == {**alone["setting"], "ensemble": 1}
    two = evaluate_checkpoint([runs["top_down"], runs["transformer"]], tmp_path / "two",
                              figures=1, spice=False)
    assert two["approach"] == "ensemble: top_down+transformer"
    assert two["setting"]["run"] == f"{runs['top_down']}+{runs['transformer']}"
    assert two["setting"]["decoder"] == "top_down+transformer"
    assert two["setting"]["ensemble"] == 2 and len(two["checkpoint"]) == 2
    # its recipe: each run's, so that two ensembles merge over seeds only of the same runs
    assert two["recipe"][0] == alone["recipe"] and len(two["recipe"]) == 2
    assert two["setting"]["recipe"] == "+".join(recipe_digest(r) for r in two["recipe"])
    assert not (tmp_path / "two" / "attention").exists()
    _, md = write_report([tmp_path / d / "metrics.json" for d in ("alone", "two")],
                         tmp_path / "report")
    rows = [line for line in md.read_text().splitlines() if line.startswith("| ")]
    assert len(rows) == 3  # the header, two rows
    assert any("ensemble: top_down+transformer" in r and "| 2 |" in r for r in rows)


@pytest.mark.slow
def test_the_command_line_evaluates_an_ensemble_beside_the_first_run(runs):
    out = invoke("evaluate", runs["top_down"], runs["transformer"], "--ensemble", "--figures", 0,
                 "--n", 2)
    assert out.exit_code == 0, out.output
    from trainer.evaluation.ensembles import members_digest

    digest = members_digest([runs["top_down"], runs["transformer"]])
    folder = runs["top_down"].parent.parent / "evals" / f"ensemble-top_down+transformer-{digest}"
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["setting"]["ensemble"] == 2
    assert metrics["diversity"]["n_best"]["n"] == 2
    shutil.rmtree(folder)


def test_an_ensembles_default_folder_is_its_members_own(tmp_path):
    """Runs of the same folder names in other places (seeds of one experiment), and names holding
    the joining '+', gave two ensembles one folder, the second replacing the first."""
    from trainer.commands.evaluation import ensemble_folder
    from trainer.runs import evaluation_folder

    def folder(*runs):
        return ensemble_folder([tmp_path / r for r in runs], evaluation_folder)

    seed1, seed2 = folder("runs/st", "exps/seed1/runs/st"), folder("runs/st", "exps/seed2/runs/st")
    assert seed1 != seed2
    assert seed1.parent == seed2.parent == tmp_path / "evals"
    assert seed1.name.startswith("ensemble-st+st-")
    assert len(seed1.name) == len("ensemble-st+st-") + 8
    assert folder("runs/a+b", "runs/c") != folder("runs/a", "runs/b+c")
    assert folder("runs/st", "runs/x") != folder("runs/x", "runs/st")  # the first leads
    (tmp_path / "runs/st").mkdir(parents=True)
    (tmp_path / "runs/st/best.pt").touch()
    assert folder("runs/st", "runs/x") == ensemble_folder(
        [tmp_path / "runs/st/best.pt", tmp_path / "runs/x"], evaluation_folder)


def test_an_evaluation_of_other_runs_is_never_replaced_by_an_ensembles(runs, tmp_path):
    from pipeline.core.errors import CapstackError
    from trainer.evaluation.evaluate import evaluate_checkpoint

    out = tmp_path / "eval"
    evaluate_checkpoint([runs["top_down"], runs["transformer"]], out, figures=0, spice=False)
    before = (out / "metrics.json").read_bytes()
    with pytest.raises(CapstackError, match="eval: holds the evaluation of .*top_down.*"
                                            "transformer.*, not of this ensemble's runs"):
        evaluate_checkpoint([runs["transformer"], runs["top_down"]], out, figures=0, spice=False)
    assert (out / "metrics.json").read_bytes() == before
    again = evaluate_checkpoint([runs["top_down"] / "best.pt", runs["transformer"]], out,
                                figures=0, spice=False, beam_size=1)  # the same members
    assert again["beam_size"] == 1
