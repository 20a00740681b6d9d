"""Malformed stages files and bad --set values: one clear message, non-zero exit, nothing
written."""

from __future__ import annotations

import pytest

from pipeline.core.errors import CapstackError

GOOD = """
params:
  data: data/shapes
stages:
  shapes:
    cmd: capstack shapes ${data} --train ${train} --val 1 --test 1 --size 32
    params: {train: 4}
    outs:
      - ${data}
  prepare:
    cmd: capstack prepare ${data}/dataset_shapes.json data/prepared --min-count ${min_count}
    params: {min_count: 2}
    deps:
      - ${data}/dataset_shapes.json
    outs: [data/prepared]
"""

BAD_FILES = {
    "unknown stage key": (
        GOOD.replace("    params: {min_count: 2}", "    params: {min_count: 2}\n    outz: [x]"),
        ["stages.prepare.outz: unknown key",
         "allowed: cmd, deps, desc, metrics, nproc, outs, params, shell, when"],
    ),
    "unknown top-level key": (GOOD + "settings: {}\n", ["settings: unknown key"]),
    "dep cycle": (
        GOOD.replace("    outs:\n      - ${data}",
                     "    deps: [data/prepared]\n    outs:\n      - ${data}"),
        ["stages: dependency cycle: shapes -> prepare -> shapes"],
    ),
    "unknown command": (
        GOOD.replace("capstack prepare", "capstack prepair"),
        ["stages.prepare.cmd: unknown command 'capstack prepair'", "prepare", "shapes"],
    ),
    "capstack without a command": (
        GOOD.replace("capstack prepare ${data}/dataset_shapes.json data/prepared --min-count "
                     "${min_count}", "capstack").replace("{min_count: 2}", "{}"),
        ["stages.prepare.cmd: no command (stage commands: ", "prepare", "shapes"],
    ),
    "a param leaving no program": (
        GOOD.replace("capstack prepare ${data}", "${tool} ${data}")
        .replace("{min_count: 2}", "{min_count: 2, tool: ''}"),
        ["stages.prepare.cmd: names no program once its params are substituted"],
    ),
    "shell not a boolean": (
        GOOD.replace("    params: {min_count: 2}", "    shell: 'yes'\n    params: {min_count: 2}"),
        ["stages.prepare.shell: expected true or false, got 'yes'"],
    ),
    "nproc on another program": (
        GOOD.replace("capstack prepare", "python prepare.py")
        .replace("    params: {min_count: 2}", "    nproc: 2\n    params: {min_count: 2}"),
        ["stages.prepare.nproc: is for capstack commands that take --nproc"],
    ),
    "missing param": (
        GOOD.replace("--min-count ${min_count}", "--min-count ${min_count} --max-len ${max_len}"),
        ["stages.prepare.cmd: unknown param ${max_len}", "params: data, min_count"],
    ),
    "unused param": (
        GOOD.replace("{min_count: 2}", "{min_count: 2, max_len: 9}"),
        ["stages.prepare.params.max_len: declared but not used"],
    ),
    "missing cmd": (GOOD.replace("    cmd: capstack prepare", "    command: capstack prepare"),
                    ["stages.prepare.command: unknown key"]),
    "param of the wrong type": (GOOD.replace("{train: 4}", "{train: [4]}"),
                                ["stages.shapes.params.train: "
                                 "expected a string, number or boolean"]),
    "overlapping outs": (GOOD.replace("outs: [data/prepared]", "outs: [data/shapes/prepared]"),
                         ["stages.prepare.outs: 'data/shapes/prepared' overlaps 'data/shapes'"]),
    "not yaml": ("stages: [unclosed\n", ["not valid YAML at line"]),
    "no stages": ("params: {}\n", ["stages: expected a mapping of stage names"]),
    "foreach with an unknown key": (
        GOOD + "  copies:\n    foreach: [a]\n    do: {cmd: capstack prepare x y}\n    outs: [z]\n",
        ["stages.copies.outs: unknown key next to foreach"]),
    "empty foreach": (GOOD + "  copies:\n    foreach: []\n    do: {cmd: capstack prepare x y}\n",
                      ["stages.copies.foreach: expected a non-empty list"]),
    "foreach name taken": (
        GOOD + "  copies@a:\n    cmd: capstack prepare x y\n"
               "  copies:\n    foreach: [a]\n    do: {cmd: capstack prepare x y}\n",
        ["declared twice"]),
    "nproc not a count": (GOOD.replace("    params: {min_count: 2}",
                                       "    nproc: 0\n    params: {min_count: 2}"),
                          ["stages.prepare.nproc: expected a positive number of processes, got 0"]),
    "nproc on a one-process command": (
        GOOD.replace("    params: {min_count: 2}", "    nproc: 2\n    params: {min_count: 2}"),
        ["stages.prepare.nproc: 'capstack prepare' runs as one process", "extract-grid", "train"]),
    "foreach item param unknown": (
        GOOD + "  copies:\n    foreach: {a: {n: 1}}\n    do:\n"
               "      cmd: capstack prepare ${item.m} y\n",
        ["stages.copies@a.cmd: unknown param ${item.m}"]),
    # ${experiment} is the engine's, given to a cmd when the stage runs
    "a param named as a built-in": (GOOD.replace("{min_count: 2}", "{min_count: 2, experiment: a}"),
                                    ["stages.prepare.params.experiment: 'experiment' is a name "
                                     "the engine gives a stage's cmd"]),
    "a built-in in an out": (GOOD.replace("outs: [data/prepared]", "outs: ['data/${experiment}']"),
                             ["stages.prepare.outs: ${experiment} is given to a stage's cmd "
                              "only"]),
    # seeds: the param the file names
    "seed_param naming no param": (GOOD + "seed_param: seed\n",
                                   ["seed_param: no stage has a param 'seed'"]),
    "seed_param not a name": (GOOD + "seed_param: [seed]\n",
                              ["seed_param: expected the name of the param that a stage's "
                               "seed is"]),
    # metrics: files of numbers a stage writes, inside one of its outs
    "metrics not a list": (GOOD.replace("outs: [data/prepared]",
                                        "outs: [data/prepared]\n    metrics: data/prepared/m.json"),
                           ["stages.prepare.metrics: expected a list of metrics files"]),
    "metrics outside the outs": (
        GOOD.replace("outs: [data/prepared]", "outs: [data/prepared]\n    metrics: [m.json]"),
        ["stages.prepare.metrics: 'm.json' lies in none of the stage's outs (data/prepared)"]),
    "metrics entry with an unknown key": (
        GOOD.replace("outs: [data/prepared]", "outs: [data/prepared]\n    metrics:\n"
                     "      - {path: data/prepared/m.json, shown: [a]}"),
        ["stages.prepare.metrics[0].shown: unknown key (allowed: path, percent, show)"]),
    "metrics entry without a path": (
        GOOD.replace("outs: [data/prepared]", "outs: [data/prepared]\n    metrics:\n"
                     "      - {show: [a]}"),
        ["stages.prepare.metrics[0].path: missing"]),
    "metrics show not a list": (
        GOOD.replace("outs: [data/prepared]", "outs: [data/prepared]\n    metrics:\n"
                     "      - {path: data/prepared/m.json, show: CIDEr}"),
        ["stages.prepare.metrics[0].show: expected a list of the file's keys"]),
    "metrics show naming a column twice": (
        GOOD.replace("outs: [data/prepared]", "outs: [data/prepared]\n    metrics:\n"
                     "      - {path: data/prepared/m.json, show: [a.CIDEr, b.CIDEr]}"),
        ["stages.prepare.metrics[0].show: two keys make the column 'CIDEr'"]),
    "metrics percent not a boolean": (
        GOOD.replace("outs: [data/prepared]", "outs: [data/prepared]\n    metrics:\n"
                     "      - {path: data/prepared/m.json, percent: 'yes'}"),
        ["stages.prepare.metrics[0].percent: expected true or false, got 'yes'"]),
}


