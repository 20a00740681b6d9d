"""A stage whose cmd is any program (a python script here), on a real project in a tmp dir:
it runs, is skipped when unchanged, reruns for its script dep or a param, runs through a shell
only when it says ``shell: true``, and a missing or failing program records nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

# src dst [words...]: dst gets src's text upper-cased followed by the words; "-" is stdin /
# stdout. Every call appends its arguments to calls.log (not an out: it only counts the runs).
TOOL = """\
import json, sys
src, dst, *words = sys.argv[1:]
text = sys.stdin.read() if src == "-" else open(src).read()
with open("calls.log", "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
result = text.upper() + "".join(words)
if dst == "-":
    sys.stdout.write(result)
else:
    open(dst, "w").write(result)
"""

STAGES = """
params:
  python: {python}
stages:
  upper:
    cmd: ${{python}} scripts/tool.py in.txt out.txt ${{suffix}}
    params: {{suffix: "!"}}
    deps: [scripts/tool.py, in.txt]
    outs: [out.txt]
"""


def write_stages(workdir: Path, text: str = STAGES) -> Path:
    path = workdir / "stages.yaml"
    path.write_text(text.format(python=json.dumps(sys.executable)))
    return path


@pytest.fixture
def project(capstack):
    (capstack.workdir / "scripts").mkdir()
    (capstack.workdir / "scripts" / "tool.py").write_text(TOOL)
    (capstack.workdir / "in.txt").write_text("hello")
    write_stages(capstack.workdir)
    return capstack


def calls(capstack) -> list[list[str]]:
    log = capstack.workdir / "calls.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def lock_entry(capstack, stage: str = "upper"):
    lock = capstack.workdir / "stages.lock"
    return yaml.safe_load(lock.read_text())["stages"].get(stage) if lock.exists() else None


def status(capstack, stage: str = "upper") -> dict:
    return capstack.statuses()[stage]


def test_a_python_script_stage_runs_and_is_recorded(project):
    assert status(project) == {"state": "never run", "reasons": []}
    out = project.stage_cmd("run", "upper").output
    assert f"Running stage 'upper' (never run): {sys.executable} scripts/tool.py" in out
    assert (project.workdir / "out.txt").read_text() == "HELLO!"
    entry = lock_entry(project)
    assert entry["cmd"] == "${python} scripts/tool.py in.txt out.txt ${suffix}"
    assert entry["params"] == {"python": sys.executable, "suffix": "!"}
    assert entry["code"] == {}  # another program's code is tracked through its deps only
    assert set(entry["deps"]) == {"scripts/tool.py", "in.txt"} and set(entry["outs"]) == {
        "out.txt"}
    assert status(project) == {"state": "up to date", "reasons": []}


def test_an_unchanged_script_stage_is_skipped(project):
    project.stage_cmd("run", "upper")
    again = project.stage_cmd("run", "upper").output
    assert "Stage 'upper' is up to date, skipping." in again
    assert "0 stage(s) ran, 1 up to date" in project.stage_cmd("demo").output
    assert len(calls(project)) == 1


def test_a_changed_script_dep_makes_the_stage_stale_and_it_reruns(project):
    project.stage_cmd("run", "upper")
    script = project.workdir / "scripts" / "tool.py"
    script.write_text(TOOL.replace("text.upper()", "text.upper() + '?'"))
    assert status(project) == {"state": "stale", "reasons": ["dep scripts/tool.py changed"]}
    out = project.stage_cmd("run", "upper").output
    assert "Running stage 'upper' (stale: dep scripts/tool.py changed)" in out
    assert (project.workdir / "out.txt").read_text() == "HELLO?!"
    assert status(project)["state"] == "up to date" and len(calls(project)) == 2


def test_a_changed_param_makes_the_stage_stale_and_it_reruns(project):
    project.stage_cmd("run", "upper")
    write_stages(project.workdir, STAGES.replace('{{suffix: "!"}}', '{{suffix: "?"}}'))
    assert status(project) == {"state": "stale", "reasons": ["param suffix '!' -> '?'"]}
    project.stage_cmd("run", "upper")
    assert (project.workdir / "out.txt").read_text() == "HELLO?"
    assert lock_entry(project)["params"]["suffix"] == "?"
    project.stage_cmd("run", "upper", "--set", "suffix=+")  # an experiment beside it
    assert (project.workdir / "exps" / "suffix-+" / "out.txt").read_text() == "HELLO+"
    assert (project.workdir / "out.txt").read_text() == "HELLO?"
    assert status(project) == {"state": "up to date", "reasons": []}


def test_shell_true_runs_a_pipe_with_params_substituted_first(project):
    write_stages(project.workdir, STAGES.replace(
        "cmd: ${{python}} scripts/tool.py in.txt out.txt ${{suffix}}",
        "shell: true\n"
        "    cmd: ${{python}} scripts/tool.py in.txt - | ${{python}} scripts/tool.py - out.txt "
        "${{suffix}}"))
    project.stage_cmd("run", "upper")
    assert (project.workdir / "out.txt").read_text() == "HELLO!"
    assert calls(project) == [["in.txt", "-"], ["-", "out.txt", "!"]]
    assert lock_entry(project)["shell"] is True
    assert status(project)["state"] == "up to date"
    write_stages(project.workdir)  # the same words without the shell: not the same command
    assert status(project)["reasons"] == ["cmd changed"]


def test_without_shell_separators_and_param_values_are_literal_arguments(project):
    write_stages(project.workdir, STAGES.replace(
        "in.txt out.txt ${{suffix}}", "in.txt out.txt ; touch PWNED | cat ${{suffix}} $(touch X)")
        .replace('{{suffix: "!"}}', '{{suffix: "; touch PWNED2 && echo `id`"}}'))
    project.stage_cmd("run", "upper")
    assert calls(project) == [["in.txt", "out.txt", ";", "touch", "PWNED", "|", "cat",
                               "; touch PWNED2 && echo `id`", "$(touch", "X)"]]
    assert not list(project.workdir.glob("PWNED*")) and not (project.workdir / "X)").exists()


def test_shell_false_is_the_default(project):
    write_stages(project.workdir, STAGES.replace("    params:", "    shell: false\n    params:"))
    project.stage_cmd("run", "upper")
    assert "shell" not in lock_entry(project)
    write_stages(project.workdir)
    assert status(project)["state"] == "up to date"


@pytest.mark.parametrize("program, where", [
    ("no-such-program-3f9a", "on PATH"),
    ("./scripts/no-such-script.sh", "in {workdir}"),
])
def test_a_missing_program_is_named_and_nothing_is_recorded(project, program, where):
    path = write_stages(project.workdir, STAGES.replace("${{python}} scripts/tool.py", program))
    result = project.stage_cmd("run", "upper", expect_ok=False)
    assert result.exit_code == 1 and "Traceback" not in result.output
    where = where.format(workdir=project.workdir)
    assert result.output.splitlines()[-1] == (
        f"Error: {path}: stages.upper.cmd: program '{program}' not found ({where})")
    assert not (project.workdir / "stages.lock").exists()
    assert status(project)["state"] == "never run"


def test_a_program_that_is_not_executable_is_named(project):
    path = write_stages(project.workdir, STAGES.replace("${{python}} scripts/tool.py",
                                                        "scripts/tool.py"))
    os.chmod(project.workdir / "scripts" / "tool.py", 0o644)
    result = project.stage_cmd("run", "upper", expect_ok=False)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert (f"{path}: stages.upper.cmd: cannot run program 'scripts/tool.py': "
            f"Permission denied") in result.output
    assert not (project.workdir / "stages.lock").exists()


def test_a_failing_program_fails_the_stage_and_keeps_the_last_record(project):
    project.stage_cmd("run", "upper")
    before = lock_entry(project)
    script = project.workdir / "scripts" / "tool.py"
    script.write_text("import sys\nsys.exit(3)\n")
    result = project.stage_cmd("run", "upper", expect_ok=False)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert (f"stage 'upper' failed: `{sys.executable} scripts/tool.py in.txt out.txt '!'` "
            f"exited with status 3; nothing was recorded") in result.output
    assert lock_entry(project) == before
    # the stale stage set its out aside before it ran (kept beside it, never deleted)
    assert status(project) == {"state": "stale", "reasons": ["dep scripts/tool.py changed",
                                                             "out out.txt missing"]}
    assert (project.workdir / "out.txt.old").is_file()


def test_a_shell_whose_command_is_not_found_says_so(project):
    write_stages(project.workdir, STAGES.replace(
        "cmd: ${{python}} scripts/tool.py", "shell: true\n    cmd: no-such-program-3f9a"))
    result = project.stage_cmd("run", "upper", expect_ok=False)
    assert result.exit_code == 1
    assert "exited with status 127 (the shell found no such command)" in result.output
    assert not (project.workdir / "stages.lock").exists()


def test_an_out_the_program_did_not_write_fails_the_stage(project):
    write_stages(project.workdir, STAGES.replace("outs: [out.txt]", "outs: [out.txt, extra.txt]"))
    result = project.stage_cmd("run", "upper", expect_ok=False)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "succeeded but did not write its out extra.txt" in result.output
    assert not (project.workdir / "stages.lock").exists()


@pytest.mark.parametrize("value, shown", [('"yes"', "'yes'"), ("1", "1"), ("[true]", "[True]")])
def test_shell_must_be_a_boolean(project, value, shown):
    path = write_stages(project.workdir, STAGES.replace("    params:",
                                                        f"    shell: {value}\n    params:"))
    for verb in (("stages",), ("run", "upper")):
        result = project.stage_cmd(*verb, expect_ok=False)
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert f"{path}: stages.upper.shell: expected true or false, got {shown}" in result.output
    assert not (project.workdir / "stages.lock").exists() and not calls(project)


def test_nproc_is_refused_for_another_program(project):
    path = write_stages(project.workdir, STAGES.replace("    params:", "    nproc: 2\n    params:"))
    result = project.stage_cmd("stages", expect_ok=False)
    assert result.exit_code == 1
    assert f"{path}: stages.upper.nproc: is for capstack commands" in result.output


def test_a_capstack_stage_and_a_script_stage_chain(project):
    """A script's stage downstream of a capstack command's: ordered by their paths as ever."""
    (project.workdir / "scripts" / "count.py").write_text(
        "import json, sys\n"
        "images = json.load(open(sys.argv[1]))['images']\n"
        "open(sys.argv[2], 'w').write(str(len(images)))\n")
    (project.workdir / "stages.yaml").write_text(f"""
params:
  python: {json.dumps(sys.executable)}
stages:
  shapes:
    cmd: capstack shapes data/shapes --train 3 --val 1 --test 1 --size 32
    outs: [data/shapes]
  count:
    cmd: ${{python}} scripts/count.py data/shapes/dataset_shapes.json count.txt
    deps: [scripts/count.py, data/shapes/dataset_shapes.json]
    outs: [count.txt]
""")
    out = project.stage_cmd("run", "count", "--with-deps").output
    assert out.index("Running stage 'shapes'") < out.index("Running stage 'count'")
    assert (project.workdir / "count.txt").read_text() == "5"
    entries = yaml.safe_load((project.workdir / "stages.lock").read_text())["stages"]
    assert entries["shapes"]["code"] and entries["count"]["code"] == {}
    assert project.statuses()["count"] == {"state": "up to date", "reasons": []}


WAITER = """\
import sys, time
from pathlib import Path
Path("started").write_text("")
deadline = time.time() + 60
while not Path("go").exists() and time.time() < deadline:
    time.sleep(0.05)
Path(sys.argv[1]).write_text("done")
"""


def test_one_runner_per_script_stage_and_its_record_comes_last(project):
    (project.workdir / "scripts" / "wait.py").write_text(WAITER)
    write_stages(project.workdir, STAGES.replace("scripts/tool.py in.txt out.txt ${{suffix}}",
                                                 "scripts/wait.py out.txt")
                 .replace('    params: {{suffix: "!"}}\n', "")
                 .replace("scripts/tool.py, in.txt", "scripts/wait.py"))
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve().parents[1] / "cli.py"),
                             "run", "upper", "--workdir", str(project.workdir), "-c",
                             str(project.workdir / "stages.yaml")],
                            cwd=project.workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while not (project.workdir / "started").exists():
            assert proc.poll() is None, proc.stdout.read()
            assert time.time() < deadline
            time.sleep(0.05)
        assert lock_entry(project) is None  # running, not recorded
        second = project.stage_cmd("run", "upper", expect_ok=False)
        assert second.exit_code == 1
        assert "stage 'upper'" in second.output and "is already running" in second.output
        assert f"pid {proc.pid}" in second.output
        (project.workdir / "go").write_text("")
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (project.workdir / "out.txt").read_text() == "done"
    assert lock_entry(project)["outs"]["out.txt"]["size"] == 4
    assert status(project)["state"] == "up to date"
