"""The feature commands: extract-grid, extract-regions, import-features, export-features,
formats, inspect, verify, stores, train-detector."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pipeline.commandline import (MAX_BATCH, MAX_BOXES, MAX_SEED, MAX_SIDE, MAX_WORKERS,
                                  FiniteRange, NamesOf, OutputFile, echo_summaries,
                                  given_options, hand_over_to_torchrun, nproc_option,
                                  stage_command)
from pipeline.core.errors import CapstackError


STORE_FORMATS = NamesOf("pipeline.features.stores:FORMATS")
FEATURE_DTYPES = NamesOf("pipeline.features.stores.schema:FEATURE_DTYPES")


class SettingOption(click.Option):
    """An option filling a field of an extractor kind's settings dataclass (extract-grid,
    extract-regions). Given, it is the kind's setting; not given, the dataclass default holds
    (:func:`given_options` leaves it out). Its default is never typed here: --help reads it
    from the settings of the kinds the command runs (imported only when help is shown)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, default=None, **kwargs)

    def get_help_record(self, ctx):
        from pipeline.features.extract.kinds import setting_defaults

        by_value: dict[str, list[str]] = {}
        for kind, default in setting_defaults(ctx.command.name, self.name).items():
            if default is not None:
                by_value.setdefault(str(default), []).append(kind)
        shown = next(iter(by_value)) if len(by_value) == 1 else "; ".join(
            f"{', '.join(kinds)}: {value}" for value, kinds in by_value.items())
        said = (self.help or "").split("[default: ")[0].rstrip()
        self.help = "  ".join(part for part in (said, shown and f"[default: {shown}]") if part)
        return super().get_help_record(ctx)


class KindsOption(click.Option):
    """``--arch``: its help lists the registered kinds, each with its description, and the
    default kind (read when help is shown, from the registry; not given, the default holds)."""

    def get_help_record(self, ctx):
        from pipeline.features.extract.kinds import EXTRACTORS
        from pipeline.features.extract.region_extraction import DEFAULT_ARCH

        self.help = self.help.split(" Kinds: ")[0] + " Kinds: " + "; ".join(
            f"{name}: {' '.join((EXTRACTORS.get(name).__doc__ or '').split())}"
            for name in self.type.choices) + f".  [default: {DEFAULT_ARCH}]"
        return super().get_help_record(ctx)


def _store_options(func):
    for option in reversed([
        click.option("--out", type=click.Path(path_type=Path), default=None,
                     help="Store path (.lmdb or .h5). Default: named by fingerprint under the "
                          "shared root, and reused when it exists."),
        click.option("--features-root", type=click.Path(file_okay=False, path_type=Path),
                     default=None, help="Shared root [$CAPSTACK_FEATURES or "
                                        "~/.cache/capstack/features]."),
        click.option("--format", "fmt", type=STORE_FORMATS, default=None,
                     help="Store backend when the path's suffix does not say [lmdb]."),
        click.option("--pointer", type=OutputFile(), default=None,
                     help="Also write a small json naming the store (a stage's out)."),
        click.option("--dtype", type=FEATURE_DTYPES, cls=SettingOption,
                     help="Feature dtype in the store [float16; float32 for --weights random, "
                          "whose activations pass float16's range]."),
        click.option("--batch", "batch_size", default=16, show_default=True,
                     type=click.IntRange(1, MAX_BATCH)),
        click.option("--workers", default=2, show_default=True, help="Image decoding processes.",
                     type=click.IntRange(0, MAX_WORKERS)),
        click.option("--device", default=None, help="cuda, cpu, cuda:1 ... [cuda if available; "
                                                    "under torchrun cuda:LOCAL_RANK]"),
        click.option("--images-outside-root", is_flag=True,
                     help="Read images the dataset names outside IMAGE_ROOT (absolute paths, "
                          "../); refused otherwise."),
    ]):
        func = option(func)
    return nproc_option(func)


