"""``capstack import-checkpoint rtl``: self-critical.pytorch checkpoints as capstack runs.

The checkpoints are made here without the peer's code (tests/rtl_fixtures.py: its parameter
names and shapes, random weights); benchmarks/peer_parity/checkpoints.py runs its own code."""

from __future__ import annotations

import errno
import json
import os
import pickle
import random
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from pipeline.captions.prepared import load_captions
from pipeline.captions.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from rtl_fixtures import peer_options, transformer_state, updown_state, write_peer_checkpoint
from trainer.checkpoint import load_checkpoint
from trainer.config import load_experiment
from trainer.decoders.transformer import UnbiasedStdNorm
from trainer.decoding import DecodingConfig, decode
from trainer.evaluation.evaluate import evaluate_checkpoint, load_model
from trainer.train import train
from trainer_fixtures import make_prepared, write_feature_store

DIM = 10


@pytest.fixture
def rtl_data(tmp_path):
    """(prepared folder, region store, the peer's words: capstack's shuffled, UNK last)."""
    _, prepared = make_prepared(tmp_path, n_train=8, n_val=3, n_test=3, seed=4)
    captions = load_captions(prepared)
    store = write_feature_store(tmp_path / "regions.lmdb", captions.image_ids, kind="regions",
                                dim=DIM)
    words = captions.vocab.itow[UNK_ID + 1:]
    random.Random(0).shuffle(words)
    return prepared, store, words + ["UNK"]


def imported(capstack, tmp_path, rtl_data, name, state, words=None, expect_ok=True, **options):
    prepared, store, peer_words = rtl_data
    sources = write_peer_checkpoint(tmp_path / f"peer_{name}", state, words or peer_words,
                                    peer_options(name, **options))
    run = tmp_path / f"run_{name}"
    result = capstack("import-checkpoint", "rtl", *sources, "--out", run, "--captions", prepared,
                      "--features", store, expect_ok=expect_ok)
    return run, result


