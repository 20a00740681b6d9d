"""The real-data configs set what the papers state (docs/real-data.md: "Per-paper settings").

Each row: the setting as the paper states it, where capstack sets it, and the value there. A
setting the paper leaves open is not checked here; docs/real-data.md says what capstack chose.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
STACK_CAP = ["show_tell", "lstm3", "soft_attention", "top_down", "stack_cap_star", "stack_cap"]


def experiment(path: str) -> dict:
    """An experiment file's settings with capstack's defaults filled in."""
    from dataclasses import asdict

    from trainer.config import load_experiment

    loaded = load_experiment(ROOT / "configs" / path)
    return {**loaded.to_dict(), "decoder": asdict(loaded.decoder.config),
            "objective": asdict(loaded.objective.config)}


def stage_args(stages_file: str, stage: str) -> dict[str, str]:
    """A stage's command-line options (--name value) as a dict."""
    cmd = yaml.safe_load((ROOT / "configs" / stages_file).read_text())["stages"][stage]["cmd"]
    argv = shlex.split(cmd)
    return {a[2:]: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}


def value(config: dict, dotted: str):
    for key in dotted.split("."):
        config = config[key]
    return config


@pytest.mark.parametrize("name", STACK_CAP)
@pytest.mark.parametrize("setting, stated", [
    ("decoder.hidden", 512),        # "the number of hidden units of each LSTM to 512"
    ("train.lr", 4e-4),             # "Adam ... initial learning rate of 4 x 10^-4"
    ("train.optimizer.name", "adam"),  # "using Adam optimizer"
    ("train.optimizer.betas", [0.9, 0.999]),  # "momentum parameter of 0.9" (Adam's beta1)
    ("eval.beam_size", 5),          # "K = 5 in our experiments"
    ("data.features", ["coco/features/grid.json"]),  # all six on the 14 x 14 x 2048 grid
])
def test_stack_cap_tables_1_2(name, setting, stated):
    assert value(experiment(f"coco/stack_cap/{name}.yaml"), setting) == stated


@pytest.mark.parametrize("name", ["soft_attention", "top_down", "stack_cap_star", "stack_cap"])
def test_stack_cap_attention_layers_have_512_units(name):
    assert experiment(f"coco/stack_cap/{name}.yaml")["decoder"]["att_hidden"] == 512


@pytest.mark.parametrize("name", ["top_down", "stack_cap_star", "stack_cap"])
def test_stack_cap_attends_over_the_pooled_features_themselves(name):
    """Eqs 2, 5 and 7 attend over V itself: no learned ReLU(W V) in front, as for Soft."""
    assert experiment(f"coco/stack_cap/{name}.yaml")["decoder"]["feature_embed"] == 0


def test_stack_caps_lstm_baseline_has_no_batch_norm_on_the_image():
    """Show and Tell's image embedding is a linear map (im2txt: a fully connected layer)."""
    assert experiment("coco/stack_cap/show_tell.yaml")["decoder"]["image_norm"] is False


def test_stack_caps_rl_takes_one_monte_carlo_sample():
    """Eqs 12-15: one sampled caption per stage against its greedy decode (the +5samples
    variants: five); each RL row's experiment is configs/coco/<paper>/<approach>-rl.yaml."""
    rl = yaml.safe_load((ROOT / "configs" / "coco.yaml").read_text())["stages"]["rl"]
    assert rl["do"]["params"]["config"] == "configs/coco/${key}-rl.yaml"
    assert shlex.split(rl["do"]["cmd"])[:3] == ["capstack", "train", "${config}"]
    for key in rl["foreach"]:
        samples = experiment(f"coco/{key}-rl.yaml")["objective"]["samples"]
        assert samples == (5 if "+5samples" in key else 1), key


def test_stack_cap_grid_is_resnet101_layer4_at_448_pooled_to_14x14():
    args = stage_args("coco.yaml", "extract_grid")
    assert (args["backbone"], args["image-size"], args["grid"], args["layer"]) == \
        ("resnet101", "448", "14", "layer4")


