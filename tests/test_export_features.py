"""capstack's stores out to other toolkits' layouts, and back in through the importers."""

from __future__ import annotations

import numpy as np

from pipeline.features.stores import open_store
from trainer_fixtures import write_feature_store

IDS = list(range(100, 110))


def imported(capstack, layout, source, coco, tmp_path):
    capstack("import-features", layout, source, "--dataset", coco, "--features-root",
             tmp_path / "root", "--pointer", tmp_path / f"{layout}.json")
    return open_store(tmp_path / "root" / next(
        p.name for p in (tmp_path / "root").glob("*-" + layout + "-*") if p.suffix == ".lmdb"))


def assert_same_records(a, b, fields, sizes=True):
    assert sorted(a.ids()) == sorted(b.ids())
    for i in a.ids():
        for name in fields:
            np.testing.assert_array_equal(a.get(i)[name], b.get(i)[name])
        if sizes:
            assert (a.get(i).height, a.get(i).width) == (b.get(i).height, b.get(i).width)


def test_regions_round_trip_through_butd_tsv(capstack, coco, tmp_path):
    store = write_feature_store(tmp_path / "regions.lmdb", IDS, kind="regions", dim=12)
    out = capstack("export-features", store, "butd-tsv", tmp_path / "out.tsv").output
    assert str(tmp_path / "out.tsv") in out
    lines = (tmp_path / "out.tsv").read_bytes().split(b"\r\n")
    assert len(lines) == len(IDS) + 1 and len(lines[0].split(b"\t")) == 6
    back = imported(capstack, "butd-tsv", tmp_path / "out.tsv", coco, tmp_path)
    assert_same_records(open_store(store), back, ("features", "boxes"))
    again = capstack("export-features", store, "butd-tsv", tmp_path / "out.tsv", expect_ok=False)
    assert again.exit_code == 1 and "already exists" in again.output


def test_regions_and_grids_round_trip_through_rtl_npz(capstack, coco, tmp_path):
    regions = write_feature_store(tmp_path / "regions.lmdb", IDS, kind="regions", dim=12)
    capstack("export-features", regions, "rtl-npz", tmp_path / "cocobu")
    assert {p.name for p in tmp_path.glob("cocobu_*")} == {"cocobu_att", "cocobu_fc", "cocobu_box"}
    np.testing.assert_allclose(np.load(tmp_path / "cocobu_fc" / "104.npy"),
                               open_store(regions).get(104).features.astype(np.float32).mean(0))
    back = imported(capstack, "rtl-npz", tmp_path / "cocobu", coco, tmp_path)
    assert_same_records(open_store(regions), back, ("features", "boxes"), sizes=False)

    grid = write_feature_store(tmp_path / "grid.h5", IDS, kind="grid", rows=9, dim=8)
    capstack("export-features", grid, "rtl-npz", tmp_path / "cocogrid")
    assert np.load(tmp_path / "cocogrid_att" / "101.npz")["feat"].shape == (3, 3, 8)
    refused = capstack("export-features", grid, "butd-tsv", tmp_path / "g.tsv", expect_ok=False)
    assert "export it as rtl-npz" in refused.output
    capstack("import-features", "rtl-npz", tmp_path / "cocogrid_att", "--dataset", coco,
             "--out", tmp_path / "grid-back.h5")
    back = open_store(tmp_path / "grid-back.h5")
    assert back.schema.grid == 3
    assert_same_records(open_store(grid), back, ("features",), sizes=False)
