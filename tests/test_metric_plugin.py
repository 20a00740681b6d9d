"""A metric added as one file: scored at evaluation, a column of the report, a select_on choice.

The file is added to a copy of capstack (tests/test_code_version.py's), so nothing else is
touched: no list of metrics, column or choice is written anywhere else.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from test_code_version import capstack_copy
from trainer_fixtures import logged, prepared_with_grid, write_experiment

LENGTH_METRIC = '''"""Mean words per caption over 20: a metric of this test only."""

from trainer.scoring.metrics import METRICS
from trainer.scoring.metrics.base import Metric


@METRICS.register("length")
class Length(Metric):
    """Mean words per caption / 20."""

    values = ("LEN",)
    columns = ("Len",)
    keys = ("length",)
    place = 45  # after CIDEr, before SPICE

    def compute(self, texts):
        words = [len(c.split()) for c in texts.captions.values()]
        return [sum(words) / len(words) / 20]
'''


@pytest.fixture(scope="module")
def copy_with_metric(tmp_path_factory):
    root = tmp_path_factory.mktemp("metric")
    script = capstack_copy(root)
    (root / "trainer/scoring/metrics/length.py").write_text(LENGTH_METRIC)
    return script, root


def run(script, cwd, *args):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(script), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow  # three capstack processes: train, evaluate (Java), report
def test_a_metric_file_is_trained_on_scored_and_reported(copy_with_metric):
    script, root = copy_with_metric
    prepared, grid = prepared_with_grid(root / "data")
    experiment = write_experiment(root / "exp.yaml", decoder="show_tell", captions=prepared,
                                  features=[grid], epochs=2, select_on="length")
    out = run(script, root, "train", experiment, "--out", root / "run")
    assert "best val LEN" in out  # the kept epoch is named by the new metric's value
    assert logged(root / "run", "loss") and all(
        "length" in line for line in map(json.loads, (root / "run/metrics.jsonl").read_text()
                                         .splitlines()) if line["kind"] == "val")
    run(script, root, "evaluate", root / "run", "--out", root / "eval", "--figures", "0")
    doc = json.loads((root / "eval/metrics.json").read_text())
    words = [len(r["caption"].split()) for r in
             json.loads((root / "eval/results_test.json").read_text())]
    assert doc["metrics"]["LEN"] == pytest.approx(sum(words) / len(words) / 20)
    run(script, root, "report", root / "eval", "--out", root / "report")
    table = pd.read_csv(root / "report/metrics.csv")
    assert list(table.columns)[-3:] == ["CIDEr", "Len", "SPICE"]
    assert table["Len"][0] == pytest.approx(round(100 * doc["metrics"]["LEN"], 1))
    assert "| Len |" in (root / "report/metrics.md").read_text()
