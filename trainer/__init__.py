"""capstack's trainer: decoders trained on cached features only."""