def test_stack_cap_rl_is_adam_5e5_scst_and_c2f_from_the_best_xe_checkpoint():
    stages = yaml.safe_load((ROOT / "configs" / "coco.yaml").read_text())["stages"]
    rl = stages["rl"]
    paper = {k: v for k, v in rl["foreach"].items() if "/variants/" not in k}
    assert sorted(paper) == sorted(f"stack_cap/{n}" for n in STACK_CAP)
    for key, item in rl["foreach"].items():
        config = experiment(f"coco/{key}-rl.yaml")
        assert (config["train"]["lr"], config["train"]["optimizer"]["name"]) == (5e-5, "adam")
        assert config["train"]["lr_decay_every"] == 0
        objective = yaml.safe_load((ROOT / "configs" / "coco" / f"{key}-rl.yaml").read_text())[
            "objective"]["name"]
        assert objective == ("c2f" if key.split("/")[-1].startswith("stack_cap") else "scst"), key
        assert config["train"]["init_from"] == f"coco/runs/{item['xe']}/best.pt", key
        assert "coco/runs/${item.xe}" in rl["do"]["deps"]
    assert all(v["xe"] == k for k, v in paper.items())  # each from its own XE run


def test_the_coco_vocabulary_is_self_critical_pytorchs_at_threshold_5():  # Stack-Cap's 9,487
    """Stack-Cap's 9,487 words are what self-critical.pytorch's prepro_labels.py keeps on
    Karpathy's COCO at threshold 5 (words seen more than 5 times in any split): its rule."""
    stages = yaml.safe_load((ROOT / "configs" / "coco.yaml").read_text())["stages"]
    assert stages["prepare"]["params"] == {"min_count": 5, "max_len": 16, "vocab_rule": "rtl"}
    assert "--vocab-rule ${vocab_rule}" in stages["prepare"]["cmd"]


@pytest.mark.parametrize("path", ["coco/show_attend_tell", "flickr8k/show_attend_tell",
                                  "flickr30k/show_attend_tell"])
def test_show_attend_tell(path):
    soft, hard = (experiment(f"{path}/soft_attention.yaml"),
                  experiment(f"{path}/hard_attention.yaml"))
    for config in (soft, hard):
        assert config["data"]["batching"] == "one_length"  # "minibatches of ... 64 ... one length"
        assert config["train"]["batch_size"] * config["data"]["seq_per_img"] == 64
        assert config["eval"]["max_refs"] == 5  # scored against 5 references
        assert config["train"]["optimizer"]["name"] == ("rmsprop" if "flickr8k" in path
                                                        else "adam")  # "RMSProp ... Flickr8k"
        dataset = path.split("/")[0]
        assert config["data"]["features"] == [f"{dataset}/features/grid-vgg.json"]
    args = stage_args(f"{dataset}.yaml", "extract_grid_vgg")  # VGG conv5_4: 14 x 14 x 512
    assert (args["backbone"], args["layer"], args["image-size"], args["grid"]) == (
        "vgg19", "conv5_4", "224", "14")
    if path.startswith("coco"):  # trained on COCO's 82,783 train images: restval dropped
        stages = yaml.safe_load((ROOT / "configs" / "coco.yaml").read_text())["stages"]
        prepare = stages["prepare_show_attend_tell"]
        assert "--restval drop" in prepare["cmd"] and prepare["outs"] == ["coco/prepared-82k"]
        assert soft["data"]["captions"] == hard["data"]["captions"] == "coco/prepared-82k"
    assert soft["decoder"]["doubly_stochastic"] > 0  # the doubly stochastic penalty
    assert hard["decoder"]["baseline_decay"] == 0.9  # b_k = 0.9 b_{k-1} + 0.1 log p
    assert hard["decoder"]["gate"] is False  # the hard context: the annotation itself, no beta


@pytest.mark.parametrize("stages_file", ["coco.yaml", "flickr8k.yaml", "flickr30k.yaml"])
def test_show_attend_tell_grid_is_196_locations(stages_file):
    args = stage_args(stages_file, "extract_grid_layer3")
    assert (args["image-size"], args["grid"], args["layer"]) == ("224", "14", "layer3")


