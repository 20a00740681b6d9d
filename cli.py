"""capstack's command line: parse, call one function, print.

Heavy libraries (torch, h5py) are imported inside the commands that need
them, so ``capstack stages`` and a skipped ``capstack run`` start fast.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import signal
from collections.abc import Sequence
from pathlib import Path

import click

from pipeline.core.errors import DISK_REFUSALS, CapstackError
from trainer.runs import Stopped

# Bounds on the sizes a user gives, checked by click before any work starts (its message names
# the bound): past them a command would exhaust memory (a 20000-pixel side grew a worker to
# 23 GB; --max-len 1e8 asked for 112 GiB) or build something that cannot train (--grid 0).
MAX_SIDE = 2048  # pixels of a resized image's side
MAX_CAPTION_WORDS = 1000
MAX_BATCH = 4096
MAX_WORKERS = 64
MAX_BOXES = 1000
MAX_IMAGES = 10_000_000
MAX_SEED = 2**32 - 1  # what every seeding (numpy's legacy seed included) accepts


class FiniteRange(click.FloatRange):
    """click.FloatRange that refuses nan and inf too (FloatRange lets nan through any range)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{number} is not a finite number in the range {self._describe_range()}.",
                      param, ctx)
        return number


class NamesOf(click.Choice):
    """click.Choice of the names the code keeps in one place (``"module:NAME"``: a list, a
    dict, a registry, or a function returning one), read when first needed, so that no name
    is typed again here and a command that does not use it imports nothing for it."""

    def __init__(self, source: str):
        self.source = source
        self._names: tuple[str, ...] | None = None
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        if self._names is None:
            module, _, name = self.source.partition(":")
            names = getattr(importlib.import_module(module), name)
            self._names = tuple(names() if callable(names) else names)
        return self._names

    @choices.setter
    def choices(self, value) -> None:  # click.Choice.__init__ sets them; the source decides
        pass


class OutputFile(click.Path):
    """click.Path of a file the command writes: an existing one must be a regular file (or a
    symbolic link), refused before any work starts; the rename that puts the output in place
    would replace a device node or a FIFO with a file (pipeline/core/atomic.py checks it again
    there)."""

    def __init__(self):
        super().__init__(dir_okay=False, path_type=Path)

    def convert(self, value, param, ctx):
        from pipeline.core.atomic import check_file_replaceable

        path = super().convert(value, param, ctx)
        try:
            check_file_replaceable(path)
        except CapstackError as error:
            self.fail(str(error), param, ctx)
        return path


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


def given_options(options: dict) -> dict:
    """The options among ``options`` that the command line (or the environment) gave; the
    others are left to the defaults of the dataclass they fill."""
    ctx = click.get_current_context()
    return {name: value for name, value in options.items()
            if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT}


class Terminated(Stopped):
    """SIGTERM arrived: raised where the command was, so that its ``with`` blocks (locks,
    atomic files) unwind as for any error, and said (a training records itself stopped)."""


class TerminatedExit(click.ClickException):
    exit_code = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM


def stop_on_sigterm(signum, frame):
    raise Terminated("stopped by SIGTERM")


# What a command stopped by SIGTERM leaves, said after "stopped by SIGTERM" (a command not named
# here promises nothing).
WHAT_A_STOP_KEEPS = {
    "train": "its checkpoints are kept; the same command resumes from the last",
    "extract-grid": "whole batches are kept in the store; the same command resumes",
    "extract-regions": "whole batches are kept in the store; the same command resumes",
    "evaluate": "its evaluation folder is as it was before (an evaluation's files change "
                "together); the same command evaluates again from the start",
}


class CapstackGroup(click.Group):
    """Turns a :class:`CapstackError`, SIGTERM and an OS error about a path (read-only, disk
    full, denied) into one line on stderr and a non-zero exit."""

    def parse_args(self, ctx, args):
        ctx.meta["capstack.argv"] = list(args)  # what --nproc hands to each torchrun process
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        signal.signal(signal.SIGTERM, stop_on_sigterm)
        try:
            return super().invoke(ctx)
        except Terminated as e:
            kept = WHAT_A_STOP_KEEPS.get(ctx.invoked_subcommand or "")
            raise TerminatedExit(f"{e}: {kept}" if kept else str(e)) from None
        except CapstackError as e:
            raise click.ClickException(str(e)) from None
        except OSError as e:  # what no writer named itself: the disk or a path refused
            if e.filename is None and e.errno not in DISK_REFUSALS:
                raise
            where = f"{e.filename}: " if e.filename is not None else ""
            raise click.ClickException(f"{where}{e.strerror or e}") from None


def package_version() -> str:
    """capstack's version from its installed metadata; the source's when run uninstalled."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("capstack")
    except PackageNotFoundError:
        from pipeline import __version__

        return __version__


def print_version(ctx, param, value):
    if value and not ctx.resilient_parsing:
        click.echo(f"capstack {package_version()}")
        ctx.exit()


@click.group(cls=CapstackGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=print_version, help="Print capstack's version and exit.")
def main():
    """capstack: an offline feature-caching pipeline and a lightweight captioning trainer."""


def stage_command(name: str, code: str):
    """Register a command that stages may run; ``code`` is the module implementing it."""

    def register(func):
        command = main.command(name)(func)
        command.code_module = code
        return command

    return register


def nproc_option(func):
    """``--nproc N``: run the command as N processes under torchrun (a stage's ``nproc``)."""
    return click.option(
        "--nproc", type=click.IntRange(1, 1024), default=1, show_default=True,
        envvar="CAPSTACK_NPROC",
        help="Processes on this machine: launches torchrun --standalone --nproc-per-node N "
             "(one per GPU). Across machines, start torchrun yourself (docs/scale-out.md).")(func)


def hand_over_to_torchrun(nproc: int) -> None:
    """With ``--nproc N > 1`` outside torchrun: run this same command as N processes under
    torchrun and exit with its status. Returns when this process is to do the work itself."""
    from pipeline.engine.torchrun import launch, under_torchrun, without_option

    if nproc <= 1 or under_torchrun():
        return
    argv = click.get_current_context().meta["capstack.argv"]
    raise SystemExit(launch(nproc, without_option(argv, "--nproc")))


def stage_commands() -> dict[str, str]:
    """Sub-command -> implementing module, for every command a stage may run."""
    return {name: cmd.code_module for name, cmd in main.commands.items()
            if hasattr(cmd, "code_module")}


# -- data ------------------------------------------------------------------------------
def force_output_option(func):
    """``--force``: replace an output folder that capstack did not write (refused without it)."""
    return click.option("--force", is_flag=True,
                        help="Replace OUT_DIR even if capstack did not write it (its content "
                             "is deleted).")(func)


@stage_command("shapes", code="pipeline.demo.shapes")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--train", "n_train", default=3000, show_default=True, help="Training images.",
              type=click.IntRange(0, MAX_IMAGES))