def _assert_clean_failure(capstack, result, fragments):
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.output, result.output
    assert sorted(p.name for p in capstack.workdir.iterdir()) == ["stages.yaml"]


@pytest.mark.parametrize("case", sorted(BAD_FILES))
@pytest.mark.parametrize("verb", [("stages",), ("run", "prepare"), ("demo",)])
def test_malformed_stages_file_is_refused_with_file_and_field(capstack, case, verb):
    text, fragments = BAD_FILES[case]
    stages = capstack.workdir / "stages.yaml"
    stages.write_text(text)
    result = capstack.stage_cmd(*verb, expect_ok=False)
    _assert_clean_failure(capstack, result, [str(stages), *fragments])


def test_missing_stages_file(capstack):
    (capstack.workdir / "stages.yaml").write_text(GOOD)
    result = capstack.stage_cmd("stages", stages="other.yaml", expect_ok=False)
    assert result.exit_code != 0 and "other.yaml: stages file not found" in result.output


@pytest.mark.parametrize("assignment, fragment", [
    ("min_count=big", '--set min_count=big: expected int, got "big"'),
    ("min_count=2.5", '--set min_count=2.5: expected int, got "2.5"'),
    ("max_len=3", "stage 'prepare'"),
    ("min_count", "--set min_count: expected NAME=VALUE"),
])
def test_bad_set_is_refused(capstack, assignment, fragment):
    (capstack.workdir / "stages.yaml").write_text(GOOD)
    result = capstack.stage_cmd("run", "prepare", "--set", assignment, expect_ok=False)
    _assert_clean_failure(capstack, result, [fragment])
    if assignment.startswith("max_len"):
        assert "has no param 'max_len' (params: data, min_count)" in result.output