# The replication ran poojahira's image-captioning-bottom-up-top-down and states none of these:
# each is that implementation's (commit 4fc5bf2, file:line there).
@pytest.mark.parametrize("setting, stated", [
    ("decoder.embed", 1024),               # train.py:18 emb_dim
    ("decoder.att_hidden", 1024),          # train.py:19 attention_dim
    ("decoder.hidden", 1024),              # train.py:20 decoder_dim
    ("decoder.dropout", 0.5),              # train.py:21, on h1 and h2 (models.py:139, 143)
    ("decoder.word_dropout", False),       # models.py:116, 137: no dropout on the embedding
    ("decoder.att_activation", "relu"),    # models.py:36; README: "ReLU ... instead of Tanh"
    ("decoder.att_dropout", 0.5),          # models.py:24, 36, 66
    ("decoder.weight_norm", True),         # models.py:20-22, 73
    ("decoder.feature_embed", 0),          # models.py:107, 137-138: the features themselves
    ("data.features", ["coco/features/regions.json"]),  # bottom-up features
    ("data.box_geometry", False),          # datasets.py:57-59
    ("data.seq_per_img", 5),               # create_input_files.py:7
    ("train.batch_size", 20),              # x 5 captions: train.py:29's 100 captions a step
    ("train.epochs", 50),                  # train.py:27
    ("train.optimizer.name", "adamax"),    # train.py:56
    ("train.optimizer.betas", [0.9, 0.999]),  # train.py:56: Adamax's defaults
    ("train.lr", 2e-3),                    # train.py:56, Adamax's default; README "2e-3"
    ("train.lr_decay_every", 0),           # no decay but on a plateau:
    ("train.lr_decay_patience", 8),        # train.py:87-88
    ("train.lr_decay_rate", 0.8),          # train.py:88
    ("train.early_stop_patience", 20),     # train.py:85-86
    ("train.select_on", "bleu4"),          # train.py:105-114, utils.py:173-174
    ("train.grad_clip", 0.25),             # train.py:175
    ("eval.beam_size", 5),                 # eval.py:168
    ("eval.max_len", 50),                  # eval.py:139-141
    ("eval.max_refs", 5),                  # eval.py:147-153: the 5 captions kept an image
])
def test_bottom_up_replication_follows_poojahiras_implementation(setting, stated):
    assert value(experiment("coco/bottom_up/top_down.yaml"), setting) == stated


def test_bottom_up_replication_reads_36_regions_and_has_a_cider_optimised_row():
    """36 boxes an image (poojahira's README; tsv.py:36); the CIDEr-optimised row (Table 1's
    third): SCST on CIDEr-D, one sample against the greedy decode (eqs 10-11), from the XE
    run's best checkpoint, kept on val CIDEr at a constant lr whatever the XE run kept."""
    args = stage_args("coco.yaml", "extract_regions")
    assert (args["arch"], args["min-boxes"], args["max-boxes"]) == ("bottom-up", "36", "36")
    stages = yaml.safe_load((ROOT / "configs" / "coco.yaml").read_text())["stages"]
    rl = stages["rl_bottom_up"]
    assert rl["params"]["config"] == "configs/coco/bottom_up/top_down-rl.yaml"
    config = flat(experiment("coco/bottom_up/top_down-rl.yaml"))
    assert {k: config[k] for k in ("objective.samples", "train.init_from", "train.select_on",
                                   "train.lr_decay_every", "train.lr_decay_patience",
                                   "train.early_stop_patience")} == {
        "objective.samples": 1, "train.init_from": "coco/runs/bottom_up/top_down/best.pt",
        "train.select_on": "cider", "train.lr_decay_every": 0, "train.lr_decay_patience": 0,
        "train.early_stop_patience": 0}
    from trainer.config import load_experiment

    loaded = load_experiment(ROOT / "configs" / "coco" / "bottom_up" / "top_down-rl.yaml")
    assert (loaded.objective.name, loaded.objective.config.reward.name) == ("scst", "cider-d")
    assert rl["outs"] == ["coco/runs/bottom_up/top_down-rl"]
    assert "bottom_up/top_down-rl" in stages["evaluate"]["foreach"]
    assert shlex.split(stages["tables_bottom_up"]["cmd"])[2:4] == [
        "coco/evals/bottom_up/top_down", "coco/evals/bottom_up/top_down-rl"]


