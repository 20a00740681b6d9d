"""The RL and adversarial recipes live in experiment files (``configs/experiments/<name>-rl.yaml``
and the like, each ``extends:`` its XE experiment); their stages name the file and a seed.

Each stage trains what its ``--set`` words trained before the recipes moved: the experiment
``capstack train`` builds from the stage's command equals, key by key (``to_dict()``), the one
built from the XE file and the words the stage carried then (written out below, as the stages
files had them, params filled in), and so do the report's row label (approach, training), the
row's setting and the recipe digest the report merges seeds by.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import load_experiment
from trainer.evaluation.evaluate import recipe_of, setting_of
from trainer.evaluation.evaluations import recipe_digest
from trainer.objectives import table_labels_of

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = ("rl", "rl_scst", "rl_mix", "adversarial", "rl_bottom_up", "adversarial_hacap")


def _rl(objective: str, cache: str, samples, start: str, lr, epochs) -> list[str]:
    """The words of the rl stages before: SCST or C2F on CIDEr-D from an XE checkpoint."""
    return [f"objective.name={objective}", "objective.reward.name=cider-d",
            f"objective.reward.cache={cache}", f"objective.samples={samples}",
            f"train.init_from={start}", f"train.lr={lr}", "train.lr_decay_every=0",
            f"train.epochs={epochs}", "train.seed=0"]


# stages.yaml: the vars table's objective, lr, epochs and samples of each approach's rl stage
# (5.0e-4 and 2.0e-4, written as the engine pasted the numbers into the command)
DEMO_RL = {"show_tell": ("scst", "0.0005"), "lstm3": ("scst", "0.0005"),
           "gru_init": ("scst", "0.0005"), "soft_attention": ("scst", "0.0005"),
           "hard_attention": ("scst", "0.0005"), "top_down": ("scst", "0.0005"),
           "stack_cap_star": ("c2f", "0.0005"), "stack_cap": ("c2f", "0.0005"),
           "hacap": ("scst", "0.0005"), "transformer": ("scst", "0.0002")}
CIDER = "data/cider/train.npz"
DEMO = {
    **{f"rl@{key}": (f"configs/experiments/{key}.yaml",
                     _rl(objective, CIDER, 5, f"runs/{key}/best.pt", lr, 16))
       for key, (objective, lr) in DEMO_RL.items()},
    **{f"rl_scst@{key}": (f"configs/experiments/{key}.yaml",
                          _rl("scst", CIDER, 5, f"runs/{key}/best.pt", "5.0e-4", 16))
       for key in ("stack_cap_star", "stack_cap")},
    "rl_mix@top_down": ("configs/experiments/top_down.yaml", [
        "objective.name=scst", "objective.reward.name=mix",
        f"objective.reward.parts=[{{name: cider-d, cache: {CIDER}, weight: 1.0}}, "
        "{name: bleu, n: 4, weight: 0.5}]",
        "objective.samples=5", "train.init_from=runs/top_down/best.pt", "train.lr=5.0e-4",
        "train.lr_decay_every=0", "train.epochs=16", "train.seed=0"]),
    "adversarial@hacap": ("configs/experiments/hacap.yaml", [
        "objective.name=adversarial", "objective.discriminator.sets=1",
        "objective.discriminator.epochs=1", "objective.discriminator.images=200",
        "objective.discriminator.lr=5e-05", "train.init_from=runs/hacap/best.pt",
        "train.lr=2e-05", "train.lr_decay_every=0", "train.epochs=4", "train.seed=0"]),
}

# configs/coco.yaml's rl items: (objective, samples, the XE run it starts from); Adam 5e-5, 30
# epochs each
COCO_RL = {
    "stack_cap/show_tell": ("scst", 1, "stack_cap/show_tell"),
    "stack_cap/lstm3": ("scst", 1, "stack_cap/lstm3"),
    "stack_cap/soft_attention": ("scst", 1, "stack_cap/soft_attention"),
    "stack_cap/top_down": ("scst", 1, "stack_cap/top_down"),
    "stack_cap/stack_cap_star": ("c2f", 1, "stack_cap/stack_cap_star"),
    "stack_cap/stack_cap": ("c2f", 1, "stack_cap/stack_cap"),
    "stack_cap/variants/show_tell+image_norm": (
        "scst", 1, "stack_cap/variants/show_tell+image_norm"),
    "stack_cap/variants/top_down+feature_embed": (
        "scst", 1, "stack_cap/variants/top_down+feature_embed"),
    "stack_cap/variants/stack_cap_star+feature_embed": (
        "c2f", 1, "stack_cap/variants/stack_cap_star+feature_embed"),
    "stack_cap/variants/stack_cap+feature_embed": (
        "c2f", 1, "stack_cap/variants/stack_cap+feature_embed"),
    "stack_cap/variants/stack_cap+v2_weights_features": (
        "c2f", 1, "stack_cap/variants/stack_cap+v2_weights_features"),
    "stack_cap/variants/show_tell+5samples": ("scst", 5, "stack_cap/show_tell"),
    "stack_cap/variants/lstm3+5samples": ("scst", 5, "stack_cap/lstm3"),
    "stack_cap/variants/soft_attention+5samples": ("scst", 5, "stack_cap/soft_attention"),
    "stack_cap/variants/top_down+5samples": ("scst", 5, "stack_cap/top_down"),
    "stack_cap/variants/stack_cap_star+5samples": ("c2f", 5, "stack_cap/stack_cap_star"),
    "stack_cap/variants/stack_cap+5samples": ("c2f", 5, "stack_cap/stack_cap"),
}
COCO_CIDER = "coco/cider/train.npz"
COCO = {
    **{f"rl@{key}": (f"configs/coco/{key}.yaml",
                     _rl(objective, COCO_CIDER, samples, f"coco/runs/{xe}/best.pt", "5e-05", 30))
       for key, (objective, samples, xe) in COCO_RL.items()},
    "rl_bottom_up": ("configs/coco/bottom_up/top_down.yaml", [
        "objective.name=scst", "objective.reward.name=cider-d",
        f"objective.reward.cache={COCO_CIDER}", "objective.samples=1",
        "train.init_from=coco/runs/bottom_up/top_down/best.pt", "train.select_on=cider",
        "train.lr=5e-05", "train.lr_decay_every=0", "train.lr_decay_patience=0",
        "train.early_stop_patience=0", "train.epochs=30", "train.seed=0"]),
}
FLICKR8K = {
    "adversarial_hacap": ("configs/flickr8k/hacap/hacap.yaml", [
        "objective.name=adversarial", "train.init_from=flickr8k/runs/hacap/hacap/best.pt",
        "train.lr=0.0001", "train.lr_decay_every=0", "train.epochs=10", "train.seed=0"]),
}
BEFORE = {"stages.yaml": DEMO, "configs/coco.yaml": COCO, "configs/flickr8k.yaml": FLICKR8K}


def _stages(stages_file: str) -> dict:
    from cli import stage_commands
    from pipeline.engine.stagefile import load_stages_file

    return load_stages_file(ROOT / stages_file, stage_commands()).stages


def _recipe_stages(stages_file: str) -> dict:
    return {name: st for name, st in _stages(stages_file).items()
            if name.split("@", 1)[0] in FAMILIES}


def _trained(stage) -> tuple[str, list[str]]:
    """The experiment file and the ``--set`` words of a ``capstack train`` stage's command."""
    argv = list(stage.argv)  # the capstack command's own words
    assert stage.command == "train" and argv[0] == "train", stage.cmd
    return argv[1], [word for flag, word in zip(argv, argv[1:]) if flag == "--set"]


