"""Evaluation: captions of a split (predict), validation CIDEr, the papers' metrics,
the comparison table, figures, and captioning raw images."""
