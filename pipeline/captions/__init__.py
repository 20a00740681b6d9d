"""Caption data: Karpathy-format datasets, the vocabulary, and the prepared captions
(what `capstack prepare` writes and the trainer reads)."""
