"""A checkpoint's decoder, vocabulary and experiment, built from the checkpoint alone."""

from __future__ import annotations

from pipeline.captions.vocab import Vocabulary
from trainer.config import ExperimentConfig, experiment_from_dict
from trainer.decoders.base import Decoder


def load_model(ckpt: dict) -> tuple[Decoder, Vocabulary, ExperimentConfig]:
    """The checkpoint's decoder (eval mode, CPU), vocabulary and experiment, from it alone."""
    vocab = Vocabulary.from_json(ckpt["vocab"], ckpt["path"])
    config = experiment_from_dict(ckpt["experiment"], ckpt["path"])
    model = config.build_decoder(len(vocab), ckpt["feature_dim"])
    model.load_state_dict(ckpt["model"])
    return model.eval(), vocab, config