def _report_job(result) -> None:
    from pipeline.core.ranks import environment_ranks

    if not environment_ranks().main:
        return
    if result.shards:
        click.echo(f"merged {result.shards} shards")
    if result.reused:
        click.echo(f"reusing store {result.store} (fingerprint {result.fingerprint}): "
                   f"nothing to extract")
    else:
        click.echo(f"extracted {result.extracted} images ({result.images_per_s:.1f} images/s), "
                   f"skipped {result.skipped} -> {result.store}")


@stage_command("extract-grid", code="pipeline.features.extract.kinds.grid")
@click.argument("dataset_json", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("image_root", type=click.Path(file_okay=False, path_type=Path))
@click.option("--backbone", cls=SettingOption,
              help="resnet18/34/50/101/152 or vgg19 (torchvision), or resnet10 (small, for "
                   "demos).")
@click.option("--weights", cls=SettingOption,
              help="torchvision state_dict file, or 'random' [torchvision's cache location].")
@click.option("--image-size", cls=SettingOption, type=click.IntRange(32, MAX_SIDE))
@click.option("--grid", cls=SettingOption, help="Cells per side after pooling.",
              type=click.IntRange(1, 64))
@click.option("--layer", cls=SettingOption, type=NamesOf("pipeline.vision.backbones:GRID_LAYERS"),
              help="The stage whose map is pooled: a ResNet's layer4 (stride 32; Stack-Cap's "
                   "14x14x2048 at 448) or layer3 (stride 16; 14x14x1024 at 224, HACap's input), "
                   "or vgg19's conv5_4 (stride 16; Show-Attend-Tell's 14x14x512 at 224).")
@click.option("--decode", cls=SettingOption, type=NamesOf("pipeline.vision.jpeg:DECODES"),
              help="cpu: PIL decodes and resizes in the --workers; device: the workers only read "
                   "JPEGs, decoded, resized and normalised on --device a batch at once (others "
                   "and refused ones: PIL). device gives another store (fingerprint).")
@_store_options
def extract_grid_cmd(dataset_json, image_root, out, features_root, fmt, pointer, batch_size,
                     workers, device, images_outside_root, nproc, **options):
    """Grid features (a stage's map: layer4, layer3, conv5_4; pooled to GRID x GRID), stored."""
    hand_over_to_torchrun(nproc)
    from pipeline.features.extract.kinds.grid import GRID, extract_grid

    settings = GRID.settings(**given_options(options))  # backbone, weights, ..., layer, dtype
    _report_job(extract_grid(dataset_json, image_root, settings, out=out, root=features_root,
                             format=fmt, pointer=pointer, batch_size=batch_size,
                             workers=workers, device=device,
                             images_outside_root=images_outside_root))


@stage_command("extract-regions", code="pipeline.features.extract.region_extraction")
@click.argument("dataset_json", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("image_root", type=click.Path(file_okay=False, path_type=Path))
@click.option("--arch", type=NamesOf("pipeline.features.extract.region_extraction:archs"),
              cls=KindsOption,
              help="The region extractor kind (each has its own settings below).")
@click.option("--backbone", cls=SettingOption,
              help="fpn/c4/c5 only (bottom-up: the checkpoint's).")
@click.option("--weights", cls=SettingOption,
              help="bottom-up: its checkpoint (.pth, .pkl, .bin). Others: a detector (or, for "
                   "c4/c5, ResNet) state_dict, or 'random' [torchvision's cache].")
@click.option("--weights-kind", cls=SettingOption, help="fpn/c4/c5 only.",
              type=NamesOf("pipeline.features.extract.kinds.regions:WEIGHT_KINDS"))
@click.option("--boxes", cls=SettingOption,
              type=NamesOf("pipeline.features.extract.kinds.region_base:BOXES"),
              help="given: pool the boxes of the dataset json's 'boxes'.")
@click.option("--min-boxes", cls=SettingOption, type=click.IntRange(1, MAX_BOXES))
@click.option("--max-boxes", cls=SettingOption, type=click.IntRange(1, MAX_BOXES))
@click.option("--conf-thresh", cls=SettingOption, type=FiniteRange(0, 1))
@click.option("--nms-thresh", cls=SettingOption, type=FiniteRange(0, 1))
@click.option("--min-size", cls=SettingOption, type=click.IntRange(32, MAX_SIDE),
              help="Images resized to this shorter side.")
@click.option("--max-size", cls=SettingOption, type=click.IntRange(32, MAX_SIDE))
@click.option("--num-classes", cls=SettingOption, type=click.IntRange(2, 100_000),
              help="fpn/c4/c5: classes incl. background (COCO 91); bottom-up reads them from "
                   "its checkpoint.")
@click.option("--top-attributes", cls=SettingOption, type=click.IntRange(0, 1000),
              help="bottom-up: attributes kept per region (ids and probabilities, best first).")
@click.option("--reference", cls=SettingOption,
              type=NamesOf("pipeline.features.detectors.rules:RULES"),
              help="bottom-up: whose test-time rules it follows: caffe (generate_tsv.py, the "
                   "BUTD release's features) or mmf (MMF's / LXMERT's frcnn extractor: "
                   "regressed boxes, one class-agnostic NMS; --conf-thresh unused).")
@click.option("--objects-vocab", cls=SettingOption, type=click.Path(dir_okay=False),
              help="bottom-up: objects_vocab.txt, so the store names each class.")
@click.option("--attributes-vocab", cls=SettingOption, type=click.Path(dir_okay=False),
              help="bottom-up: attributes_vocab.txt, so the store names each attribute.")
@_store_options
def extract_regions_cmd(dataset_json, image_root, arch, out, features_root, fmt, pointer,
                        batch_size, workers, device, images_outside_root, nproc, **options):
    """Bottom-up region features (the VG detector, or torchvision's Faster R-CNN) into a store."""
    hand_over_to_torchrun(nproc)
    from pipeline.features.extract.region_extraction import extract_regions, region_settings

    # the kind's own settings: those given; an option of another kind is refused
    settings = region_settings(arch, **given_options(options))
    _report_job(extract_regions(dataset_json, image_root, settings, out=out, root=features_root,
                                format=fmt, pointer=pointer, batch_size=batch_size,
                                workers=workers, device=device,
                                images_outside_root=images_outside_root))


@stage_command("import-features", code="pipeline.features.interchange.importer")
@click.argument("source_format", metavar="FORMAT")
@click.argument("sources", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--dataset", "dataset_json", required=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="The Karpathy-format json whose images the records are matched to.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Store path (.lmdb or .h5). Default: named by fingerprint under the shared "
                   "root, and reused when it exists.")
@click.option("--features-root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Shared root [$CAPSTACK_FEATURES or ~/.cache/capstack/features].")
@click.option("--store-format", type=STORE_FORMATS, default=None,
              help="Store backend when --out's suffix does not say [lmdb].")
@click.option("--pointer", type=OutputFile(), default=None,
              help="Also write a small json naming the store (a stage's out).")
@click.option("--dtype", type=click.Choice(["float16", "float32"]), default="float16",
              show_default=True)
@click.option("--match", type=click.Choice(["auto", "stem", "id"]), default="auto",
              show_default=True, help="How a source's names for images meet the dataset's: "
                                      "file stems, image ids, or stem then id then a trailing "
                                      "number.")
@click.option("--image-root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The dataset's images: their sizes, for formats that record none.")
@click.option("--describe", multiple=True, metavar="KEY=VALUE",
              help="Recorded in the store about the producer (e.g. caffemodel=..., "
                   "max_boxes=100); repeatable.")
@click.option("--commit-mb", default=64.0, show_default=True,
              type=FiniteRange(0, 2**20, min_open=True),
              help="Source MB read between commits (what a killed import reads again).")
def import_features_cmd(source_format, sources, dataset_json, out, features_root, store_format,
                        pointer, dtype, match, image_root, describe, commit_mb):
    """Import another toolkit's features (FORMAT: see `capstack formats`) into a store."""
    from pipeline.features.interchange.importer import ImportJob, import_features

    job = ImportJob(source_format, list(sources), dataset_json, dtype=dtype, match=match,
                    image_root=image_root, describe=_key_values(describe, "--describe"), out=out,
                    root=features_root, store_format=store_format,
                    commit_bytes=max(1, int(commit_mb * 2**20)))
    result = import_features(job, pointer=pointer)
    if result.reused:
        click.echo(f"reusing store {result.store} (fingerprint {result.fingerprint}): "
                   f"nothing to import")
        return
    for line in result.report.lines():
        click.echo(line)
    click.echo(f"read {result.nbytes / 2**20:.1f} MB in {result.seconds:.1f} s "
               f"({result.mb_per_s:.1f} MB/s) -> {result.store}")


def _key_values(pairs, option: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CapstackError(f"{option} {pair!r}: expected KEY=VALUE")
        out[key.strip()] = value
    return out


@click.command("export-features")
@click.argument("store", type=click.Path(path_type=Path))
@click.argument("layout", type=NamesOf("pipeline.features.interchange.formats:WRITERS"))
@click.argument("out", type=click.Path(path_type=Path))
def export_features_cmd(store, layout, out):
    """Write STORE (or a pointer .json) in another toolkit's LAYOUT at OUT (a TSV file for
    butd-tsv; OUT_att, OUT_fc, OUT_box folders for rtl-npz)."""
    from pipeline.core.pointer import read_pointer
    from pipeline.features.interchange.exporter import export_features

    path = read_pointer(store)
    made = export_features(path, layout, out)
    click.echo(f"export-features: {path} -> {', '.join(map(str, made))}")


@click.command("formats")
def formats_cmd():
    """The outside feature layouts import-features reads: name, then whose layout it is."""
    from pipeline.features.interchange.formats import FORMATS

    echo_summaries(FORMATS)


@stage_command("train-detector", code="pipeline.features.detectors")
@click.argument("dataset_json", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("image_root", type=click.Path(file_okay=False, path_type=Path))
@click.argument("out", type=OutputFile())
@click.option("--label-key", default="label", show_default=True,
              help="The box entry naming its object class (shapes: label or shape).")
@click.option("--attribute-key", default="color", show_default=True,
              help="The box entry naming its attribute ('' for no attribute head).")
@click.option("--attribute-weight", default=0.2, show_default=True, type=FiniteRange(0),
              help="The attribute loss's weight beside the others' 1 (grid-feats-vqa's 0.2).")
@click.option("--image-size", default=256, show_default=True, type=click.IntRange(32, MAX_SIDE),
              help="Images resized to this shorter side (and longer at most).")
@click.option("--width", default=8, show_default=True, help="The ResNet stem's width (VG: 64).",
              type=click.IntRange(1, 256))
@click.option("--epochs", default=4, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--batch", "batch_size", default=8, show_default=True,
              type=click.IntRange(1, MAX_BATCH))
@click.option("--lr", default=2e-3, show_default=True, type=FiniteRange(0, min_open=True))
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, MAX_SEED))
def train_detector_cmd(dataset_json, image_root, out, label_key, attribute_key, attribute_weight,
                       image_size, width, epochs, batch_size, lr, seed):
    """Train the bottom-up detector (Caffe C4, attribute head) on a dataset's labelled boxes;
    reports COCO mAP on the test split; OUT loads with extract-regions --arch bottom-up."""
    from pipeline.features.detectors.training import DetectorTraining, train_detector

    cfg = DetectorTraining(label_key=label_key, attribute_key=attribute_key or None,
                           attribute_weight=attribute_weight, image_size=image_size,
                           width=width, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed)
    r = train_detector(dataset_json, image_root, out, cfg)
    attributes = (f", attribute accuracy {r['attribute_accuracy']:.3f}"
                  if r.get("attribute_accuracy") is not None else "")
    if r["without_boxes"]:
        click.echo(f"train-detector: {r['without_boxes']} train images have no labelled box "
                   f"(a {label_key!r}): left out of training")
    click.echo(f"train-detector: {r['objects']} classes, {r['attributes']} attributes, "
               f"{r['train_seconds']:.0f} s; test split ({r['images']} images): mAP@[.5:.95] "
               f"{r['map']:.3f}, mAP@.5 {r['map50']:.3f}{attributes} -> {out}")


@click.command("inspect")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=STORE_FORMATS, default=None)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def inspect_cmd(store, fmt, as_json):
    """A store's metadata and one record's shapes (STORE may be a pointer .json)."""
    from pipeline.features.stores import open_store

    reader = open_store(store, fmt)  # a pointer .json is followed there
    sample = reader.get(int(reader.ids()[0])) if len(reader) else None
    shapes = {} if sample is None else {name: list(a.shape) for name, a in sample.fields.items()}
    if as_json:
        click.echo(json.dumps({"path": str(reader.path), "meta": reader.meta,
                               "sample_record": shapes}, indent=2))
        return
    click.echo(f"{reader.path}")
    click.echo(f"  {'record':18s} {reader.schema.describe()}")
    for name, spec in reader.meta["fields"].items():
        click.echo(f"    {name:16s} {spec['shape']} {spec['dtype']}")
    producer = reader.meta["producer"]
    click.echo(f"  {'producer':18s} {producer['name']}")
    for key, value in {**producer["settings"], **producer["about"]}.items():
        click.echo(f"    {key:16s} {value}")
    for key, value in reader.meta.items():
        if key not in ("skipped", "fields", "producer", "grid"):
            click.echo(f"  {key:18s} {value}")
    skipped = reader.meta.get("skipped", {})
    click.echo(f"  {'skipped':18s} {len(skipped)}")
    for image_id, reason in list(skipped.items())[:20]:
        click.echo(f"    image {image_id}: {reason}")
    if sample is not None:
        click.echo(f"  record {int(reader.ids()[0])}: " + ", ".join(
            f"{k} {v}" for k, v in shapes.items()) + f", image {sample.height}x{sample.width}")


@click.command("verify")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--dataset", "dataset_json", default=None,
              type=click.Path(dir_okay=False, path_type=Path),
              help="The Karpathy-format json whose images STORE must hold [the one STORE "
                   "records it was made from].")
