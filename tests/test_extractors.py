"""Extractor kinds by name: the registry, the CLI's lists read from the code, the store names the
demo's commands give (pinned), and older stores rebuilt from their recorded settings."""

from __future__ import annotations

import ast
import hashlib
import json
from dataclasses import fields, is_dataclass
from pathlib import Path

import numpy as np
import click
import pytest
import torch

import cli
from pipeline.captions.karpathy import load_karpathy
from pipeline.core.errors import CapstackError
from pipeline.core.hashing import HashCache
from pipeline.demo.shapes import write_shapes_dataset
from pipeline.features.extract.kinds import (EXTRACTORS, kind_of, kinds_of, maker_of,
                                             setting_defaults)
from pipeline.features.extract.region_extraction import region_settings
from pipeline.features.fingerprint import fingerprint, images_digest
from pipeline.features.stores import open_store

ROOT = Path(__file__).resolve().parents[1]

# The settings the demo's two extraction commands (stages.yaml: extract_grid, extract_regions)
# fingerprinted when the README's transcript was made: its store names end in these
# fingerprints. A change that alters one renames the demo's stores (and every user's).
DEMO_GRID = {
    "kind": "grid", "backbone": "resnet10", "dtype": "float16",
    "images": "1397ef55726018c3c92f0e959b4f45fe", "extractor": "extract-grid",
    "features_version": 1, "weights_md5": "d6c2d8002c21d0e42b8dfd733c945787", "image_size": 224,
    "layer": "layer4", "layer_map": 7, "grid": 7, "feature_dim": 512}
DEMO_DETECTOR = {
    "resnet": {"blocks": [1, 1, 1, 1], "width": 8, "stride_in_1x1": True, "caffe_maxpool": True,
               "res5_stride": 2, "res5_dilation": 1},
    "num_classes": 9, "num_attributes": 11, "rpn_channels": 64, "pool_size": 14,
    "attribute_embedding": 32, "attribute_hidden": 64,
    "proposals": {"pre_nms": 1000, "post_nms": 100, "nms": 0.7, "min_size": 4,
                  "ratios": [0.5, 1.0, 2.0], "scales": [2, 4, 8], "stride": 16},
    "pixel_means_bgr": [102.9801, 115.9465, 122.7717], "min_size": 256, "max_size": 256}
DEMO_REGIONS = {
    "kind": "regions", "backbone": "bottom-up-r14", "dtype": "float16",
    "images": "1397ef55726018c3c92f0e959b4f45fe", "extractor": "extract-regions",
    "features_version": 1, "arch": "bottom-up", "weights_md5": "920593422d53e86d8a89d6b83b466d16",
    "boxes": "detect", "min_size": 256, "max_size": 256, "feature_dim": 256,
    "naming": "capstack", "detector": DEMO_DETECTOR, "top_attributes": 1, "min_boxes": 10,
    "max_boxes": 100, "conf_thresh": 0.2, "nms_thresh": 0.3}
DEMO_FINGERPRINTS = {"extract_grid": ("b23f499e0da8c172", DEMO_GRID),
                     "extract_regions": ("1c36e354a8fe3630", DEMO_REGIONS)}


def torchvision_defaults(arch: str, feature_dim: int) -> dict:
    """``extract-regions DATASET ROOT --arch ARCH --weights random`` on the demo's images
    (random weights: float32 features, which a random network's range needs)."""
    return {"kind": "regions", "backbone": "resnet50", "dtype": "float32",
            "images": DEMO_GRID["images"], "extractor": "extract-regions", "features_version": 1,
            "arch": arch, "weights_md5": "random-seed-0", "boxes": "detect", "min_size": 600,
            "max_size": 1000, "feature_dim": feature_dim, "weights_kind": "auto",
            "num_classes": 91, "min_boxes": 10, "max_boxes": 100, "conf_thresh": 0.2,
            "nms_thresh": 0.3}


TORCHVISION_DEFAULTS = {"fpn": ("d317b0a4ad6c4def", torchvision_defaults("fpn", 1024)),
                        "c4": ("b5caaf08cd594de6", torchvision_defaults("c4", 2048)),
                        "c5": ("e74f3a23379bc411", torchvision_defaults("c5", 2048))}


def demo_argv(stage: str) -> list[str]:
    """The stage's command as stages.yaml resolves it (params filled in)."""
    from pipeline.engine.stagefile import load_stages_file

    stages = load_stages_file(ROOT / "stages.yaml", cli.stage_commands(), [])
    return list(stages.stage(stage).argv)


