"""Training objectives: what a step minimises (cross-entropy, SCST, coarse-to-fine)."""