def test_gru_baseline():
    config = experiment("coco/gru_baseline/gru_init.yaml")
    decoder, train = config["decoder"], config["train"]
    assert (decoder["embed"], decoder["hidden"]) == (512, 512)  # "embedding ... 512, ... decoder"
    assert decoder["cell"] == "report"  # c~ = tanh(W_c [Γ_r ⊙ c, x] + b_c), section 2.1
    assert (train["lr"], train["epochs"], train["grad_clip"]) == (4e-4, 30, 5.0)
    args = stage_args("coco.yaml", "extract_grid_256")
    assert (args["backbone"], args["image-size"], args["grid"]) == ("resnet101", "256", "14")


def test_the_gru_reports_attention_model():
    """Section 3.2: LSTM + soft attention on 14x14x2048, attention/embedding/decoder 512, lr 4e-4,
    30 epochs, clipping 5; on the same features as its GRU, in the same table."""
    config = experiment("coco/gru_baseline/soft_attention.yaml")
    decoder, train = config["decoder"], config["train"]
    assert (decoder["embed"], decoder["hidden"], decoder["att_hidden"]) == (512, 512, 512)
    assert (train["lr"], train["epochs"], train["grad_clip"]) == (4e-4, 30, 5.0)
    assert config["data"]["features"] == ["coco/features/grid-256.json"]  # 14 x 14 x 2048
    stages = yaml.safe_load((ROOT / "configs" / "coco.yaml").read_text())["stages"]
    assert "coco/evals/gru_baseline/soft_attention" in stages["tables_gru_baseline"]["cmd"]


def test_hacap_on_flickr8k():
    config = experiment("flickr8k/hacap/hacap.yaml")
    decoder = config["decoder"]
    assert (decoder["manager"], decoder["goal_size"],
            decoder["discriminator_layers"]) == (256, 6, 3)
    assert config["data"]["features"] == ["flickr8k/features/grid-layer3.json"]  # 196 x 1024
    assert config["train"]["max_len"] == config["eval"]["max_len"] == 20  # "restricted to 20"
    stages = yaml.safe_load((ROOT / "configs" / "flickr8k.yaml").read_text())["stages"]
    assert stages["prepare_hacap"]["params"]["max_len"] == 20
    assert "flickr8k/prepared-hacap" == config["data"]["captions"]
    args = stage_args("flickr8k.yaml", "extract_grid_layer3")
    assert (args["image-size"], args["grid"], args["layer"]) == ("224", "14", "layer3")
    adversarial = yaml.safe_load(
        (ROOT / "configs" / "flickr8k" / "hacap" / "hacap-adv.yaml").read_text())
    assert stages["adversarial_hacap"]["params"]["config"] == \
        "configs/flickr8k/hacap/hacap-adv.yaml"
    assert adversarial["extends"] == "hacap.yaml"
    # D learns alongside maximum likelihood, on LeakGAN's schedule, in both phases
    from trainer.objectives.interleaved_pretraining import InterleavedPretrainingConfig

    assert config["objective"] == asdict(InterleavedPretrainingConfig())  # LeakGAN's defaults
    assert yaml.safe_load((ROOT / "configs" / "flickr8k" / "hacap" / "hacap.yaml").read_text())[
        "objective"] == {"name": "interleaved_pretraining"}
    assert adversarial["objective"] == {"name": "adversarial"}  # its D: the defaults
    assert "--lemmatize" in stages["prepare_hacap"]["cmd"]  # "official regularizations"


VARIANTS = sorted(p for p in (ROOT / "configs" / "coco").glob("*/variants/*.yaml")
                  if not p.stem.endswith("-rl"))  # a variant's RL phase: checked with it


