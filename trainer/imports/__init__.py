"""Checkpoints of other toolkits as capstack run folders: ``capstack import-checkpoint KIND``.

Each module registers a format with ``@CHECKPOINT_FORMATS.register(name)``: a class that
names the files it reads (``sources``) and turns them into a :class:`Converted` (a decoder's
name and config, the features it reads, its weights for a capstack vocabulary). What every
format shares is here: :func:`import_checkpoint` checks the converted decoder against the
captions and features it is to be used with (a prepared folder and stores), and writes
``RUN/best.pt`` as training writes it (identity, experiment, vocabulary, stores, weights),
so ``capstack evaluate RUN``, ``capstack caption --checkpoint RUN`` and ``train.init_from:
RUN`` take it as any run; and ``RUN/imported.json``, where it came from.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, ClassVar

import torch

from pipeline.captions.prepared import load_captions
from pipeline.captions.vocab import Vocabulary
from pipeline.core.errors import CapstackError
from pipeline.core.hashing import md5_of_file
from pipeline.core.jsonfile import write_json
from pipeline.core.regular import require_regular
from pipeline.core.registry import Registry, import_modules
from pipeline.core.state_dicts import require_fit
from trainer.checkpoint import identity, payload, save_checkpoint
from trainer.components import file_form
from trainer.config import experiment_from_dict
from trainer.data import Features
from trainer.training.position import Position
from trainer.training.selection import Kept

CHECKPOINT_FORMATS = Registry("checkpoint format")


@dataclass
class Converted:
    """A checkpoint read: what capstack's decoder is, and its weights for a vocabulary."""

    decoder: str  # a registered decoder's name
    config: object  # its config dataclass
    feature_dim: int  # the features it reads (each region's)
    weights: Callable[[Vocabulary], dict[str, torch.Tensor]]  # its state_dict, rows in vocab's
    max_len: int  # the longest caption it decodes (train.max_len, eval.max_len)
    table: dict  # how tables name its training: {"training": ..., "family": ...}
    about: dict  # where it came from, for imported.json
    notes: list[str] = field(default_factory=list)  # what differs, said when it is imported


class CheckpointFormat:
    """Subclasses name their source files and read them."""

    sources: ClassVar[tuple[str, ...]]  # what each source file is, in order (MODEL.pth, ...)

    def read(self, paths: list[Path]) -> Converted:
        raise NotImplementedError


@dataclass
class Imported:
    checkpoint: Path
    decoder: str
    parameters: int
    notes: list[str]


def import_checkpoint(kind: str, sources: list[Path], out: Path, captions: Path,
                      features: list[Path], max_regions: int = 0) -> Imported:
    """Format ``kind``'s ``sources`` as the run folder ``out``, on the prepared ``captions``
    and the stores ``features`` (what ``capstack evaluate`` will read)."""
    reader = CHECKPOINT_FORMATS.get(kind)()
    if len(sources) != len(reader.sources):
        raise CapstackError(f"import-checkpoint {kind}: expected {' '.join(reader.sources)}, "
                            f"got {len(sources)} file(s)")
    for path, name in zip(sources, reader.sources):
        try:  # a FIFO is named as one, not as missing
            require_regular(path, f"the {kind} format's {name}")
        except FileNotFoundError:
            raise CapstackError(f"{path}: not found") from None
        except OSError as error:
            raise CapstackError(f"{path}: cannot read it ({error.strerror})") from None
    if (out / "best.pt").exists() or (out / "last.pt").exists():
        raise CapstackError(f"{out}: holds a run already (best.pt or last.pt): choose another "
                            f"--out, or remove it")
    converted = reader.read(sources)
    prepared = load_captions(captions)
    stores = Features(features, max_regions)
    if stores.feature_dim != converted.feature_dim:
        raise CapstackError(f"{', '.join(map(str, stores.paths))}: features of "
                            f"{stores.feature_dim} numbers, the checkpoint reads "
                            f"{converted.feature_dim} (give the stores it was trained on)")
    experiment = experiment_from_dict({
        "name": out.name, "decoder": {"name": converted.decoder, **file_form(converted.config)},
        "data": {"captions": str(captions), "features": [str(f) for f in features],
                 "max_regions": max_regions},
        "train": {"max_len": converted.max_len}, "eval": {"max_len": converted.max_len}},
        f"import-checkpoint {kind}")
    vocab = prepared.vocab
    model = experiment.build_decoder(len(vocab), stores.feature_dim)
    state = converted.weights(vocab)
    try:  # a decoder converts the layouts it knows on load (nn.LSTMCell's weights)
        model.load_state_dict(state)
    except RuntimeError as error:
        raise CapstackError(f"import-checkpoint {kind}: the converted weights do not fit the "
                            f"{converted.decoder} decoder ({str(error).splitlines()[0]})") from None
    state = model.state_dict()
    require_fit(state, model, f"import-checkpoint {kind}", f"the {converted.decoder} decoder")
    checkpoint = payload(
        identity(converted.decoder, asdict(experiment.decoder.config), vocab.itow,
                 stores.describe()),
        experiment.to_dict(), vocab, stores, state, converted.table,
        Position(Kept("cider", score=0.0, cider=0.0, epoch=0)).recorded(),  # its weights kept
        imported={"format": kind, **converted.about})
    record = {"format": kind, "sources": {str(p): md5_of_file(p) for p in sources},
              "captions": str(captions), "features": [str(f) for f in features],
              **converted.about, "notes": converted.notes}
    with undone_on_failure(out, ("imported.json", "best.pt")):
        write_json(out / "imported.json", record)
        save_checkpoint(out / "best.pt", checkpoint)  # last: what makes the folder a run
    return Imported(out / "best.pt", converted.decoder,
                    sum(p.numel() for p in model.parameters()), converted.notes)


@contextmanager
def undone_on_failure(out: Path, names: tuple[str, ...]) -> Iterator[None]:
    """``out`` made (with its missing parents) for the files ``names``; when writing them
    fails (a full disk, a stop), those this import wrote and the folders it made are removed
    again: a failed import leaves nothing behind, and no half run a rerun would refuse."""
    made = [folder for folder in (out, *out.parents) if not folder.exists()]  # deepest first
    there = {name for name in names if (out / name).exists()}
    out.mkdir(parents=True, exist_ok=True)
    try:
        yield
    except BaseException:
        for name in names:
            if name not in there:
                (out / name).unlink(missing_ok=True)
        for folder in made:
            with suppress(OSError):  # no longer empty: something else writes there
                folder.rmdir()
        raise


import_modules(__name__, __path__)  # each registers itself
