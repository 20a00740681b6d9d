"""The demo's commands: shapes (draw the dataset), train-backbone (its small ResNet)."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.commandline import (MAX_BATCH, MAX_IMAGES, MAX_SEED, MAX_SIDE, FiniteRange,
                                  OutputFile, force_output_option, stage_command)


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
