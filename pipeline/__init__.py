"""capstack's offline pipeline: datasets, caption preparation, feature stores and the stage
engine."""

__version__ = "0.1.0"