def retargeted(argv: list[str], dataset: Path, image_root: Path, weights: Path | None,
               tmp: Path) -> list[str]:
    """``argv`` on other images and weights; its pointer and features root in ``tmp``."""
    out = [argv[0], str(dataset), str(image_root)]
    rest = argv[3:]
    for k in range(0, len(rest), 2):
        name, value = rest[k], rest[k + 1]
        if name == "--weights" and weights is not None:
            value = str(weights)
        elif name == "--pointer":
            value = str(tmp / "pointer.json")
        out += [name, value]
    return out + ["--features-root", str(tmp / "features"), "--workers", "0"]


@pytest.fixture
def plan_only(monkeypatch):
    """Extraction commands stop once the store is named: the metadata each would write."""
    from pipeline.features.extract import job as job_module

    planned = []

    def plan(job, items, path, meta, *args):
        planned.append(meta)
        return job_module.JobResult(path, meta["fingerprint"], reused=False)

    monkeypatch.setattr(job_module, "_extract", plan)
    return planned


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A small shapes dataset, resnet10 weights and a bottom-up checkpoint of the demo's shape."""
    from pipeline.features.detectors.checkpoints import save_capstack
    from pipeline.features.detectors.detector import BottomUpDetector, DetectorConfig
    from pipeline.vision.backbones import build_resnet

    root = tmp_path_factory.mktemp("inputs")
    shapes = root / "shapes"
    write_shapes_dataset(shapes, n_train=3, n_val=1, n_test=1, seed=0, size=64)
    torch.manual_seed(0)
    backbone = root / "resnet10.pth"
    torch.save(build_resnet("resnet10").state_dict(), backbone)
    detector = root / "detector.pth"
    save_capstack(BottomUpDetector(DetectorConfig.from_dict(DEMO_DETECTOR)).eval(), detector,
                  objects=[f"object{k}" for k in range(8)],
                  attributes=[f"attribute{k}" for k in range(10)])
    with HashCache(root / "hashes.sqlite") as hashes:
        images = images_digest(load_karpathy(shapes / "dataset_shapes.json"), shapes, hashes)
    return {"dataset": shapes / "dataset_shapes.json", "root": shapes, "images": images,
            "extract_grid": backbone, "extract_regions": detector}


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- the registry

def test_the_registry_lists_every_kind_each_with_its_own_settings():
    assert set(EXTRACTORS) == {"grid", "fpn", "c4", "c5", "bottom-up"}
    assert kinds_of("extract-regions") == ["bottom-up", "c4", "c5", "fpn"]
    assert kinds_of("extract-grid") == ["grid"]
    for name, kind in EXTRACTORS.items():
        assert is_dataclass(kind.Settings) and kind.name == name
        assert kind_of(kind.settings()) is kind  # its settings lead back to it
    own = {name: {f.name for f in fields(kind.Settings)} for name, kind in EXTRACTORS.items()}
    assert "backbone" not in own["bottom-up"] and "num_classes" not in own["bottom-up"]
    assert "top_attributes" not in own["c4"] and "objects_vocab" not in own["fpn"]


def test_the_cli_reads_its_lists_from_the_code():
    from pipeline.features.interchange.formats import WRITERS
    from pipeline.features.stores import FORMATS
    from trainer.config import SPLITS

    def choices(command: str, name: str) -> tuple:
        [param] = [p for p in cli.main.commands[command].params if p.name == name]
        return tuple(param.type.choices)

    assert choices("extract-regions", "arch") == tuple(kinds_of("extract-regions"))
    for command, name in [("extract-grid", "fmt"), ("extract-regions", "fmt"),
                          ("import-features", "store_format"), ("inspect", "fmt")]:
        assert choices(command, name) == tuple(FORMATS)
    assert choices("export-features", "layout") == tuple(WRITERS) == ("butd-tsv", "rtl-npz")
    assert choices("evaluate", "split") == tuple(SPLITS)


def test_the_command_line_defaults_are_the_settings_defaults(capstack, inputs):
    """Only the options given reach a kind's settings: the dataclass defaults are the defaults,
    typed nowhere in the CLI, and --help shows them."""
    from pipeline.features.extract.region_extraction import DEFAULT_ARCH

    for command, kinds in [("extract-grid", ["grid"]),
                           ("extract-regions", kinds_of("extract-regions"))]:
        params = {p.name: p for p in cli.main.commands[command].params}
        context = click.Context(cli.main.commands[command], info_name=command)
        for name in kinds:
            defaults = EXTRACTORS.get(name).settings()
            for field in fields(defaults):
                if field.name == "arch":  # the kind's own name: --arch
                    continue
                param = params[field.name]
                assert isinstance(param, cli.SettingOption) and param.default is None
                value = getattr(defaults, field.name)
                help_line = param.get_help_record(context)[1]
                if value is None:  # nothing to show (the help says what None means)
                    assert "[default: " not in help_line
                elif len({str(v) for v in setting_defaults(command, field.name).values()}) == 1:
                    assert f"[default: {value}]" in help_line, (command, field.name, help_line)
    assert (f"[default: {DEFAULT_ARCH}]"
            in " ".join(capstack("extract-regions", "--help").output.split()))
    assert region_settings() == region_settings(DEFAULT_ARCH)


