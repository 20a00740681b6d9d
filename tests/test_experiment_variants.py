"""``extends:``: an experiment file laid over another, the form of a paper block's variant."""

from __future__ import annotations

import pytest
import yaml

from pipeline.captions.prepared import load_captions
from pipeline.core.errors import CapstackError
from trainer.config import load_experiment
from trainer_fixtures import make_prepared, write_experiment, write_feature_store


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("variants")
    _, prepared = make_prepared(root, n_train=6, n_val=2, n_test=2)
    store = write_feature_store(root / "grid.lmdb", load_captions(prepared).image_ids)
    (root / "paper").mkdir()
    return write_experiment(root / "paper" / "top_down.yaml", decoder="top_down",
                            captions=prepared, features=[store], epochs=3)


def variant(base, tmp_path, body: dict, name="v.yaml"):
    path = tmp_path / "variants" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"extends": str(base), **body}))
    return path


def test_a_variant_is_its_base_with_its_own_keys_laid_over(base, tmp_path):
    path = variant(base, tmp_path, {"name": "top_down+feature_embed",
                                    "decoder": {"feature_embed": 24}, "train": {"lr": 0.001}})
    paper, varied = load_experiment(base), load_experiment(path)
    assert varied.name == "top_down+feature_embed"
    assert varied.decoder.name == "top_down" and varied.decoder.config.feature_embed == 24
    assert varied.decoder.config.hidden == paper.decoder.config.hidden  # the base's, kept
    assert (varied.train.lr, varied.train.epochs) == (0.001, paper.train.epochs)
    assert varied.data == paper.data


def test_a_relative_base_and_a_chain_of_variants(base, tmp_path):
    first = variant(base, tmp_path, {"name": "a", "decoder": {"feature_embed": 8}}, "a.yaml")
    second = tmp_path / "variants" / "b.yaml"
    second.write_text(yaml.safe_dump({"extends": "a.yaml", "name": "b",
                                      "decoder": {"dropout": 0.1}}))
    config = load_experiment(second)
    assert (config.name, config.decoder.config.feature_embed, config.decoder.config.dropout) == (
        "b", 8, 0.1)
    assert first.is_file()


def test_another_component_name_replaces_the_bases_section(base, tmp_path):
    path = variant(base, tmp_path, {"decoder": {"name": "show_tell", "hidden": 16}})
    config = load_experiment(path)
    assert config.decoder.name == "show_tell" and config.decoder.config.hidden == 16


def test_a_missing_base_a_cycle_and_a_bad_value_are_named(base, tmp_path):
    missing = variant(tmp_path / "nope.yaml", tmp_path, {"name": "x"}, "missing.yaml")
    with pytest.raises(CapstackError, match=r"missing.yaml: extends: .*nope.yaml not found"):
        load_experiment(missing)
    a, b = tmp_path / "variants" / "ca.yaml", tmp_path / "variants" / "cb.yaml"
    a.write_text("extends: cb.yaml\n")
    b.write_text("extends: ca.yaml\n")
    with pytest.raises(CapstackError, match=r"extends: ca.yaml extends this file again"):
        load_experiment(a)
    bad = variant(base, tmp_path, {}, "bad.yaml")
    bad.write_text("extends: [1, 2]\n")
    with pytest.raises(CapstackError, match=r"bad.yaml: extends: expected the path of another"):
        load_experiment(bad)


def test_a_variants_stage_is_stale_when_a_file_it_extends_changes(base, tmp_path, capstack):
    """The stage lists the variant alone; the files it extends, followed down the chain, are
    its deps too (a base lr 0.002 -> 0.5 once left the variant's training up to date)."""
    paper = tmp_path / "paper" / "top_down.yaml"
    paper.parent.mkdir()
    paper.write_text(yaml.safe_dump({**yaml.safe_load(base.read_text()),
                                     "train": {"epochs": 1, "batch_size": 4, "lr": 0.002}}))
    (tmp_path / "variants").mkdir()
    (tmp_path / "variants" / "mid.yaml").write_text("extends: ../paper/top_down.yaml\n")
    (tmp_path / "variants" / "v.yaml").write_text("extends: mid.yaml\nname: v\n")
    (tmp_path / "stages.yaml").write_text(yaml.safe_dump({"stages": {"train": {
        "cmd": "capstack train variants/v.yaml --out runs/v --restart-on-change",
        "deps": ["variants/v.yaml"], "outs": ["runs/v"]}}}))
    capstack.stage_cmd("run", "train")
    assert capstack.statuses()["train"]["state"] == "up to date"
    paper.write_text(paper.read_text().replace("lr: 0.002", "lr: 0.5"))
    status = capstack.statuses()["train"]
    assert status == {"state": "stale", "reasons": ["dep paper/top_down.yaml changed"]}
    capstack.stage_cmd("run", "train")
    assert capstack.statuses()["train"]["state"] == "up to date"
    (tmp_path / "variants" / "mid.yaml").write_text("extends: ../paper/top_down.yaml\n"
                                                     "train: {epochs: 2}\n")
    assert capstack.statuses()["train"]["reasons"] == ["dep variants/mid.yaml changed"]
