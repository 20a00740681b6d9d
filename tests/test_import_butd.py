"""Importing bottom-up-attention TSV files: records, bad rows, ids, provenance, reuse, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from feature_sources import butd_line, dataset_json, region_rows, undecodable_line, write_butd_tsv

from pipeline.core.errors import CapstackError
from pipeline.features.interchange.importer import ImportJob, import_features
from pipeline.features.stores import open_store
from process_helpers import committed_records, wait_for

N = 24


def run_import(sources, dataset, root, **kw):
    job = ImportJob("butd-tsv", [Path(s) for s in sources], dataset, root=root, **kw)
    return import_features(job, progress=False)


def assert_record_equals(store, row, dtype=np.float32):
    record = store.get(row["image_id"])
    np.testing.assert_array_equal(record.features, row["features"].astype(dtype))
    np.testing.assert_array_equal(record["boxes"], row["boxes"])
    assert (record.height, record.width) == (row["image_h"], row["image_w"])


def test_parts_in_a_folder_import_to_the_written_arrays(coco, tmp_path):
    rows = region_rows(range(100, 100 + N))
    folder = tmp_path / "trainval"
    folder.mkdir()
    write_butd_tsv(folder / "trainval_resnet101_faster_rcnn_genome.tsv.0", rows[:10])
    write_butd_tsv(folder / "trainval_resnet101_faster_rcnn_genome.tsv.1", rows[10:])
    result = run_import([folder], coco, tmp_path / "root", dtype="float32")
    store = open_store(result.store)
    assert result.store.name.startswith("regions-butd-tsv-") and len(store) == N
    assert store.schema.names == ("features", "boxes") and store.dtype == np.float32
    for row in rows:
        assert_record_equals(store, row)
    half = open_store(run_import([folder], coco, tmp_path / "root").store)  # float16 default
    assert half.dtype == np.float16
    np.testing.assert_array_equal(half.get(105).features, rows[5]["features"].astype(np.float16))


def test_bad_rows_are_recorded_with_file_line_and_reason_and_the_import_goes_on(coco, tmp_path):
    rows = region_rows(range(100, 100 + N))
    nan_row = dict(rows[4], features=rows[4]["features"].copy())
    nan_row["features"][0, 0] = np.nan
    narrow = dict(rows[6], features=rows[6]["features"][:, :16])
    short = "\t".join(butd_line(rows[8]).split("\t")[:4]) + "\n"
    miscounted = butd_line(rows[10]).split("\t")
    miscounted[3] = str(int(miscounted[3]) + 1)
    broken = {2: undecodable_line(rows[2]), 4: butd_line(nan_row), 6: butd_line(narrow), 8: short,
              10: "\t".join(miscounted)}
    good = [r for k, r in enumerate(rows) if k not in broken]
    lines = {good.index(rows[k + 1]): line for k, line in broken.items()}
    source = write_butd_tsv(tmp_path / "test2014.tsv", good, lines)

    result = run_import([source], coco, tmp_path / "root")
    store = open_store(result.store)
    skipped = store.meta["skipped"]
    assert len(store) == N - 5 and set(skipped) == {str(100 + k) for k in broken}
    assert skipped["102"].startswith(f"{source}:3: features: base64 does not decode")
    assert skipped["102"].endswith("(Incorrect padding)")
    assert "features: non-finite values" in skipped["104"]
    assert "features 16-d, the other rows' are 32-d" in skipped["106"]
    assert "4 columns, expected 6" in skipped["108"]
    assert "num_boxes" in skipped["110"] and "disagrees" in skipped["110"]
    assert store.meta["import"]["bad_rows"] == 5
    for row in good:
        assert_record_equals(store, row, np.float16)


def test_ids_report_missing_outside_and_duplicated_images(coco, tmp_path):
    rows = region_rows([*range(100, 100 + N - 3), 7, 8, 101], seed=1)  # 3 missing, 2 outside
    result = run_import([write_butd_tsv(tmp_path / "f.tsv", rows)], coco, tmp_path / "root")
    report = result.report
    assert (report.imported, report.outside_dataset, report.duplicates) == (N - 3, 2, 1)
    assert report.first_duplicates == [{"image": 101, "where": f"{tmp_path / 'f.tsv'}:{N}"}]
    assert report.missing == 3 and report.first_missing == [121, 122, 123]
    store = open_store(result.store)
    assert_record_equals(store, rows[1], np.float16)  # the first row of image 101 is kept
    assert store.meta["skipped"]["121"] == "no features for it in the butd-tsv sources"


def test_same_sources_reuse_the_store_and_provenance_is_recorded(coco, tmp_path, capstack):
    source = write_butd_tsv(tmp_path / "f.tsv", region_rows(range(100, 100 + N)))
    args = ["import-features", "butd-tsv", source, "--dataset", coco, "--features-root",
            tmp_path / "root", "--describe", "caffemodel=resnet101_faster_rcnn_final.caffemodel",
            "--describe", "max_boxes=9"]
    first = capstack(*args, "--pointer", tmp_path / "a" / "regions.json")
    assert f"imported {N} images" in first.output
    again = capstack(*args, "--pointer", tmp_path / "b" / "regions.json")
    assert "nothing to import" in again.output
    a, b = (json.loads((tmp_path / x / "regions.json").read_text()) for x in "ab")
    assert a == b
    store = open_store(a["store"])
    about = store.meta["producer"]["about"]
    assert about["sources"] == [{"path": str(source.resolve()), "size": source.stat().st_size,
                                 "md5": store.meta["producer"]["settings"]["sources"][0]}]
    assert about["described"] == {"caffemodel": "resnet101_faster_rcnn_final.caffemodel",
                                  "max_boxes": "9"}
    assert about["boxes"] == about["boxes_converted_from"] == "x1, y1, x2, y2 in image pixels"
    assert about["fields"] == ["features", "boxes"]
    verified = capstack("verify", tmp_path / "a" / "regions.json", "--dataset", coco)
    assert f"all {N} images" in verified.output
    source.write_text(source.read_text().replace("\t", "\t", 1) + butd_line(
        region_rows([999])[0]))  # new content, new store
    assert capstack(*args).output.count("imported") == 1


def test_a_source_unreadable_as_a_whole_stops_naming_it_with_nothing_written(coco, tmp_path):
    junk = tmp_path / "junk.tsv"
    junk.write_bytes(bytes(range(256)) * 64)
    with pytest.raises(CapstackError, match=f"{junk}: not readable as butd-tsv"):
        run_import([junk], coco, tmp_path / "root")
    assert not any((tmp_path / "root").glob("regions-*"))
    with pytest.raises(CapstackError, match="nothing.tsv: BUTD TSV not found"):
        run_import([tmp_path / "nothing.tsv"], coco, tmp_path / "root")


def test_rows_of_another_dataset_stop_the_import_with_nothing_kept(coco, tmp_path):
    source = write_butd_tsv(tmp_path / "f.tsv", region_rows(range(5000, 5010)))
    with pytest.raises(CapstackError, match="no row matched an image of"):
        run_import([source], coco, tmp_path / "root")
    assert not any((tmp_path / "root").glob("regions-*"))


def _import_cmd(sources, dataset, root, log):
    return subprocess.Popen(
        [sys.executable, "-m", "cli", "import-features", "butd-tsv", *map(str, sources),
         "--dataset", str(dataset), "--features-root", str(root), "--commit-mb", "0.05"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        cwd=Path(__file__).resolve().parents[1])


def test_a_killed_multi_part_import_resumes_to_the_uninterrupted_store(tmp_path):
    n = 600
    dataset = dataset_json(tmp_path / "dataset_coco.json", n)
    rows = region_rows(range(100, 100 + n), dim=256, boxes=(10, 36), seed=2)
    broken = undecodable_line(rows[0])  # and a duplicate of image 100
    parts = [write_butd_tsv(tmp_path / f"trainval.tsv.{k}", rows[k * 200:(k + 1) * 200],
                            {50: broken} if k == 1 else None) for k in range(3)]
    reference = run_import(parts, dataset, tmp_path / "reference")
    root = tmp_path / "root"
    with open(tmp_path / "log.txt", "w") as log:
        proc = _import_cmd(parts, dataset, root, log)
        partial = wait_for(lambda: next(root.glob("regions-*.partial"), None))
        wait_for(lambda: committed_records(partial) >= 250, timeout=300)
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(60) != 0
    assert 250 <= committed_records(partial) < n
    with open(tmp_path / "log2.txt", "w") as log:
        assert _import_cmd(parts, dataset, root, log).wait(300) == 0
    resumed, expected = open_store(root / reference.store.name), open_store(reference.store)
    assert sorted(resumed.ids()) == sorted(expected.ids()) and len(resumed) == n
    for i in expected.ids():
        a, b = resumed.get(i), expected.get(i)
        for name in expected.schema.names:
            np.testing.assert_array_equal(a[name], b[name])
    assert resumed.meta["skipped"] == expected.meta["skipped"]
    assert resumed.meta["import"] == expected.meta["import"]
    assert expected.meta["import"]["duplicates"] == 1


def test_an_imported_trainval_source_trains_top_down_and_caption_says_why_not(tmp_path, capstack):
    from trainer_fixtures import make_prepared, write_experiment

    dataset, prepared = make_prepared(tmp_path, n_train=12, n_val=4, n_test=4)
    ids = [im["imgid"] for im in json.loads(dataset.read_text())["images"]]
    rows = region_rows(ids, dim=48, boxes=(10, 20), seed=4, size=(64, 64))
    undecodable = {k: undecodable_line(rows[k]) for k in (1, 6, 13)}
    parts = tmp_path / "trainval"
    parts.mkdir()
    write_butd_tsv(parts / "trainval_resnet101_faster_rcnn_genome.tsv.0",
                   [r for k, r in enumerate(rows[:10]) if k not in undecodable],
                   {0: undecodable[1], 4: undecodable[6]})
    write_butd_tsv(parts / "trainval_resnet101_faster_rcnn_genome.tsv.1",
                   [r for k, r in enumerate(rows[10:], 10) if k not in undecodable],
                   {2: undecodable[13]})
    out = capstack("import-features", "butd-tsv", parts, "--dataset", dataset,
                   "--features-root", tmp_path / "root", "--pointer",
                   tmp_path / "regions.json").output
    assert f"imported {len(ids) - 3} images" in out and "3 broken rows skipped" in out
    assert out.count("base64 does not decode (Incorrect padding)") == 3
    exp = write_experiment(tmp_path / "top_down.yaml", decoder="top_down", captions=prepared,
                           features=[tmp_path / "regions.json"], epochs=1)
    trained = capstack("train", exp, "--out", tmp_path / "run").output
    assert "train top_down: 1 epochs" in trained and (tmp_path / "run" / "best.pt").is_file()
    image = tmp_path / "shapes" / "images" / json.loads(dataset.read_text())["images"][0][
        "filename"]
    refused = capstack("caption", "--checkpoint", tmp_path / "run", image, expect_ok=False)
    assert refused.exit_code == 1 and "imported from butd-tsv files" in refused.output


def test_lxmert_ten_column_files_keep_classes_and_attributes(coco, tmp_path):
    """airsplay/lxmert's extract_coco_image.py: img_id (file stem), img_h, img_w, objects_id,
    objects_conf, attrs_id, attrs_conf, num_boxes, boxes, features."""
    from feature_sources import b64

    rows = region_rows(range(100, 100 + N), seed=7)
    with open(tmp_path / "val2014_obj36.tsv", "w", newline="") as f:
        for row in rows:
            f.write("\t".join([f"COCO_val2014_{row['image_id']:012d}", str(row["image_h"]),
                               str(row["image_w"]), b64(row["classes"].astype(np.int64)),
                               b64(row["scores"].astype(np.float32)),
                               b64(row["attributes"].astype(np.int64)),
                               b64(row["attribute_scores"].astype(np.float32)),
                               str(len(row["boxes"])), b64(row["boxes"]),
                               b64(row["features"])]) + "\r\n")
    store = open_store(run_import([tmp_path / "val2014_obj36.tsv"], coco, tmp_path / "root",
                                  dtype="float32").store)
    assert store.schema.names == ("features", "boxes", "classes", "scores", "attributes",
                                  "attribute_scores")
    for row in rows:
        assert_record_equals(store, row)
        record = store.get(row["image_id"])
        np.testing.assert_array_equal(record["classes"], row["classes"])
        np.testing.assert_array_equal(record["attributes"], row["attributes"])
        np.testing.assert_allclose(record["attribute_scores"], row["attribute_scores"],
                                   rtol=1e-6)
