"""One training run: plain state and steps, as nanoGPT's ``train.py``.

``start.py``: ``capstack train``'s entry (run folders, resume or restart, how it ended).
``build.py``: what a run is made of (:class:`~trainer.training.build.Parts`: data, decoder,
objective, optimiser, precision, the loss DDP wraps, the log), built once. ``position.py``:
where it stands (:class:`~trainer.training.position.Position`: epoch, batch, step, the kept
epoch), which ``resume.py`` returns (scratch, another run's weights, its own last.pt) and the
loop advances. ``loop.py``: the epochs and the step, top to bottom. ``log.py``: metrics.jsonl
and TensorBoard. ``selection.py``: the kept epoch, lr decay, early stop. ``compiled.py`` and
``fits.py``: ``train.compile`` and whether the decoder fits the device.

Imports run one way: start -> loop, resume -> build, position, log (no import circle).
"""
