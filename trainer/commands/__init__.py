"""The trainer's commands: training.py (train, runs, import-checkpoint, cider-cache, the
registries' lists), evaluation.py (evaluate, caption, report)."""