def test_an_unknown_arch_is_refused_with_the_registrys_list(capstack, inputs):
    result = capstack("extract-regions", inputs["dataset"], inputs["root"], "--arch", "c6",
                      expect_ok=False)
    listed = ", ".join(repr(name) for name in kinds_of("extract-regions"))
    assert result.exit_code == 2 and listed in result.output
    with pytest.raises(CapstackError, match="arch: unknown 'c6' \\(choose bottom-up, c4, c5, "
                                            "fpn\\)"):
        region_settings("c6")
    with pytest.raises(CapstackError, match="arch: unknown 'grid'"):
        region_settings("grid")  # a kind, but not one extract-regions runs


def test_an_option_of_another_kind_is_refused(capstack, inputs):
    result = capstack("extract-regions", inputs["dataset"], inputs["root"], "--arch",
                      "bottom-up", "--weights", inputs["extract_regions"], "--num-classes", 5,
                      expect_ok=False)
    assert result.exit_code == 1
    assert "extract-regions bottom-up: no setting 'num_classes'" in result.output
    with pytest.raises(CapstackError, match="no setting 'top_attributes'"):
        region_settings("c5", top_attributes=2)


def test_no_lower_floor_imports_extraction():
    """vision/ is below extraction, the detectors and the demo (it imports only core/ and
    its own modules); extract/ may import the detectors, never the reverse."""
    def imports(folder: Path) -> set[str]:
        found = set()
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    found.add(node.module)
                elif isinstance(node, ast.Import):
                    found.update(alias.name for alias in node.names)
        return found

    pipeline = ROOT / "pipeline"
    for folder in [pipeline / "features" / "detectors", pipeline / "demo", pipeline / "vision"]:
        assert not {m for m in imports(folder) if m.startswith("pipeline.features.extract")}, folder
    assert {m for m in imports(pipeline / "vision") if m.startswith("pipeline.")} <= \
        {m for m in imports(pipeline / "vision")
         if m.startswith(("pipeline.core", "pipeline.vision"))}


# --------------------------------------------------------------------------- store names

@pytest.mark.parametrize("stage", ["extract_grid", "extract_regions"])
def test_the_demo_commands_fingerprint_the_settings_they_always_did(stage, inputs, plan_only,
                                                                    capstack, tmp_path):
    name, expected = DEMO_FINGERPRINTS[stage]
    assert fingerprint(expected) == name  # the README's store names
    argv = retargeted(demo_argv(stage), inputs["dataset"], inputs["root"], inputs[stage],
                      tmp_path)
    capstack(*argv)
    [meta] = plan_only
    settings = json.loads(json.dumps(meta["producer"]["settings"]))  # as the store holds them
    here = {**expected, "images": inputs["images"], "weights_md5": md5(inputs[stage])}
    assert settings == here and meta["fingerprint"] == fingerprint(here)
    assert list(settings) == list(expected)  # the order the metadata is written in, too


@pytest.mark.parametrize("arch", ["fpn", "c4", "c5"])
def test_the_torchvision_kinds_fingerprint_the_settings_they_always_did(arch, inputs, plan_only,
                                                                        capstack, tmp_path):
    name, expected = TORCHVISION_DEFAULTS[arch]
    assert fingerprint(expected) == name
    capstack("extract-regions", inputs["dataset"], inputs["root"], "--arch", arch, "--weights",
             "random", "--features-root", tmp_path, "--workers", 0)
    [meta] = plan_only
    here = {**expected, "images": inputs["images"]}
    assert meta["producer"]["settings"] == here and meta["fingerprint"] == fingerprint(here)
    assert list(meta["producer"]["settings"]) == list(expected)


DEMO_DATA = ROOT / "data" / "shapes" / "dataset_shapes.json"


