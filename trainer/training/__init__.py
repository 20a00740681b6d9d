"""One training run, in parts a reader can hold.

``build.py``: what a run is made of (data, decoder, objective, optimiser, precision, the loss
DDP wraps), from the experiment. ``resume.py``: where a run starts (scratch, another run's
weights, its own last checkpoint) and what a resume must agree with. ``loop.py``: an epoch's
steps. ``run.py``: :class:`~trainer.training.run.Run`, the parts and the counters, what happens
between epochs (validation, the kept epoch: trainer/selection.py, checkpoints, the log).
trainer/train.py drives it: ``capstack train``'s entry, run folders, resume or restart.
"""