@click.option("--val", "n_val", default=250, show_default=True, help="Validation images.",
              type=click.IntRange(0, MAX_IMAGES))
@click.option("--test", "n_test", default=250, show_default=True, help="Test images.",
              type=click.IntRange(0, MAX_IMAGES))
@click.option("--seed", default=0, show_default=True, help="Random seed; same seed, same files.",
              type=click.IntRange(0, MAX_SEED))
@click.option("--size", default=128, show_default=True, help="Image side in pixels.",
              type=click.IntRange(16, 1024))
@click.option("--captions", "caption_style", type=click.Choice(["grammar", "free"]),
              default="grammar", show_default=True,
              help="Caption style: grammar (a few fixed patterns) or free (freer word order, "
                   "more synonyms, as people write). Images, ids, splits and boxes are the same "
                   "for both; only the sentences differ.")
@force_output_option
def shapes(out_dir, n_train, n_val, n_test, seed, size, caption_style, force):
    """Draw the shapes dataset: OUT_DIR/images/ and OUT_DIR/dataset_shapes.json (Karpathy
    format)."""
    from pipeline.demo.shapes import write_shapes_dataset

    summary = write_shapes_dataset(out_dir, n_train=n_train, n_val=n_val, n_test=n_test,
                                   seed=seed, size=size, progress=True, force=force,
                                   captions=caption_style)
    splits = ", ".join(f"{k} {v}" for k, v in summary["splits"].items())
    style = "" if caption_style == "grammar" else f" ({caption_style} style)"
    click.echo(f"shapes: {summary['images']} images ({splits}), {summary['captions']} captions"
               f"{style}, {summary['words']} distinct words -> {summary['json']}")


@stage_command("prepare", code="pipeline.captions.prepare")
@click.argument("dataset_json", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--min-count", default=5, show_default=True, type=click.IntRange(1, 10**9),
              help="Words seen fewer times in the train split become <unk> (rule rtl: words "
                   "seen this many times or fewer, in any split).")
@click.option("--max-len", default=16, show_default=True, help="Captions are truncated to this.",
              type=click.IntRange(1, MAX_CAPTION_WORDS))
@click.option("--vocab-rule", type=NamesOf("pipeline.captions.vocab_rules:VOCAB_RULES"),
              default="capstack", show_default=True,
              help="Which words the vocabulary keeps: capstack's rule, or rtl, "
                   "self-critical.pytorch's prepro_labels.py (pipeline/captions/vocab_rules/).")
@click.option("--restval", type=NamesOf("pipeline.captions.prepare:RESTVAL"), default="train",
              show_default=True, help="COCO's restval images: train images, or dropped (the "
                                      "82,783 train images Show, Attend and Tell trains on).")
@click.option("--lemmatize", is_flag=True,
              help="Lemmatise every caption word (dogs -> dog, are -> be) with simplemma, "
                   "English, before the vocabulary is chosen, as HACap does; the references "
                   "(refs_*.json: every score and reward) are lemmatised too. Needs the "
                   "simplemma package (pipeline/captions/lemmatize.py).")
@force_output_option
def prepare(dataset_json, out_dir, min_count, max_len, vocab_rule, restval, lemmatize, force):
    """Karpathy-format json -> vocabulary, captions HDF5, COCO-format references per split."""
    from pipeline.captions.lemmatizers import DEFAULT_LEMMATIZER
    from pipeline.captions.prepare import prepare_captions

    s = prepare_captions(dataset_json, out_dir, min_count=min_count, max_len=max_len,
                         vocab_rule=vocab_rule, restval=restval,
                         lemmatizer=DEFAULT_LEMMATIZER if lemmatize else None, progress=True,
                         force=force)
    rule = "" if vocab_rule == "capstack" else f", rule {vocab_rule}"
    if "lemmatizer" in s:
        rule += f", lemmatised by {s['lemmatizer']['name']} {s['lemmatizer']['version']}"
    click.echo(f"prepare: {out_dir}: vocabulary {s['vocab_size']} words (min count {min_count}"
               f"{rule}), "
               f"{s['unk_tokens']} train tokens -> <unk>, {s['truncated']} captions truncated "
               f"to {max_len}")
    for split, n in s["images"].items():
        click.echo(f"  {split:5s} {n:7d} images {s['captions'][split]:8d} captions")


# -- features --------------------------------------------------------------------------
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