@pytest.mark.skipif(not DEMO_DATA.is_file(), reason="the demo's data is not built here")
@pytest.mark.parametrize("stage", ["extract_grid", "extract_regions"])
def test_the_demo_stores_keep_their_names(stage, plan_only, capstack, tmp_path, monkeypatch):
    """Where the demo has run: its own commands on its own files name the README's stores."""
    name, expected = DEMO_FINGERPRINTS[stage]
    monkeypatch.chdir(ROOT)
    argv = demo_argv(stage)
    weights = Path(argv[argv.index("--weights") + 1])
    if not weights.is_file() or md5(weights) != expected["weights_md5"]:
        pytest.skip(f"{weights}: not the weights the README's demo ran with")
    capstack(*retargeted(argv, Path(argv[1]), Path(argv[2]), None, tmp_path))
    [meta] = plan_only
    settings = json.loads(json.dumps(meta["producer"]["settings"]))
    if settings["images"] != expected["images"]:
        pytest.skip("the demo's images here are not the README's")
    assert settings == expected and meta["fingerprint"] == name


# --------------------------------------------------------------------------- rebuild

# What older extractions recorded: no grid layer (layer4 was the only one), no weights_kind or
# num_classes for a torchvision detector, no top_attributes for bottom-up (1).
ADDED_SINCE = {"grid": ["layer"], "c5": ["weights_kind", "num_classes"],
               "bottom-up": ["top_attributes"]}


@pytest.mark.parametrize("kind", ["grid", "c5", "bottom-up"])
def test_older_stores_rebuild_from_their_recorded_settings(kind, inputs, capstack, tmp_path):
    from pipeline.features.extract.rebuild import image_extractor

    argv = {"grid": ["extract-grid", "--backbone", "resnet10", "--weights",
                     inputs["extract_grid"], "--image-size", 64, "--grid", 2],
            "c5": ["extract-regions", "--arch", "c5", "--backbone", "resnet10", "--weights",
                   inputs["extract_grid"], "--weights-kind", "backbone", "--min-boxes", 2,
                   "--max-boxes", 3, "--min-size", 64, "--max-size", 64],
            "bottom-up": ["extract-regions", "--arch", "bottom-up", "--weights",
                          inputs["extract_regions"], "--min-boxes", 2, "--max-boxes", 3,
                          "--min-size", 64, "--max-size", 64]}[kind]
    pointer = tmp_path / "store.json"
    capstack(argv[0], inputs["dataset"], inputs["root"], *argv[1:], "--features-root",
             tmp_path / "features", "--workers", 0, "--pointer", pointer,
             "--device", "cpu")  # rebuilt on the CPU below: no GPU float16 autocast between
    store = open_store(pointer)  # a pointer opens the store it names
    meta = json.loads(json.dumps(store.meta))
    for key in ADDED_SINCE[kind]:
        del meta["producer"]["settings"][key]
    assert maker_of(meta["producer"]) is EXTRACTORS.get(kind)
    image_id = int(store.ids()[0])
    image = inputs["root"] / load_karpathy(inputs["dataset"]).images[image_id].relpath
    again = image_extractor(meta, str(pointer), torch.device("cpu"))([image])[0]
    stored = store.get(image_id)
    assert again.num == stored.num and set(again.fields) == set(stored.fields)
    np.testing.assert_allclose(again.features.astype(np.float32),
                               stored.features.astype(np.float32), rtol=1e-2, atol=1e-2)
    if kind != "grid":
        np.testing.assert_allclose(again["boxes"], stored["boxes"], atol=1e-3)


def test_first_format_stores_fill_their_kinds_settings():
    """tests/data/stores_v1: the flat settings the first stores recorded, as each kind's
    dataclass (what they lack at its default); the given-box regions are refused by name."""
    from pipeline.features.extract.kinds.grid import GridSettings
    from pipeline.features.extract.rebuild import image_extractor
    from pipeline.features.extract.kinds.regions import TorchvisionRegionSettings

    v1 = ROOT / "tests" / "data" / "stores_v1"
    grid = open_store(v1 / "grid.lmdb").meta["producer"]
    assert maker_of(grid) is EXTRACTORS.get("grid")
    assert EXTRACTORS.get("grid").recorded(grid["settings"], "random") == GridSettings(
        backbone="resnet10", weights="random", image_size=64, grid=2, layer="layer4",
        dtype="float16")
    image_extractor({"producer": grid}, "grid.lmdb", torch.device("cpu"))  # rebuilds
    regions = open_store(v1 / "regions.lmdb").meta["producer"]
    assert maker_of(regions) is EXTRACTORS.get("c4")
    assert EXTRACTORS.get("c4").recorded(regions["settings"], "random") == \
        TorchvisionRegionSettings(arch="c4", backbone="resnet10", weights="random",
                                  weights_kind="backbone", boxes="given", min_size=64,
                                  max_size=64, num_classes=2, dtype="float16")
    with pytest.raises(CapstackError, match="regions.lmdb: its regions are the dataset's own"):
        image_extractor({"producer": regions}, "regions.lmdb", torch.device("cpu"))
