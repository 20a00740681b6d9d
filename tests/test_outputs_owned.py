"""No command deletes what it did not write: an output folder that capstack did not write is
refused (unless --force), and a folder holding the command's input is refused always."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import main
from pipeline.captions.prepare import prepare_captions
from pipeline.core.atomic import OUTPUT_MARKER
from pipeline.core.errors import CapstackError
from pipeline.demo.shapes import write_shapes_dataset


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("src") / "shapes"
    write_shapes_dataset(root, n_train=4, n_val=1, n_test=1, seed=1, size=32, progress=False)
    return root / "dataset_shapes.json"


def test_prepare_refuses_a_folder_it_did_not_write_and_deletes_nothing(dataset, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    (out / "images").mkdir()
    before = snapshot(out)
    result = run("prepare", dataset, out)
    assert result.exit_code != 0
    assert "capstack did not write it (it holds images/, notes.txt)" in result.output
    assert "--force" in result.output and snapshot(out) == before
    forced = run("prepare", dataset, out, "--force")
    assert forced.exit_code == 0, forced.output
    assert not (out / "notes.txt").exists() and (out / OUTPUT_MARKER).is_file()


def test_a_rerun_replaces_its_own_output_and_an_empty_folder_is_taken(dataset, tmp_path):
    out = tmp_path / "prepared"
    out.mkdir()  # empty: nothing to lose
    assert run("prepare", dataset, out).exit_code == 0
    vocab = json.loads((out / "vocab.json").read_text())
    again = run("prepare", dataset, out, "--min-count", "1")
    assert again.exit_code == 0, again.output
    assert json.loads((out / "vocab.json").read_text()) != vocab


def test_an_output_folder_holding_the_input_is_refused_even_with_force(dataset, tmp_path):
    data = dataset.parent
    before = snapshot(data)
    for extra in ((), ("--force",)):
        result = run("prepare", dataset, data, *extra)
        assert result.exit_code != 0 and "holds the input" in result.output, result.output
    assert snapshot(data) == before


def test_prepare_into_the_current_folder_is_a_one_line_refusal(dataset, tmp_path, monkeypatch):
    """'prepare ds.json .' once raised a traceback ('.' has an empty name)."""
    (tmp_path / "keep.txt").write_text("x")
    monkeypatch.chdir(tmp_path)
    result = run("prepare", dataset, ".")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert f"{tmp_path}: exists and capstack did not write it" in result.output
    assert (tmp_path / "keep.txt").read_text() == "x"


def test_shapes_refuses_a_folder_it_did_not_write(tmp_path):
    out = tmp_path / "photos"
    out.mkdir()
    (out / "holiday.png").write_bytes(b"not mine to delete")
    result = run("shapes", out, "--train", 2, "--val", 1, "--test", 1, "--size", 32)
    assert result.exit_code != 0 and "holiday.png" in result.output
    assert (out / "holiday.png").read_bytes() == b"not mine to delete"
    assert run("shapes", out, "--train", 2, "--val", 1, "--test", 1, "--size", 32,
               "--force").exit_code == 0
    # drawn by capstack, so the same command redraws it without --force
    assert run("shapes", out, "--train", 3, "--val", 1, "--test", 1, "--size", 32).exit_code == 0
    assert len(json.loads((out / "dataset_shapes.json").read_text())["images"]) == 5


def test_a_file_where_the_folder_should_be_is_refused(dataset, tmp_path):
    out = tmp_path / "prepared"
    out.write_text("a file")
    result = run("prepare", dataset, out)  # click names it first
    assert result.exit_code != 0 and "is a file" in result.output
    with pytest.raises(CapstackError, match="is not a folder capstack wrote"):
        prepare_captions(dataset, out)
    assert out.read_text() == "a file"