def test_unknown_stage_lists_the_stages(capstack):
    (capstack.workdir / "stages.yaml").write_text(GOOD)
    result = capstack.stage_cmd("run", "train", expect_ok=False)
    _assert_clean_failure(capstack, result, ["no stage named 'train' (stages: shapes, prepare)"])


def test_shipped_stages_files_are_valid(capstack):
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for path in [root / "stages.yaml", *sorted((root / "configs").glob("*.yaml"))]:
        result = capstack("stages", "-c", path, "--workdir", capstack.workdir)
        assert result.exit_code == 0, (path, result.output)
        assert "never run" in result.output


def test_foreach_makes_one_stage_per_key(tmp_path):
    from cli import main
    from pipeline.engine.stagefile import load_stages_file

    path = tmp_path / "stages.yaml"
    path.write_text(GOOD + """
  train:
    foreach:
      show_tell: {features: grid, epochs: 2}
      top_down: {features: regions, epochs: 3}
    do:
      desc: one experiment
      cmd: capstack train configs/${key}.yaml --out runs/${key} --set train.epochs=${item.epochs}
      deps:
        - data/prepared
        - data/${item.features}.json
      outs:
        - runs/${key}
""")
    stages = load_stages_file(path, main.commands)
    assert stages.order[-2:] == ("train@show_tell", "train@top_down")
    st = stages.stage("train@show_tell")
    assert st.cmd == ("capstack train configs/show_tell.yaml --out runs/show_tell "
                      "--set train.epochs=2")
    assert st.deps == ("data/prepared", "data/grid.json") and st.outs == ("runs/show_tell",)
    assert st.params == {"item.epochs": 2, "item.features": "grid", "key": "show_tell"}
    assert stages.upstream["train@top_down"] == ("prepare",)
    assert stages.stage("train@top_down").params["item.epochs"] == 3

    # --set reaches a foreach entry's item (it was once accepted and silently ignored)
    st = stages.with_overrides("train@show_tell", ["item.epochs=5"])
    assert st.cmd.endswith("--set train.epochs=5") and st.params["item.epochs"] == 5
    assert stages.stage("train@top_down").params["item.epochs"] == 3
    with pytest.raises(CapstackError, match="foreach entry 'show_tell'"):
        stages.with_overrides("train@show_tell", ["key=top_down"])


def test_vars_name_a_list_once_for_foreach_cmd_and_deps(tmp_path):
    from cli import main
    from pipeline.engine.stagefile import load_stages_file

    path = tmp_path / "stages.yaml"
    path.write_text(GOOD + """
  train:
    foreach: ${approaches}
    do:
      cmd: capstack train configs/${key}.yaml --out runs/${key} --set train.epochs=${item.epochs}
      deps: [data/prepared]
      outs:
        - runs/${key}
  evaluate:
    foreach:
      - ${approaches}
      - ${approaches}-rl
    do:
      cmd: capstack evaluate runs/${key} --out evals/${key}
      outs:
        - evals/${key}
  tables:
    cmd: capstack report evals/${approaches} evals/${approaches}-rl --out reports
    deps:
      - evals/${approaches}
      - evals/${approaches}-rl
    outs: [reports]
vars:
  approaches:
    show_tell: {epochs: 2}
    top_down: {epochs: 3}
""")
    stages = load_stages_file(path, main.commands)
    assert stages.stage("train@top_down").cmd.endswith("--out runs/top_down --set train.epochs=3")
    assert stages.stage("train@top_down").params == {"item.epochs": 3, "key": "top_down"}
    assert [n for n in stages.stages if n.startswith("evaluate@")] == [
        "evaluate@show_tell", "evaluate@top_down", "evaluate@show_tell-rl", "evaluate@top_down-rl"]
    tables = stages.stage("tables")
    assert tables.cmd == ("capstack report evals/show_tell evals/top_down evals/show_tell-rl "
                          "evals/top_down-rl --out reports")
    assert tables.deps == ("evals/show_tell", "evals/top_down", "evals/show_tell-rl",
                           "evals/top_down-rl")
    assert tables.params == {}  # a var is not a param: the command says it all
    path.write_text(path.read_text().replace("params:", "params:\n  approaches: 1", 1))
    with pytest.raises(CapstackError, match=r"vars.approaches: also a param"):
        load_stages_file(path, main.commands)


