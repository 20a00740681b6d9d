"""The old home of the decoding options, kept for the benchmarks that import it:
trainer/decoding/options.py."""

from trainer.decoding.options import DecodingConfig, decode
from trainer.decoding.rules import BAD_ENDINGS, MAX_WU_ALPHA, filtered

__all__ = ["BAD_ENDINGS", "MAX_WU_ALPHA", "DecodingConfig", "decode", "filtered"]