@main.command("import-checkpoint")
@click.argument("kind", metavar="KIND", type=NamesOf("trainer.imports:CHECKPOINT_FORMATS"))
@click.argument("sources", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The run folder to write (its best.pt).")
@click.option("--captions", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The prepared captions it is used with (`capstack prepare`): the same words.")
@click.option("--features", multiple=True, required=True, type=click.Path(path_type=Path),
              help="The feature store(s) it reads (repeatable), of the checkpoint's size.")
@click.option("--max-regions", default=0, show_default=True, type=click.IntRange(0, MAX_BOXES),
              help="Regions read per image; 0: all.")
def import_checkpoint_cmd(kind, sources, out, captions, features, max_regions):
    """Another toolkit's checkpoint as a capstack run folder (rtl: self-critical.pytorch's
    MODEL.pth INFOS.pkl, its updown/topdown and transformer models), for evaluate, caption and
    train.init_from. docs/training.md: "Checkpoints of self-critical.pytorch"."""
    from trainer.imports import import_checkpoint

    done = import_checkpoint(kind, list(sources), out, captions, list(features), max_regions)
    click.echo(f"{done.decoder} decoder, {done.parameters:,} parameters -> {done.checkpoint}")
    for note in done.notes:
        click.echo(f"  note: {note}")


@main.command("export-features")
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


@main.command("formats")
def formats_cmd():
    """The outside feature layouts import-features reads: name, then whose layout it is."""
    from pipeline.features.interchange.formats import FORMATS

    _echo_summaries(FORMATS)


@stage_command("train-backbone", code="pipeline.demo.backbone")
@click.argument("dataset_json", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("image_root", type=click.Path(file_okay=False, path_type=Path))
@click.argument("out", type=OutputFile())
@click.option("--backbone", default="resnet10", show_default=True)
@click.option("--crop-size", default=64, show_default=True, type=click.IntRange(16, MAX_SIDE),
              help="Object crops are resized to this.")
@click.option("--epochs", default=4, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--batch", "batch_size", default=64, show_default=True,
              type=click.IntRange(1, MAX_BATCH))
@click.option("--lr", default=1e-3, show_default=True, type=FiniteRange(0, min_open=True))
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, MAX_SEED))
def train_backbone_cmd(dataset_json, image_root, out, backbone, crop_size, epochs, batch_size,
                       lr, seed):
    """Train a small ResNet to name each boxed object's shape and colour (the demo's 'ImageNet')."""
    from pipeline.demo.backbone import BackboneTraining, train_backbone

    cfg = BackboneTraining(backbone, crop_size, epochs, batch_size, lr, seed)
    r = train_backbone(dataset_json, image_root, out, cfg)
    val = (f"; held-out objects: shape accuracy {r['shape_accuracy']:.3f}, colour accuracy "
           f"{r['color_accuracy']:.3f}" if "shape_accuracy" in r else "")
    click.echo(f"train-backbone: {r['objects']} objects, final train loss {r['train_loss']:.4f}"
               f"{val} -> {out}")


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


# -- trainer ---------------------------------------------------------------------------
def _echo_summaries(registry) -> None:
    rows = registry.summaries()
    width = max(len(name) for name, _ in rows)
    for name, summary in rows:
        click.echo(f"{name:<{width}}  {summary}")


@main.command("decoders")
def decoders_cmd():
    """The registered decoders: name, then what it is."""
    from trainer.decoders import DECODERS

    _echo_summaries(DECODERS)


@main.command("objectives")
def objectives_cmd():
    """The registered training objectives: name, then what it is."""
    from trainer.objectives import OBJECTIVES

    _echo_summaries(OBJECTIVES)


@main.command("rewards")
def rewards_cmd():
    """The registered RL rewards (an objective's ``reward:``): name, then what it is."""
    from trainer.rewards import REWARDS

    _echo_summaries(REWARDS)


@stage_command("train", code="trainer.train")
@click.argument("experiment", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The run folder: checkpoints, metrics log; an existing run resumes.")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
              help="Override a value of the experiment file, e.g. train.epochs=3.")
@click.option("--restart-on-change", is_flag=True,
              help="When OUT holds a run of other data or decoder config, move it to OUT.old "
                   "(OUT.old.2, ... when taken: nothing is deleted) and start afresh (instead of "
                   "refusing).")
@click.option("--tensorboard", is_flag=True,
              help="Also write TensorBoard events to OUT/events (train.tensorboard=true; needs "
                   "pip install 'capstack[tensorboard]').")
@nproc_option
def train_cmd(experiment, out_dir, overrides, restart_on_change, tensorboard, nproc):
    """Train (or resume) a decoder on cached features, as the EXPERIMENT yaml says; one line
    per epoch: mean training loss, validation CIDEr (greedy, x100 as the report prints it),
    the best so far, time.

    Under torchrun (or with --nproc N) every process trains its part of each batch (DDP)."""
    hand_over_to_torchrun(nproc)
    import logging

    from pipeline.core.ranks import environment_ranks
    from trainer.config import load_experiment
    from trainer.scoring.text import java_missing
    from trainer.train import train

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    config = load_experiment(experiment, list(overrides) +
                             (["train.tensorboard=true"] if tensorboard else []))
    main_process = environment_ranks().main
    if java_missing() and main_process:
        click.echo("note: METEOR will be n/a at evaluation (java not found)")
    r = train(config, out_dir, restart_on_change=restart_on_change, on_epoch=_echo_epoch)
    if not main_process:
        return
    resumed = f", resumed at epoch {r.resumed_at[0] + 1}" if r.resumed_at else ""
    if r.resumed_at and r.resumed_at[0] >= config.train.epochs:
        resumed = " (already complete: nothing trained; --set train.epochs=N trains on)"
    if r.stopped_early:
        resumed += (f", stopped early ({config.train.early_stop_patience} epochs without a "
                    f"better one)")
    kept = r.best_cider if r.best_score is None else r.best_score
    at = f" (greedy) at epoch {r.best_epoch + 1}" if math.isfinite(kept) else ""
    click.echo(f"train {config.name}: {r.epochs} epochs, {r.steps} steps{resumed}; best val "
               f"{_kept(r.select_on, r.best_score, r.best_cider)}{at} -> {out_dir}/best.pt")


def _percent(score: float) -> str:
    """A score as every printed table shows it, x100 as the papers print them (0.512 -> 51.2):
    the report's scale, for the lines of train, runs and evaluate too."""
    return f"{100 * score:.1f}"


def _kept(select_on: str, best_score: float, best_cider: float) -> str:
    """``CIDEr 51.2``, or ``BLEU-4 30.1 (CIDEr 51.2)`` when kept on another score; n/a when no
    validation scored a finite number (every epoch NaN: best.pt holds the last)."""
    if not math.isfinite(best_cider if best_score is None else best_score):
        return f"{_label(select_on)} n/a (no validation scored a finite number; best.pt holds " \
               f"the last epoch)"
    if select_on == "cider":
        return f"CIDEr {_percent(best_cider)}"
    return f"{_label(select_on)} {_percent(best_score)} (CIDEr {_percent(best_cider)})"


def _label(select_on: str) -> str:
    """The name of the value ``train.select_on`` names (``bleu4`` -> ``BLEU-4``)."""
    from trainer.scoring.metrics import selectable

    return selectable()[select_on].label


def _echo_epoch(e) -> None:
    """``epoch 3/8  loss 2.314  val CIDEr 51.2  best 51.2 (epoch 3)  41.2 s``; kept on
    BLEU-4: ``... val CIDEr 51.2  BLEU-4 30.1  best BLEU-4 30.5 (epoch 2)  41.2 s``"""
    loss = f"{e.loss:.3f}" if e.loss is not None else "n/a"
    best_at = f"epoch {e.best_epoch}" if e.best_epoch > 0 else "start"
    label = _label(e.select_on)
    best = f"best {_percent(e.best_cider)}" if e.select_on == "cider" else \
        f"{label} {_percent(e.val_score)}  best {label} {_percent(e.best_score)}"
    best = f"{best} ({best_at})"
    if not math.isfinite(e.best_cider if e.select_on == "cider" else e.best_score):
        best = "best n/a (no validation scored a finite number yet)" if e.select_on == "cider" \
            else f"{label} {_percent(e.val_score)}  best n/a (none finite yet)"
    click.echo(f"epoch {e.epoch}/{e.epochs}  loss {loss}  val CIDEr {_percent(e.val_cider)}  "
               f"{best}  {e.seconds:.1f} s")


@main.command("runs")
@click.argument("workdir", default=".", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def runs_cmd(workdir, as_json):
    """The runs under WORKDIR/runs/ (default: here), by name: decoder, objective, epochs done
    of those planned, state (running, finished, failed, stopped), best validation CIDEr and
    test CIDEr once evaluated (evals/NAME/, or the run's eval/ where older capstacks wrote),
    x100 as the report prints them (--json: as stored, 0 to 1 and beyond). A run is one row
    whatever its names; a name linking out of WORKDIR/runs/ (an experiment's view of its
    baseline's runs) is shown as the link it is."""
    from dataclasses import asdict

    from trainer.runs import list_runs

    rows = list_runs(workdir)
    if as_json:
        click.echo(json.dumps([asdict(r) for r in rows], indent=2))
        return
    if not rows:
        click.echo(f"no runs under {workdir / 'runs'}")
        return

    def best(r):
        if r.best_cider is None:
            return "-"
        at = "epoch ?" if r.best_epoch is None else f"epoch {r.best_epoch}" if r.best_epoch \
            else "start"
        return f"{_percent(r.best_cider)} ({at})"

    def known(value):
        return "?" if value is None else str(value)

    table = [("name", "decoder", "objective", "epochs", "state", "best val CIDEr", "test CIDEr")]
    table += [(r.name if r.link is None else f"{r.name} -> {r.link}", known(r.decoder),
               known(r.objective),
               f"{known(r.epochs_done)}/{known(r.epochs)}", known(r.state), best(r),
               "-" if r.test_cider is None else _percent(r.test_cider)) for r in rows]
    widths = [max(len(row[k]) for row in table) for k in range(len(table[0]))]
    click.echo("  ".join(cell.ljust(w) for cell, w in zip(table[0], widths)).rstrip())
    for r, row in zip(rows, table[1:]):
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        for note in ([f"{r.state}: {r.error}"] if r.error else []) + r.notes:
            click.echo(f"    {note}")
        if r.link is not None:
            click.echo("    not this folder's own run: a link to another's (as an experiment "
                       "links its baseline's)")
        for name in r.links:
            click.echo(f"    also named {name} (a link to this run)")


# option -> (field of trainer/decoding/options.py's DecodingConfig, click parameter); each one's
# default is None: the experiment's eval: value; the choices are the config's own
DECODING_OPTIONS = {
    "--search": ("search", dict(type=NamesOf("trainer.decoding.options:SEARCHES"),
                                help="beam (greedy for --beam 1), greedy, or diverse beam search "
                                     "[the experiment's eval.search]")),
    "--sample-method": ("sample_method", dict(
        type=NamesOf("trainer.decoding.options:SAMPLE_METHODS"),
        help="How one-word-at-a-time decoding picks a word: the most probable, or a draw "
             "[eval.sample_method]")),
    "--temperature": ("temperature", dict(type=float, help="Sampling temperature; in beam "
                                          "search it tempers the scores [eval.temperature]")),
    "--top-k": ("top_k", dict(type=int, help="Draw among the K most probable words, 0 all "
                              "[eval.top_k]")),
    "--top-p": ("top_p", dict(type=float, help="Draw from the nucleus of probability P, 1 all "
                              "[eval.top_p]")),
    "--length-penalty": ("length_penalty", dict(help="none, wu_ALPHA or avg_ALPHA: how beam "
                                                     "search ranks lengths [eval.length_penalty]")),
    "--group-size": ("group_size", dict(type=int, help="Diverse beam search's groups "
                                        "[eval.group_size]")),
    "--diversity-lambda": ("diversity_lambda", dict(type=float, help="Diverse beam search's "
                                                    "penalty per earlier group's same word "
                                                    "[eval.diversity_lambda]")),
    "--block-trigrams/--allow-trigrams": ("block_trigrams", dict(
        default=None, help="No trigram twice in a caption [eval.block_trigrams]")),
    "--remove-bad-endings/--keep-bad-endings": ("remove_bad_endings", dict(
        default=None, help="No caption ends with a, the, of, ... [eval.remove_bad_endings]")),
    "--bad-endings": ("bad_endings", dict(help="The words no caption may end with, comma "
                                               "separated (with --remove-bad-endings) "
                                               "[eval.bad_endings]")),
    "--no-repeats/--allow-repeats": ("no_repeats", dict(
        default=None, help="No word twice in a row [eval.no_repeats]")),
    "--n": ("n", dict(type=int, aliases=("--n-best",),
                      help="Captions per image: the beam's n best or n samples; with n > 1 "
                           "metrics.json's diversity.n_best says how varied they are [eval.n]")),
}


def decoding_options(command):
    """The decoding options (:data:`DECODING_OPTIONS`) on a command, handed to it as one
    ``decoding`` mapping of the fields given ({} when none is)."""
    fields = [field for field, _ in DECODING_OPTIONS.values()]

    @functools.wraps(command)
    def run(**kwargs):
        given = {f: kwargs.pop(f) for f in fields}
        if given["bad_endings"] is not None:
            given["bad_endings"] = [w.strip() for w in given["bad_endings"].split(",")
                                    if w.strip()]
        return command(decoding={f: v for f, v in given.items() if v is not None}, **kwargs)

    for flag, (field, settings) in reversed(DECODING_OPTIONS.items()):
        settings = dict(settings)
        aliases = settings.pop("aliases", ())  # other names of the option (--n-best for --n)
        run = click.option(flag, *aliases, field, **{"default": None, **settings})(run)
    return run


@stage_command("evaluate", code="trainer.evaluation.evaluate")
@click.argument("targets", nargs=-1, required=True, type=click.Path(path_type=Path),
                metavar="TARGET...")
@click.option("--refs", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Score TARGET as a results file (COCO's format, self-critical.pytorch's "
                   "eval output, capstack's own) against these references: with --out, an "
                   "evaluation that report and report --compare read as a run's.")
@click.option("--name", default=None,
              help="With --refs: the approach the report names it [TARGET's file name "
                   "without .json].")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where results, metrics.json and figures go [evals/NAME beside the runs/ "
                   "folder holding RUN, as the stages write it: runs/top_down -> "
                   "evals/top_down].")
@click.option("--split", type=NamesOf("trainer.config:SPLITS"), default=None,
              help="[the experiment's eval.split]")
@click.option("--beam", "beam_size", type=click.IntRange(1, 100), default=None,
              help="Beam size [the experiment's eval.beam_size].")
@click.option("--max-len", type=click.IntRange(1, MAX_CAPTION_WORDS), default=None,
              help="[the experiment's eval.max_len]")
@click.option("--figures", type=click.IntRange(0, 1000), default=None,
              help="Attention figures of the first N images [the experiment's eval.figures].")
@click.option("--max-refs", type=click.IntRange(0, 100), default=None,
              help="Score against each image's first N references, 0 all "
                   "[the experiment's eval.max_refs].")
@click.option("--device", default="auto", show_default=True)
@click.option("--ensemble", is_flag=True,
              help="Decode with the runs TARGET... as one: each word's probability the mean of "
                   "theirs (one vocabulary, the same features) [evals/ensemble-A+B-DIGEST "
                   "beside the first run's].")
@decoding_options
def evaluate_cmd(targets, refs, name, out_dir, split, beam_size, max_len, figures, max_refs,
                 device, ensemble, decoding):
    """Beam-search a checkpoint (or run folder) on a split and score it, as the experiment's
    eval: section says unless options override it; several with --ensemble, as one model; or
    score RESULTS --refs REFS. The decoding options (--search, --sample-method, ..., --n) are
    docs/training.md's "Decoding options"."""
    from trainer.evaluation.evaluate import evaluate_checkpoint, evaluate_results
    from trainer.runs import evaluation_folder

    target = several_need_ensemble(targets, ensemble, "TARGET")
    if name is not None and refs is None:
        raise click.UsageError("--name: only with --refs (a run's evaluation is named by its "
                               "experiment)")
    if refs is not None:
        if ensemble:
            raise click.UsageError("--ensemble: only for runs; with --refs TARGET is a results "
                                   "file, already decoded")
        given = [flag for flag, value in (("--split", split), ("--beam", beam_size),
                                          ("--max-len", max_len), ("--figures", figures))
                 if value is not None]
        given += [flag.split("/")[0] for flag, (field, _) in DECODING_OPTIONS.items()
                  if field in decoding]
        if given:
            raise click.UsageError(f"{', '.join(given)}: only for a checkpoint; with --refs "
                                   f"TARGET is a results file, already decoded")
        scores = evaluate_results(target, refs, out_dir, name=name, max_refs=max_refs or 0)
    else:
        out_dir = out_dir or (ensemble_folder(targets, evaluation_folder) if ensemble
                              else evaluation_folder(target))
        scores = evaluate_checkpoint(list(targets) if ensemble else target, out_dir,
                                     split=split, beam_size=beam_size, max_len=max_len,
                                     figures=figures, max_refs=max_refs, device=device,
                                     decoding=decoding)
    _echo_scores(scores)
    if out_dir:
        click.echo(f"-> {out_dir}/metrics.json")


def several_need_ensemble(given: Sequence[Path], ensemble: bool, name: str) -> Path:
    """The one run given (the first with ``--ensemble``); several without it are refused."""
    if len(given) > 1 and not ensemble:
        raise click.UsageError(f"{name}: {len(given)} runs given ({', '.join(map(str, given))}): "
                               f"add --ensemble to decode them as one, or give one run")
    return given[0]


def ensemble_folder(targets: Sequence[Path], evaluation_folder) -> Path:
    """An ensemble's evaluation folder: ``ensemble-A+B-<digest of the members>`` beside the
    first run's (A, B the runs' evaluation folder names), so it never takes the place of a
    run's own evaluation, nor of another ensemble's."""
    from trainer.evaluation.ensembles import default_folder

    return default_folder(targets, evaluation_folder)


def _echo_scores(scores: dict) -> None:
    for name, value in scores["metrics"].items():
        shown = f"{_percent(value):>6}" if value is not None else \
            f"   n/a ({scores['unavailable'].get(name, 'unavailable')})"
        click.echo(f"  {name:<8}{shown}")
    refs = f", first {scores['max_refs']} references" if scores.get("max_refs") else ""
    click.echo(f"  ({scores['images']} images, {scores['tokenizer']} tokenizer{refs})")


@main.command("caption")
@click.option("--checkpoint", "checkpoints", required=True, multiple=True,
              type=click.Path(path_type=Path),
              help="A checkpoint (or run folder: its best.pt); several with --ensemble.")
@click.argument("images", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--attention", type=OutputFile(), default=None,
              help="Draw the attention per word to this PNG. For several images the name holds "
                   "{stem} (each image's file name) or {n} (its place, from 1): "
                   "--attention 'att/{stem}.png'.")
@click.option("--beam", "beam_size", type=click.IntRange(1, 100), default=None,
              help="Beam size [the experiment's eval.beam_size].")
@click.option("--max-len", default=16, show_default=True,
              type=click.IntRange(1, MAX_CAPTION_WORDS))
@click.option("--device", default="auto", show_default=True)
@click.option("--ensemble", is_flag=True,
              help="Decode with every --checkpoint as one: each word's probability the mean of "
                   "theirs (one vocabulary, the same features; no attention).")
@decoding_options
def caption_cmd(checkpoints, images, attention, beam_size, max_len, device, ensemble, decoding):
    """Caption raw IMAGES, running the extractor that made the checkpoint's feature stores.
    The decoding options other than --max-len default to the experiment's eval: values (--beam
    too, as evaluate's); with --n N each image's N captions are printed with their rank."""
    from pipeline.core.ranks import pick_device
    from pipeline.features.extract.rebuild import image_extractor
    from trainer.evaluation.caption import caption_files

    checkpoint = several_need_ensemble(checkpoints, ensemble, "--checkpoint")
    if ensemble and attention is not None:
        raise click.UsageError("--attention: an ensemble draws no attention (no member's "
                               "attention is the ensemble's); caption without --attention, or "
                               "draw one run's")
    dev = pick_device(device)
    captions = caption_files(list(checkpoints) if ensemble else checkpoint, list(images),
                             lambda meta, where: image_extractor(meta, where, dev),
                             beam_size=beam_size, max_len=max_len, attention=attention,
                             device=dev, decoding=decoding)
    ranked = any(c.rank > 1 for c in captions)
    for c in captions:
        notes = ([f"{c.regions} regions"] if c.regions is not None else []) + \
            ([f"attention -> {c.attention}"] if c.attention else
             ["no attention to draw: the decoder attends over no single grid or set of regions"]
             if attention else [])
        drawn = f"  [{'; '.join(notes)}]" if notes else ""
        rank = f" [{c.rank}]" if ranked else ""
        click.echo(f"{c.path}{rank}: {' '.join(c.words)}{drawn}")


@stage_command("cider-cache", code="trainer.rewards.cider_cache")
@click.argument("prepared", type=click.Path(file_okay=False, path_type=Path))
@click.option("--split", default="train", show_default=True)
@click.option("--out", required=True, type=OutputFile())
def cider_cache_cmd(prepared, split, out):
    """Document frequencies and reference n-grams of a split, once, for CIDEr-D rewards."""
    from trainer.rewards.cider_cache import build_cache

    scorer = build_cache(prepared, split, out)
    click.echo(f"cider-cache: {len(scorer.image_ids)} images, {len(scorer.ref_lengths)} "
               f"references, {len(scorer.ngrams)} n-grams -> {out}")


@stage_command("report", code="trainer.evaluation.report")
@click.argument("metrics", nargs=-1, type=click.Path(path_type=Path))
@click.option("--out", "out_dir", default="reports", show_default=True,
              type=click.Path(file_okay=False, path_type=Path))
@click.option("--compare", nargs=2, type=click.Path(path_type=Path), default=None,
              metavar="A B", help="Two evaluation folders of the same images: A - B per value, "
                                  "its interval and how often A is ahead, by the paired "
                                  "bootstrap over the images (OUT/compare.md, compare.json). "
                                  "Each side may be several, by a pattern "
                                  "('exps/seed*/evals/top_down') or commas: every seed's "
                                  "images, seed paired with seed.")
@click.option("--resamples", default=1000, show_default=True, type=click.IntRange(1, 100_000),
              help="--compare: bootstrap resamples.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, 2**32 - 1),
              help="--compare: the resamples' seed (the same seed, the same result).")
@click.option("--versus-xe", is_flag=True,
              help="A column for every row not trained by cross-entropy: its CIDEr minus that "
                   "of the XE row of the same approach, features and seeds, with the 95% "
                   "interval of the paired bootstrap over the images.")
@click.option("--baseline", default=None, type=click.Path(path_type=Path), metavar="EVAL",
              help="A column of every row's CIDEr minus that of the row holding evaluation "
                   "EVAL, with the 95% interval of the paired bootstrap over the images; "
                   "a row over seeds against a row over the same seeds only, else n/a "
                   "and why below the table.")
@click.option("--gallery", default=None, type=click.Path(path_type=Path), metavar="EVAL",
              help="The evaluation whose captions OUT/index.html lists, image by image [the "
                   "first reported].")
@click.option("--figure", "figure", default=None, type=click.IntRange(1, 100), metavar="K",
              help="--compare: OUT/figure.png and figure.pdf, K images with A's and B's "
                   "captions under each, the first K as OUT/index.html ranks them (A's largest "
                   "CIDEr wins first).")
@click.option("--images", default=None, metavar="ID,...",
              help="--compare: the figure of these images (ids, by commas) instead.")
def report_cmd(metrics, out_dir, compare, resamples, seed, versus_xe, baseline, gallery, figure,
               images):
    """One table of every evaluated experiment (metrics.json files or their folders, or
    patterns of them: 'exps/seed*/evals/top_down'), in %; rows of one recipe differing only
    in their seed are one, over the seeds; with --compare A B, whether A's difference from B
    is real on these images. OUT/index.html shows it in a browser: the table, the training
    curves and one evaluation's captions; with --compare, the images where A's and B's
    captions differ, ranked (with both, the comparison's page is OUT/compare.html)."""
    if not metrics and not compare:
        raise click.UsageError("name the evaluations to report (METRICS...), or --compare A B")
    chosen = _image_ids(images)
    if (figure or chosen) and not compare:
        raise click.UsageError("--figure, --images: a figure of two systems' captions; add "
                               "--compare A B")
    if figure and chosen and figure != len(chosen):
        raise click.UsageError(f"--figure {figure} --images {images}: {len(chosen)} images "
                               f"named; name {figure}, or leave --figure out")
    if gallery and not metrics:
        raise click.UsageError("--gallery: the report's page (METRICS...); --compare's page "
                               "lists both systems' captions")
    if metrics:
        from trainer.evaluation.report import expand_evaluations, write_report

        files = expand_evaluations(metrics)
        csv_path, md_path = write_report(files, out_dir, versus_xe,
                                         str(baseline) if baseline else None, page="index.html",
                                         gallery=gallery)
        click.echo(md_path.read_text().rstrip())
        click.echo(f"-> {csv_path}, {md_path}, {out_dir / 'index.html'}")
    if compare:
        from trainer.evaluation.compare import write_comparison
        from trainer.evaluation.report import expand_evaluations

        a, b = (expand_evaluations(str(side).split(",")) for side in compare)
        written = write_comparison(a, b, out_dir, resamples=resamples, seed=seed,
                                   page="compare.html" if metrics else "index.html",
                                   figure=figure or 0, images=chosen)
        click.echo(written.text.rstrip())
        click.echo(f"-> {', '.join(map(str, [written.json, written.markdown, written.page]))}")
        if written.figure:
            click.echo(f"-> {', '.join(map(str, written.figure))}")


def _image_ids(given: str | None) -> list[int]:
    """``--images 12,15``: the ids, in order."""
    if given is None:
        return []
    try:
        ids = [int(part) for part in given.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"{given!r}: image ids by commas (12,15)",
                                 param_hint="--images") from None
    if not ids:
        raise click.BadParameter("no image id", param_hint="--images")
    return ids


@main.command("inspect")
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


@main.command("verify")
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


@main.command("stores")
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


# -- the stage engine -------------------------------------------------------------------
def _stages_options(func):
    func = click.option("-c", "--config", "stages_path", default="stages.yaml", show_default=True,
                        type=click.Path(dir_okay=False, path_type=Path),
                        help="Stages file.")(func)
    func = click.option("--workdir", default=".", show_default=True,
                        type=click.Path(file_okay=False, path_type=Path),
                        help="Folder the stages' paths are relative to; holds the lock file.")(func)
    return func


def _pipeline(stages_path: Path, workdir: Path, outs_outside_workdir: bool = False):
    from pipeline.engine.stagefile import load_stages_file
    from pipeline.engine.stages import Pipeline

    if not workdir.is_dir():
        raise CapstackError(f"{workdir}: --workdir is not a folder")
    commands = stage_commands()
    parallel = [name for name in commands
                if any(p.name == "nproc" for p in main.commands[name].params)]
    return Pipeline(load_stages_file(stages_path, commands, parallel), workdir, commands,
                    outs_outside_workdir)


def outs_outside_option(func):
    return click.option("--outs-outside-workdir", is_flag=True,
                        help="Let stages write outs outside the workdir (../x, /abs/path); "
                             "refused otherwise.")(func)


def _name_option(func):
    return click.option("--name", "experiment", default=None, metavar="NAME",
                        help="The named experiment (exps/NAME/): its own stages, the "
                             "baseline's shared.")(func)


def _in_experiment(pipeline, name: str | None):
    """``pipeline`` as experiment ``name`` has it (``pipeline`` itself for no name)."""
    if not name:
        return pipeline
    from pipeline.engine.experiments import pipeline_of, read_experiment

    return pipeline_of(pipeline, read_experiment(pipeline.workdir, name))


@main.command("stages")
@_stages_options
@_name_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def stages_cmd(stages_path, workdir, experiment, as_json):
    """One line per stage: up to date, stale (and why), or never run; with --name, as the
    experiment has them (its own stages, and the baseline's it shares, said so). When the file
    names its demo, the stages `capstack demo` runs are marked demo, and a last line counts
    their states apart from the others'."""
    pipeline = _in_experiment(_pipeline(stages_path, workdir), experiment)
    statuses, off = pipeline.statuses(), pipeline.file.off
    own = getattr(pipeline, "own", None)
    demo = set(pipeline.demo_stages()) if pipeline.file.demo else None
    if as_json:
        listing = {n: {"state": s.state, "reasons": list(s.reasons),
                       **({} if own is None else {"own": n in own}),
                       **({} if demo is None else {"demo": n in demo})}
                   for n, s in statuses.items()}
        listing |= {n: {"state": "off", "reasons": [why]} for n, why in off.items()}
        click.echo(json.dumps(listing, indent=2))
        return
    width = max(len(n) for n in [*statuses, *off])
    mark = (lambda name: "") if demo is None else \
        (lambda name: "demo  " if name in demo else "      ")
    for name, status in statuses.items():
        shared = "  (baseline's)" if own is not None and name not in own else ""
        click.echo(f"{name:<{width}}  {mark(name)}{status.describe()}{shared}")
    for name, why in off.items():
        click.echo(f"{name:<{width}}  {mark(name)}off ({why})")
    if demo is not None and len(demo) < len(statuses):
        click.echo(_demo_summary(pipeline.file.demo, statuses, demo))


def _demo_summary(targets, statuses: dict, demo: set[str]) -> str:
    """``demo (capstack demo: report and what it needs): 16 stages, 16 up to date; the other
    39: 39 never run``: whether the demo is done, apart from the stages it does not run."""
    def counted(names) -> str:
        counts: dict[str, int] = {}
        for name in names:
            counts[statuses[name].state] = counts.get(statuses[name].state, 0) + 1
        return ", ".join(f"{n} {state}" for state, n in counts.items())

    others = [n for n in statuses if n not in demo]
    stages = f"{len(demo)} stage{'' if len(demo) == 1 else 's'}"
    return (f"demo (`capstack demo`: {', '.join(targets)} and what it needs): {stages}, "
            f"{counted(n for n in statuses if n in demo)}; the other {len(others)}: "
            f"{counted(others)}")


class LaunchersOption(click.Option):
    """``--launcher``: its help lists the registered launchers, each with its summary (read
    from the registry when help is shown)."""

    def get_help_record(self, ctx):
        from pipeline.engine.launchers import LAUNCHERS

        self.help = (self.help or "").split(" Launchers: ")[0] + " Launchers: " + "; ".join(
            f"{name}: {summary.rstrip('.')}" for name, summary in LAUNCHERS.summaries()) + "."
        return super().get_help_record(ctx)


@main.command("run")
@click.argument("stage")
@_stages_options
@click.option("--force", is_flag=True, help="Run even when up to date.")
@click.option("--with-deps", is_flag=True,
              help="First run the upstream stages that are not up to date.")
@click.option("--set", "assignments", multiple=True, metavar="NAME=VALUE",
              help="Run under an experiment with this param of the stage set (repeatable): "
                   "its outs, and those of what depends on it, in exps/NAME/, the baseline's "
                   "untouched. Named by the settings unless --name names it. Several values "
                   "(lr=1e-4,5e-4; a string's as a YAML list: 'config=[a.yaml, b.yaml]') make "
                   "a grid of experiments.")
@click.option("--name", "experiment", default=None, metavar="NAME",
              help="Run under experiment NAME (made with the --set settings when new; the "
                   "same name again must have the same).")
@click.option("--seeds", default=None, metavar="0,1,2",
              help="Run once per seed (the stage's param 'seed'; 0-4 is 0,1,2,3,4): a seed "
                   "other than the stage's own runs as experiment seedS (NAME-seedS).")
@click.option("--jobs", type=click.IntRange(1, 1024), default=None,
              help="Run the experiments N at a time, each its own processes, the CPU cores "
                   "divided between them (--launcher jobs unless another is named).")
@click.option("--devices", default=None, metavar="0,1,2,3",
              help="GPUs for --jobs (and --launcher local): one to each process, round robin "
                   "(CUDA_VISIBLE_DEVICES).")
@click.option("--launcher", "launcher_name", default=None, cls=LaunchersOption,
              type=NamesOf("pipeline.engine.launchers:LAUNCHERS"),
              help="Where the experiments run [serial; jobs with --jobs or --devices].")
@click.option("--slurm-partition", default=None, help="--launcher slurm: the partition.")
@click.option("--gpus-per-job", type=click.IntRange(1, 64), default=None,
              help="--launcher slurm: GPUs of each job.")
@click.option("--time", "time_limit", default=None, metavar="MINUTES|H:MM:SS",
              help="--launcher slurm (or local): each job's time limit; a job that reaches it "
                   "stops where it can resume and is requeued.")
@click.option("--slurm", "slurm_params", multiple=True, metavar="NAME=VALUE",
              help="--launcher slurm: another of submitit's SlurmExecutor parameters "
                   "(cpus_per_task=8, mem=32G, account=lab; repeatable).")
@outs_outside_option
def run_cmd(stage, stages_path, workdir, force, with_deps, assignments, experiment, seeds,
            jobs, devices, launcher_name, slurm_partition, gpus_per_job, time_limit,
            slurm_params, outs_outside_workdir):
    """Run one STAGE, unless it is up to date; with --set, --name or --seeds, as named
    experiments beside the baseline (`capstack exp list`); with --jobs or --launcher, side by
    side (docs/scale-out.md)."""
    from pipeline.engine.experiments import parse_seeds
    from pipeline.engine.launchers import choose, options_from
    from pipeline.engine.sweeps import plan

    options = options_from(jobs, devices, slurm_partition, gpus_per_job, time_limit,
                           slurm_params)
    launcher = choose(launcher_name, options)
    pipeline = _pipeline(stages_path, workdir, outs_outside_workdir)
    sweep = plan(pipeline, stage, assignments, experiment, parse_seeds(seeds) if seeds else (),
                 force=force, with_deps=with_deps)
    outcome = launcher.launch(sweep, options, click.echo)
    if outcome.failed:
        raise CapstackError(f"{len(outcome.failed)} of {len(sweep.runs)} runs failed: "
                            + "; ".join(outcome.failures()))


@main.group("exp")
def exp_group():
    """Named experiments (`capstack run STAGE --set K=V --name NAME`): list, show, diff,
    remove."""


def _experiments(stages_path: Path, workdir: Path, names=()):
    """The baseline and the experiments NAMES (default: every usable one, the others said)."""
    from pipeline.engine.experiments import pipeline_of, pipelines_listed, read_experiment

    baseline = _pipeline(stages_path, workdir)
    if not names:
        return baseline, pipelines_listed(baseline)
    return baseline, [pipeline_of(baseline, read_experiment(baseline.workdir, n)) for n in names]


def _echo_table(rows) -> None:
    from pipeline.core.texttable import text_table

    for line in text_table(rows):
        click.echo(line)


@exp_group.command("list")
@_stages_options
def exp_list_cmd(stages_path, workdir):
    """Each experiment: its settings against the baseline's, the state of its own stages, and
    the job a launcher submitted for it (its id and state)."""
    from pipeline.engine.experiment_views import jobs_text, listing

    baseline, pipelines = _experiments(stages_path, workdir)
    if not pipelines:
        click.echo(f"no experiments in {baseline.workdir} (make one: capstack run STAGE "
                   f"--set NAME=VALUE --name NAME)")
    else:
        _echo_table(listing(baseline, pipelines))
    jobs = jobs_text(baseline.workdir)
    if jobs:
        click.echo(f"the baseline's jobs: {jobs}")


@exp_group.command("show")
@click.argument("names", nargs=-1)
@_stages_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def exp_show_cmd(names, stages_path, workdir, as_json):
    """The experiments' evaluations (all, or NAMES) beside the baseline's: the settings that
    differ, each stage's state, the metrics (%)."""
    from pipeline.engine.experiment_views import show

    baseline, pipelines = _experiments(stages_path, workdir, names)
    rows = show(baseline, pipelines)
    if as_json:
        click.echo(json.dumps([dict(zip(rows[0], row)) for row in rows[1:]], indent=2))
    elif len(rows) == 1:
        click.echo("no evaluation of an experiment's own yet (capstack run evaluate@... "
                   "--name NAME --with-deps)")
    else:
        _echo_table(rows)


@exp_group.command("diff")
@click.argument("a")
@click.argument("b", required=False)
@_stages_options
def exp_diff_cmd(a, b, stages_path, workdir):
    """The params experiment A sets otherwise than B (default: the baseline), then the metrics
    (%) of the evaluations both have that differ."""
    from pipeline.engine.experiment_views import diff

    baseline, pipelines = _experiments(stages_path, workdir, [a] + ([b] if b else []))
    _echo_table(diff(baseline, pipelines[0], pipelines[1] if b else None))


@exp_group.command("remove")
@click.argument("names", nargs=-1, required=True)
@_stages_options
def exp_remove_cmd(names, stages_path, workdir):
    """Remove experiments: their folders (own outs, lock, links), never the baseline's files."""
    from pipeline.engine.experiments import remove_experiments

    for folder in remove_experiments(workdir, names):
        click.echo(f"removed {folder}")


@main.command("demo")
@_stages_options
@outs_outside_option
def demo_cmd(stages_path, workdir, outs_outside_workdir):
    """The stages file's demo (its `demo:` stages and all they need; else every stage), in
    order, each skipped when up to date."""
    pipeline = _pipeline(stages_path, workdir, outs_outside_workdir)
    targets, total = pipeline.file.demo, len(pipeline.demo_stages())
    if not targets:
        ran = pipeline.run_all(report=click.echo)
    else:
        ran = []
        for target in targets:
            ran += pipeline.run(target, with_deps=True, report=click.echo)
    click.echo(f"demo: {len(ran)} stage(s) ran, {total - len(ran)} up to date.")


if __name__ == "__main__":
    main()