def _rewarded(stage):
    """``stage`` with its CIDEr-D reward named as rewards are now (``objective.reward``), the
    one change of the RL commands since the file before vars."""
    from dataclasses import replace

    old, new = "--set objective.cider_cache=", ("--set objective.reward.name=cider-d "
                                                "--set objective.reward.cache=")
    if old not in stage.cmd:
        return stage
    argv = []
    for word in stage.argv:
        if word.startswith("objective.cider_cache="):
            argv[-1:] = ["--set", "objective.reward.name=cider-d", "--set"]
            word = word.replace("objective.cider_cache=", "objective.reward.cache=")
        argv.append(word)
    return replace(stage, cmd=stage.cmd.replace(old, new),
                   cmd_template=stage.cmd_template.replace(
                       "--set objective.cider_cache=${cider}",
                       "--set objective.reward.name=cider-d --set objective.reward.cache=${cider}"),
                   argv=tuple(argv))


def test_the_shipped_approach_list_gives_the_stages_written_out_before_it():
    """stages.yaml names the approaches once; its stages equal those of the file that listed
    them in four places (tests/data/stages_before_vars.yaml): same commands, deps, outs and
    params, so nothing reruns. Only the tables, which list every approach, gain the ones added
    since (the transformer)."""
    from pathlib import Path

    from cli import main
    from pipeline.engine.stagefile import load_stages_file

    root = Path(__file__).resolve().parent.parent
    before = load_stages_file(root / "tests" / "data" / "stages_before_vars.yaml", main.commands)
    now = load_stages_file(root / "stages.yaml", main.commands)
    changed_since = {"tables",  # the one stage that lists every approach: it gains the new ones
                     "adversarial@hacap",  # its D's rounds are set there since (LeakGAN's schedule)
                     "report",  # each RL row against its XE row since (--versus-xe)
                     # C2F on 5 samples for 16 epochs since: one sample for 6 never lifted them
                     "rl@stack_cap", "rl@stack_cap_star",
                     # the attribute loss at 0.2, 3 epochs: at 1 for 2 its classes stayed at chance
                     "detector"}
    # the RL and adversarial recipes moved from --set words into experiment files
    # (configs/experiments/<name>-rl.yaml, ...): the same runs, trained as before
    # (tests/test_recipes.py), from commands that name the file and a seed
    moved = {"rl", "adversarial"}
    # the evaluations pass the engine's ${experiment} since, and declare their metrics file
    told = {"evaluate"}
    for name, stage in before.stages.items():
        if name.split("@", 1)[0] in moved:
            assert now.stages[name].outs == stage.outs, name
        elif name.split("@", 1)[0] in told:
            assert _experiment_untold(now.stages[name]) == stage, name
            assert [m.path for m in now.stages[name].metrics] == [f"{stage.outs[0]}/metrics.json"]
        elif name not in changed_since:
            assert _config_written(now.stages[name], _rewarded(stage)) == _rewarded(stage), name
    kept = [d for d in now.stages["tables"].deps if d in before.stages["tables"].deps]
    assert kept == list(before.stages["tables"].deps)


def _experiment_untold(stage):
    """An evaluate stage as written before it passed ``--experiment ${experiment}`` (the engine
    gives the experiment it runs in) and declared its metrics file."""
    from dataclasses import replace

    told = " --experiment ${experiment}"
    assert stage.cmd_template.endswith(told) and stage.argv[-2:] == ("--experiment",
                                                                      "${experiment}")
    return replace(stage, cmd=stage.cmd.removesuffix(told),
                   cmd_template=stage.cmd_template.removesuffix(told), argv=stage.argv[:-2],
                   given=(), metrics=())