def _row(config, out: str) -> tuple:
    """What the report makes of a run of ``config``: its label's approach and training, the
    row's setting (decoder, objective, reward, features, seed, decoding; the recipe digest)."""
    return (config.name, table_labels_of(config.to_dict()),
            setting_of(config, config.eval, f"{out}/best.pt"),
            recipe_digest(recipe_of(config)))


@pytest.mark.parametrize("stages_file", sorted(BEFORE))
def test_every_recipe_stage_is_written_down_here(stages_file):
    """The reference below covers every RL and adversarial stage of the file, and no other."""
    assert sorted(_recipe_stages(stages_file)) == sorted(BEFORE[stages_file])


@pytest.mark.parametrize("stages_file, name",
                         [(f, n) for f, stages in sorted(BEFORE.items()) for n in stages])
def test_the_recipe_file_trains_what_the_set_words_trained(stages_file, name, monkeypatch):
    monkeypatch.chdir(ROOT)  # a stage's paths are relative to the workdir: the repository here
    stage = _stages(stages_file)[name]
    experiment, words = _trained(stage)
    assert words == ["train.seed=0"], "a recipe stage names its file and at most a seed"
    base, before_words = BEFORE[stages_file][name]
    now, before = load_experiment(experiment, words), load_experiment(base, before_words)
    assert now.to_dict() == before.to_dict()
    out = stage.outs[0]
    assert _row(now, out) == _row(before, out)


@pytest.mark.parametrize("stages_file, name",
                         [(f, n) for f, stages in sorted(BEFORE.items()) for n in stages])
def test_a_recipe_stage_depends_on_every_file_its_experiment_reads(stages_file, name):
    """The recipe file, the files it extends (listed, though the engine follows them too), the
    run it starts from and, for a reward on CIDEr-D, the document frequencies."""
    from pipeline.core.yamlfile import extends_chain

    stage = _stages(stages_file)[name]
    experiment, words = _trained(stage)
    config = load_experiment(ROOT / experiment, words)
    files = [ROOT / experiment, *extends_chain(ROOT / experiment)]
    assert [str(f.relative_to(ROOT)) for f in files] == list(stage.deps[:len(files)])
    assert str(Path(config.train.init_from).parent) in stage.deps
    reward = getattr(config.objective.config, "reward", None)
    parts = [p for p in [reward, *getattr(getattr(reward, "config", None), "parts", [])] if p]
    caches = {p.config.cache for p in parts if p.name == "cider-d"}
    assert caches <= set(stage.deps), caches
    assert "cider" not in stage.params or stage.params["cider"] in caches
