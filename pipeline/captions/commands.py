"""prepare: a Karpathy-format json -> the vocabulary, captions and references."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.commandline import MAX_CAPTION_WORDS, NamesOf, force_output_option, stage_command


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
