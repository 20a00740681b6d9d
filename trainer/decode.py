"""The old home of the searches, kept for the benchmarks that import it: trainer/decoding/."""

from trainer.decoding.beam import beam_search
from trainer.decoding.words import Decoded, SamplingNoise, greedy, picked_logprobs, sample, tempered

__all__ = ["Decoded", "SamplingNoise", "beam_search", "greedy", "picked_logprobs", "sample",
           "tempered"]