def _config_written(stage, before):
    """A training stage as written before its experiment file became its param ``config``
    (so that a named experiment can set a variant's file): the same command once resolved."""
    from dataclasses import replace

    if "config" not in stage.params:
        return stage
    assert stage.params["config"] == f"configs/experiments/{stage.params['key']}.yaml"
    return replace(stage, cmd_template=before.cmd_template,
                   params={k: v for k, v in stage.params.items() if k != "config"})


def test_shipped_stages_files_and_experiments_are_valid():
    """stages.yaml, configs/*.yaml and every experiment they name parse strictly."""
    from pathlib import Path

    from cli import main
    from pipeline.engine.stagefile import load_stages_file
    from trainer.config import load_experiment

    root = Path(__file__).resolve().parent.parent
    for stages_file in [root / "stages.yaml", *sorted((root / "configs").glob("*.yaml"))]:
        stages = load_stages_file(stages_file, main.commands)
        for stage in stages.stages.values():
            if stage.command == "train":
                load_experiment(root / stage.argv[1], [a for a in stage.argv[2:]
                                                       if "=" in a and not a.startswith("-")])
    coco = load_stages_file(root / "configs" / "coco.yaml", main.commands).stages
    assert {"tables_stack_cap", "tables_show_attend_tell", "tables_bottom_up",
            "tables_gru_baseline"} <= set(coco)


def test_a_stage_nproc_reaches_its_command_as_capstack_nproc(tmp_path, monkeypatch):
    """``nproc: 2`` on a train stage: the command runs with CAPSTACK_NPROC=2 (its --nproc), and
    nproc is no param: changing it leaves the stage up to date."""
    from cli import _pipeline
    from pipeline.engine import stages

    path = tmp_path / "stages.yaml"
    path.write_text("""
stages:
  train:
    cmd: capstack train x.yaml --out runs/x
    nproc: 2
    outs: [runs/x]
""")
    pipeline = _pipeline(path, tmp_path)
    assert pipeline.file.stage("train").nproc == 2 and pipeline.file.stage("train").params == {}
    seen = {}

    def fake_run(argv, *, executable, cwd=None, env=None, pass_fds=()):
        seen.update(argv=argv, nproc=env.get("CAPSTACK_NPROC"))
        (tmp_path / "runs" / "x").mkdir(parents=True)
        return 0

    monkeypatch.setattr(stages, "run_kept", fake_run)  # the command, as the engine starts it
    pipeline.run("train", report=lambda line: None)
    assert seen["nproc"] == "2" and seen["argv"][-4:] == ["train", "x.yaml", "--out", "runs/x"]
    path.write_text(path.read_text().replace("nproc: 2", "nproc: 4"))
    again = _pipeline(path, tmp_path)
    assert again.own_status(again.file.stage("train")).up_to_date


WHEN = """
params:
  source: ""
stages:
  extract:
    when: not source
    cmd: capstack shapes data/shapes --train 4 --val 1 --test 1 --size 32
    outs: [data/features.json]
  import:
    when: source
    cmd: capstack shapes ${source} --train 4 --val 1 --test 1 --size 32
    deps:
      - ${source}
    outs: [data/features.json]
  prepare:
    cmd: capstack prepare data/features.json data/prepared
    deps: [data/features.json]
    outs: [data/prepared]
"""


def test_when_turns_one_of_two_stages_with_the_same_out_on(tmp_path, capstack):
    from cli import main
    from pipeline.core.errors import CapstackError
    from pipeline.engine.stagefile import load_stages_file

    path = tmp_path / "stages.yaml"
    path.write_text(WHEN)
    stages = load_stages_file(path, main.commands)
    assert set(stages.stages) == {"extract", "prepare"} and stages.upstream["prepare"] == (
        "extract",)
    assert stages.off == {"import": "when: source, and source is not set"}
    with pytest.raises(CapstackError, match="stage 'import' is off"):
        stages.stage("import")
    path.write_text(WHEN.replace('source: ""', "source: /data/trainval"))
    stages = load_stages_file(path, main.commands)
    assert stages.upstream["prepare"] == ("import",) and "extract" in stages.off
    listed = capstack("stages", "-c", path, "--workdir", tmp_path).output
    assert "extract  off (when: not source, and source is set)" in listed
    refused = capstack("run", "extract", "-c", path, "--workdir", tmp_path, expect_ok=False)
    assert refused.exit_code == 1 and "stage 'extract' is off" in refused.output
    for bad, message in (("when: sauce", "stages.import.when: unknown param 'sauce'"),
                         ("when: not", "stages.import.when: expected NAME or 'not NAME'")):
        path.write_text(WHEN.replace("when: source", bad))
        with pytest.raises(CapstackError, match=message):
            load_stages_file(path, main.commands)