def lstm_cell(x, h, c, s, name):
    gates = x @ s[f"{name}.weight_ih"].T + s[f"{name}.bias_ih"] + h @ s[f"{name}.weight_hh"].T \
        + s[f"{name}.bias_hh"]
    i, f, g, o = gates.chunk(4, 1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def peer_updown(s, feats, mask, words):
    """UpDown's log-probabilities at each word fed, written from its AttModel.py (UpDownCore,
    Attention, get_logprobs_state) in eval mode: [B, T, V + 1]."""
    def linear(x, name):
        return x @ s[f"{name}.weight"].T + s[f"{name}.bias"]

    m = mask.to(feats.dtype)
    att = torch.relu(linear(feats, "att_embed.0"))
    fc = torch.relu(linear((feats * m[..., None]).sum(1) / m.sum(1, keepdim=True), "fc_embed.0"))
    p_att = linear(att, "ctx2att")
    h = torch.zeros(feats.shape[0], s["logit.weight"].shape[1])
    h_att = c_att = h_lang = c_lang = h
    out = []
    for t in range(words.shape[1]):
        xt = torch.relu(s["embed.0.weight"][words[:, t]])
        h_att, c_att = lstm_cell(torch.cat([h_lang, fc, xt], 1), h_att, c_att, s,
                                 "core.att_lstm")
        dot = linear(torch.tanh(p_att + linear(h_att, "core.attention.h2att")[:, None]),
                     "core.attention.alpha_net").squeeze(-1)
        weight = torch.softmax(dot, 1) * m
        weight = weight / weight.sum(1, keepdim=True)
        attended = (weight[..., None] * att).sum(1)
        h_lang, c_lang = lstm_cell(torch.cat([attended, h_att], 1), h_lang, c_lang, s,
                                   "core.lang_lstm")
        out.append(torch.log_softmax(linear(h_lang, "logit"), 1))
    return torch.stack(out, 1)


def test_updown_matches_its_equations_evaluates_and_starts_a_run(capstack, tmp_path, rtl_data):
    prepared, store, words = rtl_data
    state = updown_state(len(words), DIM)
    run, result = imported(capstack, tmp_path, rtl_data, "updown", state)
    assert "top_down decoder" in result.output
    ckpt = load_checkpoint(run)
    assert ckpt["experiment"]["decoder"]["word_activation"] == "relu"
    assert ckpt["imported"]["caption_model"] == "updown" and ckpt["table"]["training"] == "XE"
    model, vocab, _ = load_model(ckpt)
    g = torch.Generator().manual_seed(0)
    feats = torch.rand(3, 4, DIM, generator=g)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    peer_ids = torch.randint(1, len(words) + 1, (3, 5), generator=g)
    peer_ids[:, 0] = 0  # its <bos>
    index = {w: i for i, w in enumerate(words, start=1)}
    peer_of = [0 if i == EOS_ID else index["UNK"] if i == UNK_ID else index.get(w, -1)
               for i, w in enumerate(vocab.itow)]
    ours_of = {p: i for i, p in enumerate(peer_of) if p >= 0}
    ours_of[0] = BOS_ID
    captions = torch.tensor([[ours_of[int(t)] for t in row] + [EOS_ID] for row in peer_ids])
    with torch.no_grad():
        mine = torch.log_softmax(model(model.encode(feats, mask), captions).logits, -1)
    theirs = peer_updown(state, feats, mask, peer_ids)
    kept = torch.tensor([p >= 0 for p in peer_of])
    assert torch.allclose(mine[..., kept], theirs[..., torch.tensor(peer_of)[kept]], atol=1e-5)
    assert mine[..., [PAD_ID, BOS_ID]].exp().max() == 0  # tokens it never predicts

    metrics = evaluate_checkpoint(run, tmp_path / "evals", figures=0, beam_size=2, spice=False)
    assert metrics["images"] == 3 and metrics["training"] == "XE"
    experiment = {**ckpt["experiment"], "name": "finetune"}
    experiment["train"] = {**experiment["train"], "epochs": 1, "batch_size": 4,
                           "init_from": str(run)}
    experiment["data"] = {**experiment["data"], "seq_per_img": 2}
    experiment["eval"] = {**experiment["eval"], "figures": 0, "beam_size": 2}
    (tmp_path / "finetune.yaml").write_text(yaml.safe_dump(experiment))
    result = train(load_experiment(tmp_path / "finetune.yaml"), tmp_path / "finetune",
                   progress=False)
    assert result.epochs == 1 and (tmp_path / "finetune" / "best.pt").is_file()


def test_transformer_maps_eos_and_unk_and_decodes(capstack, tmp_path, rtl_data):
    _, _, words = rtl_data
    state = transformer_state(len(words), DIM)
    run, result = imported(capstack, tmp_path, rtl_data, "transformer", state)
    assert "transformer decoder" in result.output
    model, vocab, config = load_model(load_checkpoint(run))
    assert config.decoder.config.layer_norm == "unbiased_std"
    assert isinstance(model.decoder_norm, UnbiasedStdNorm)
    feats, mask = torch.rand(2, 3, DIM), torch.ones(2, 3, dtype=torch.bool)
    with torch.no_grad():
        ctx = model.encode(feats, mask)
        for options in ({"beam_size": 1}, {"beam_size": 3}, {"search": "diverse",
                                                             "beam_size": 4, "group_size": 2}):
            decoded = decode(model, ctx, DecodingConfig(max_len=6, **options), vocab)
            assert decoded.tokens.shape[0] == 2
            assert not torch.isin(decoded.tokens, torch.tensor([BOS_ID, UNK_ID])).any()
    for row, expected in ((0, EOS_ID), (len(words), UNK_ID)):  # its <eos>, its UNK
        loud = {**state, "model.generator.proj.bias": state["model.generator.proj.bias"].clone()}
        loud["model.generator.proj.bias"][row] = 100.0
        run, _ = imported(capstack, tmp_path / f"row{row}", rtl_data, "transformer", loud)
        model, vocab, _ = load_model(load_checkpoint(run))
        with torch.no_grad():
            decoded = decode(model, model.encode(feats, mask), DecodingConfig(beam_size=1), vocab)
        assert (decoded.tokens[:, 0] == expected).all()


class Runs:
    """A pickle that would run a command when loaded by pickle.load."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_refusals_name_what_is_refused(capstack, tmp_path, rtl_data):
    prepared, store, words = rtl_data
    state = updown_state(len(words), DIM)
    _, result = imported(capstack, tmp_path / "a", rtl_data, "att2in2", state, expect_ok=False)
    assert result.exit_code != 0
    assert "opt.caption_model is 'att2in2'" in result.output
    assert "updown, topdown, transformer" in result.output

    _, result = imported(capstack, tmp_path / "b", rtl_data, "updown", state, use_bn=1,
                         expect_ok=False)
    assert "opt.use_bn is 1" in result.output

    fewer = [w for w in words if w != words[0]]
    _, result = imported(capstack, tmp_path / "c", rtl_data, "updown",
                         updown_state(len(fewer), DIM), words=fewer, expect_ok=False)
    assert f"not the checkpoint's: {words[0]}" in result.output

    _, result = imported(capstack, tmp_path / "d", rtl_data, "updown", updown_state(len(words), 12),
                         expect_ok=False)
    assert "features of 10 numbers, the checkpoint reads 12" in result.output

    model, infos = write_peer_checkpoint(tmp_path / "e", state, words, peer_options("updown"))
    marker = tmp_path / "ran"
    infos.write_bytes(pickle.dumps({"opt": peer_options("updown"), "vocab": {},
                                    "x": Runs(marker)}, protocol=2))
    result = capstack("import-checkpoint", "rtl", model, infos, "--out", tmp_path / "run_e",
                      "--captions", prepared, "--features", store, expect_ok=False)
    assert "refusing to unpickle posix.system" in result.output and not marker.exists()
    assert not (tmp_path / "run_e").exists()


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def edit_infos(infos: Path, **changes) -> None:
    """The infos pickle with top-level entries replaced (``epoch``, ``iter``, ``vocab``)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # pickling a deeply nested value recurses
    try:
        infos.write_bytes(pickle.dumps({**pickle.loads(infos.read_bytes()), **changes},
                                       protocol=2))
    finally:
        sys.setrecursionlimit(limit)


def refused_leaving_nothing(capstack, rtl_data, sources, run: Path, message: str) -> str:
    """The command's one line, which holds ``message``; neither ``run`` nor its parent was
    made."""
    prepared, store, _ = rtl_data
    result = capstack("import-checkpoint", "rtl", *sources, "--out", run, "--captions",
                      prepared, "--features", store, expect_ok=False)
    assert result.exit_code == 1, result.output
    assert message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not run.exists() and not run.parent.exists()
    return result.output


@pytest.mark.parametrize("name, options, changes, message", [
    ("updown", {"max_length": "abc"}, {},
     "opt.max_length is 'abc': expected a whole number from 0 to 1,000,000,000"),
    ("updown", {"drop_prob_lm": float("nan")}, {},
     "opt.drop_prob_lm is nan: expected a dropout rate"),
    ("transformer", {"dropout": float("inf")}, {}, "opt.dropout is inf: expected a dropout rate"),
    ("updown", {"drop_prob_lm": 10**400}, {},
     "opt.drop_prob_lm is <an int of 1,329 bits>: expected a dropout rate"),
    ("transformer", {"num_att_heads": 10**200_000}, {},
     "opt.num_att_heads is <an int of 664,386 bits>: expected a whole number"),
    ("updown", {"seq_length": True, "max_length": None}, {}, "opt.seq_length is True"),
    ("updown", {"use_bn": np.zeros(3)}, {}, "opt.use_bn is array([0., 0., 0.]): capstack's "
                                            "decoders have no counterpart"),
    ("updown", {"caption_model": 10**5000}, {}, "opt.caption_model is <an int of 16,610 bits>"),
    ("updown", {}, {"epoch": nested(3000)}, "epoch is [[[...]]]: expected a whole number"),
    ("updown", {}, {"iter": -1}, "iter is -1: expected a whole number from 0"),
    ("updown", {}, {"vocab": {1: "a", (2,): "b", "3": "c"}},
     "vocab: keys must be the indices 1..3 as strings, got (2,), 1"),
])
def test_edited_infos_values_are_refused_naming_the_field_and_leave_no_folder(
        capstack, tmp_path, rtl_data, name, options, changes, message):
    """Values the import passed to int() and float() unchecked ('abc', NaN, a 200,000-digit
    int), and a deeply nested epoch, which went whole into the checkpoint's digest (a
    RecursionError after the run folder was made)."""
    state = (updown_state if name == "updown" else transformer_state)(len(rtl_data[2]), DIM)
    sources = write_peer_checkpoint(tmp_path / "peer", state, rtl_data[2],
                                    peer_options(**{"caption_model": name, **options}))
    edit_infos(sources[1], **changes)
    refused_leaving_nothing(capstack, rtl_data, sources, tmp_path / "runs" / "run",
                            f"{sources[1]}: {message}")


def test_only_the_settings_read_are_recorded(capstack, tmp_path, rtl_data):
    state = updown_state(len(rtl_data[2]), DIM)
    sources = write_peer_checkpoint(tmp_path / "peer", state, rtl_data[2], peer_options("updown"))
    edit_infos(sources[1], epoch=np.int64(3), histories={"loss": list(range(1000))})
    prepared, store, _ = rtl_data
    capstack("import-checkpoint", "rtl", *sources, "--out", tmp_path / "run", "--captions",
             prepared, "--features", store)
    recorded = json.loads((tmp_path / "run" / "imported.json").read_text())
    assert {k: recorded[k] for k in ("caption_model", "peer_vocab", "epoch", "iter")} == {
        "caption_model": "updown", "peer_vocab": len(rtl_data[2]), "epoch": 3, "iter": 100}
    assert "histories" not in recorded and "loader_state_dict" not in recorded
    imported = load_checkpoint(tmp_path / "run")["imported"]
    assert imported == {"format": "rtl", "decoder": "top_down", "caption_model": "updown",
                        "peer_vocab": len(rtl_data[2]), "epoch": 3, "iter": 100}
    assert type(imported["epoch"]) is int  # numpy's int64 read as the number it is


@pytest.mark.parametrize("name, edit, message", [
    ("updown", lambda s: s.update({"embed.0.weight": s["embed.0.weight"][:, 0]}),
     "embed.0.weight is of shape [{rows}]: expected 2 dimensions, none empty"),
    ("updown", lambda s: s.update({"logit.bias": s["logit.bias"][:-1]}),
     "logit.bias has {words} rows, its infos' vocab"),
    ("updown", lambda s: s.update({"ctx2att.bias": s["ctx2att.bias"][:1]}),
     "ctx2att.bias [1], core.attention.h2att.bias [8] do not fit together"),
    ("transformer", lambda s: s.update({"model.tgt_embed.1.pe": s["model.tgt_embed.1.pe"][0, 0]}),
     "model.tgt_embed.1.pe is of shape [16]: expected 3 dimensions"),
    ("transformer", lambda s: s.update({
        "model.decoder.layers.0.src_attn.linears.2.weight": torch.zeros(16, 12)}),
     "model.decoder.layers.0.src_attn.linears.1.weight [16, 16], "
     "model.decoder.layers.0.src_attn.linears.2.weight [16, 12] do not fit together"),
])
def test_weights_of_another_rank_or_shape_are_refused_naming_the_key(
        capstack, tmp_path, rtl_data, name, edit, message):
    words = rtl_data[2]
    state = (updown_state if name == "updown" else transformer_state)(len(words), DIM)
    edit(state)
    sources = write_peer_checkpoint(tmp_path / "peer", state, words, peer_options(name))
    refused_leaving_nothing(capstack, rtl_data, sources, tmp_path / "runs" / "run",
                            f"{sources[0]}: " + message.format(rows=len(words) + 1,
                                                               words=len(words)))


def test_a_pickled_object_or_a_fifo_as_a_source_is_named_in_one_line(capstack, tmp_path, rtl_data):
    words = rtl_data[2]
    model, infos = write_peer_checkpoint(tmp_path / "peer", updown_state(len(words), DIM),
                                         words, peer_options("updown"))
    torch.save({"model": peer_options("updown")}, model)  # a Namespace, not tensors
    said = refused_leaving_nothing(capstack, rtl_data, (model, infos), tmp_path / "runs" / "a",
                                   f"{model}: holds objects capstack does not load "
                                   f"(argparse.Namespace): not a plain tensor state_dict")
    assert "weights_only" not in said  # torch's advice, which would run the file's code

    def waited(signum, frame):
        raise TimeoutError("a FIFO given as a source was read")

    before = signal.signal(signal.SIGALRM, waited)
    signal.alarm(60)  # a read of the FIFO fails the test, not hangs it
    try:
        for fifo, other in ((tmp_path / "fifo.pth", infos), (tmp_path / "fifo.pkl", None)):
            os.mkfifo(fifo)
            sources = (fifo, infos) if other else (model, fifo)
            refused_leaving_nothing(capstack, rtl_data, sources, tmp_path / "runs" / "b",
                                    f"{fifo}: not a regular file (a FIFO), never read")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def test_a_failed_write_leaves_no_run_folder(capstack, tmp_path, rtl_data, monkeypatch):
    import trainer.imports

    def full(path, payload):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(trainer.imports, "save_checkpoint", full)
    words = rtl_data[2]
    sources = write_peer_checkpoint(tmp_path / "peer", updown_state(len(words), DIM), words,
                                    peer_options("updown"))
    refused_leaving_nothing(capstack, rtl_data, sources, tmp_path / "runs" / "run",
                            "best.pt: No space left on device")
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")  # a folder that was there stays
    prepared, store, _ = rtl_data
    result = capstack("import-checkpoint", "rtl", *sources, "--out", tmp_path / "kept",
                      "--captions", prepared, "--features", store, expect_ok=False)
    assert result.exit_code == 1
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["notes.txt"]
