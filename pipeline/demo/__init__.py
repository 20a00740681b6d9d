"""The demo's own data and models: the procedurally drawn shapes dataset and the small
backbone trained on it (the demo's stand-in for ImageNet weights)."""