@click.option("--deep", is_flag=True,
              help="Also read every record: check its checksum and that no value is NaN or "
                   "infinite.")
def verify_cmd(store, dataset_json, deep):
    """Check that STORE holds a record for every image of the dataset it was made from, or of
    --dataset (and, with --deep, that every record reads and holds finite values)."""
    from pipeline.core.pointer import read_pointer
    from pipeline.features.catalog import check_every_record, verify_store

    path = read_pointer(store)
    result = verify_store(path, dataset_json)
    click.echo(f"{result['store']}: all {result['images']} images of {result['dataset']} present "
               f"({result['skipped']} skipped when the store was made, reported by training)")
    if deep:
        read, checksum = check_every_record(path)
        checked = f"every {checksum} checksum matches" if checksum else \
            "no checksums to check (made before stores kept them)"
        click.echo(f"{result['store']}: all {read} records read, {checked}, every value finite")


@click.command("stores")
@click.option("--features-root", type=click.Path(file_okay=False, path_type=Path), default=None)
def stores_cmd(features_root):
    """The stores under the shared root: what a record holds, size, count, and who uses them."""
    from pipeline.features.catalog import list_stores
    from pipeline.features.placement import features_root as resolve_root

    root = resolve_root(features_root)
    rows = list_stores(root)
    if not rows:
        click.echo(f"no stores under {root}")
        return
    click.echo(f"stores under {root}:")
    for r in rows:
        click.echo(f"  {r['name']}  {r['kind']}  {r['count']} records  {r['size_mb']:.1f} MB")
        if r.get("problem"):
            click.echo(f"      problem: {r['problem']}")
        if r.get("users_problem"):
            click.echo(f"      users unknown: {r['users_problem']}")
        for user in r["users"]:
            click.echo(f"      used by {user}")