def flat(config: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def changed_keys(a: dict, b: dict, ignore=("name",)) -> set[str]:
    return {k for k in set(flat(a)) | set(flat(b))
            if k not in ignore and flat(a).get(k) != flat(b).get(k)}


@pytest.mark.parametrize("path", VARIANTS,
                         ids=[f"{p.parent.parent.name}/{p.stem}" for p in VARIANTS])
def test_a_variant_says_what_it_changes_and_leaves_the_paper_row_alone(path):
    """A variant's name is its paper row's, then +WHAT; what differs from the row it extends
    (its experiment, its train stage's inputs, or its RL experiment but for the XE run it
    starts from) is WHAT, and nothing else; it has rows in its block's variants table, never in
    the paper's own table."""
    paper_block = path.parent.parent.name
    base_name, _, what = path.stem.partition("+")
    assert what, f"{path.name}: a variant is named APPROACH+WHAT"
    variant = experiment(f"coco/{paper_block}/variants/{path.name}")
    paper = experiment(f"coco/{paper_block}/{base_name}.yaml")
    assert variant["name"] == path.stem and paper["name"] == base_name
    changed = changed_keys(variant, paper)
    stages = yaml.safe_load((ROOT / "configs" / "coco.yaml").read_text())["stages"]
    key, paper_key = f"{paper_block}/variants/{path.stem}", f"{paper_block}/{base_name}"
    train = stages["train"]["foreach"]  # a variant of the RL stage alone reuses the paper's XE
    train_changed = changed_keys(train[key], train[paper_key], ignore=("base",)) \
        if key in train else set()
    assert key not in train or train[key]["base"] == paper_key
    rl = stages["rl"]["foreach"]
    rl_changed = changed_keys(experiment(f"coco/{key}-rl.yaml"),
                              experiment(f"coco/{paper_key}-rl.yaml"),
                              ignore=("name", "train.init_from")) if key in rl else set()
    if key in rl:
        assert yaml.safe_load((ROOT / "configs" / "coco" / f"{key}-rl.yaml").read_text())[
            "extends"] == f"{path.stem}.yaml"
        assert rl[key]["xe"] == (key if key in train else paper_key)
    assert changed or rl_changed, f"{path.name} changes nothing"
    assert all(k.rsplit(".", 1)[-1] in what for k in changed | rl_changed | train_changed), \
        (changed, train_changed, rl_changed)
    if key in rl:
        assert rl[key]["base"] == paper_key
    rows = [k for k in (key, f"{key}-rl") if k in stages["evaluate"]["foreach"]]
    assert rows, f"{key}: never evaluated"
    table = stages[f"tables_{paper_block}_variants"]["cmd"]
    assert all(f"coco/evals/{row} " in table for row in rows)
    assert key not in stages[f"tables_{paper_block}"]["cmd"]  # the paper's table: its rows alone


@pytest.mark.parametrize("stages_file", ["coco.yaml", "flickr8k.yaml", "flickr30k.yaml"])
def test_the_backbone_is_torchvisions_imagenet1k_v1_resnet101(stages_file):
    """The papers predate torchvision's V2 weights (2021): their ResNet-101 is V1's."""
    params = yaml.safe_load((ROOT / "configs" / stages_file).read_text())["params"]
    assert params["backbone_weights"].endswith("resnet101-63fe2227.pth")


@pytest.mark.parametrize("stages_file", ["coco.yaml", "flickr8k.yaml", "flickr30k.yaml",
                                         "../stages.yaml"])
def test_feature_stores_go_where_capstack_features_says(stages_file, monkeypatch, tmp_path):
    """No stage names a features root: $CAPSTACK_FEATURES (documented) places the stores."""
    import click

    import cli
    from pipeline.engine.stagefile import load_stages_file
    from pipeline.features.placement import features_root

    stages = load_stages_file(ROOT / "configs" / stages_file, cli.stage_commands(), [])
    commands = {name: cli.main.commands.get(stages.stage(name).command or "")
                for name in stages.order}
    storing = {name: command for name, command in commands.items()
               if command and any(p.name == "features_root" for p in command.params)}
    assert storing
    monkeypatch.setenv("CAPSTACK_FEATURES", str(tmp_path))
    for name, command in storing.items():
        with click.Context(command) as ctx:
            command.parse_args(ctx, list(stages.stage(name).argv[1:]))
        assert ctx.params["features_root"] is None, name
        assert features_root(ctx.params["features_root"]) == tmp_path