def test_setting_region_source_in_coco_yaml_imports_instead_of_extracting(tmp_path):
    from pathlib import Path

    import yaml

    from cli import main
    from pipeline.engine.stagefile import load_stages_file

    coco = Path(__file__).resolve().parent.parent / "configs" / "coco.yaml"
    stages = load_stages_file(coco, main.commands)
    assert set(stages.upstream["train@bottom_up/top_down"]) == {"extract_regions", "prepare"}
    data = yaml.safe_load(coco.read_text())
    data["params"]["region_source"] = "/data/bottom-up/trainval"
    (tmp_path / "coco.yaml").write_text(yaml.safe_dump(data))
    stages = load_stages_file(tmp_path / "coco.yaml", main.commands)
    assert "extract_regions" in stages.off
    assert set(stages.upstream["train@bottom_up/top_down"]) == {"import_regions", "prepare"}
    assert stages.stage("import_regions").argv[:3] == ("import-features", "butd-tsv",
                                                       "/data/bottom-up/trainval")


def test_a_foreach_entrys_params_may_name_its_key_and_items(tmp_path):
    from cli import main
    from pipeline.engine.stagefile import load_stages_file

    path = tmp_path / "stages.yaml"
    family = """
  train:
    foreach: {a: {depth: 2}, b: {depth: 3}}
    do:
      cmd: capstack train ${config} --out runs/${key}
      params: {config: "configs/${key}-${item.depth}.yaml"}
      deps:
        - ${config}
      outs:
        - runs/${key}
"""
    path.write_text(GOOD + family)
    stages = load_stages_file(path, main.commands).stages
    assert stages["train@b"].argv[1] == "configs/b-3.yaml"
    assert stages["train@a"].deps == ("configs/a-2.yaml",)
    path.write_text(GOOD + family.replace("${item.depth}", "${min_count}"))
    with pytest.raises(CapstackError, match=r"stages.train.do.params.config: unknown param "
                                            r"\$\{min_count\}"):
        load_stages_file(path, main.commands)


def test_a_cmd_is_given_its_experiment_when_it_runs_and_records_no_param(tmp_path):
    """``${experiment}`` is the engine's: left in the cmd when the file is read, never a param
    (where a stage runs never makes it stale), filled when the stage runs, one word without a
    shell (the baseline's an empty word), pasted as it is with one."""
    from pipeline.engine.interpolation import with_given
    from pipeline.engine.stagefile import MetricsFile, load_stages_file

    path = tmp_path / "stages.yaml"
    path.write_text("""
stages:
  evaluate:
    foreach: [a]
    do:
      cmd: python eval.py runs/${key} evals/${key} --experiment ${experiment}
      outs:
        - evals/${key}
      metrics:
        - evals/${key}/metrics.json
        - path: evals/${key}/more.json
          show: [metrics.CIDEr]
          percent: true
  noted:
    cmd: echo ${experiment} > noted.txt
    shell: true
    outs: [noted.txt]
""")
    stages = load_stages_file(path, ["evaluate"]).stages
    stage = stages["evaluate@a"]
    assert stage.params == {"key": "a"} and stage.given == ("experiment",)
    assert stage.metrics == (MetricsFile("evals/a/metrics.json"),
                             MetricsFile("evals/a/more.json", ("metrics.CIDEr",), True))
    baseline = with_given(stage, {"experiment": ""})
    assert baseline.argv[-2:] == ("--experiment", "")
    assert baseline.cmd.endswith("--experiment ''")
    named = with_given(stage, {"experiment": "mc1"})
    assert named.argv[-1] == "mc1" and named.cmd_template == stage.cmd_template
    assert with_given(stages["noted"], {"experiment": "a b"}).argv == (
        "/bin/sh", "-c", "echo a b > noted.txt")
