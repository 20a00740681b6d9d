"""Reading a file ``torch.save`` wrote: tensors and plain data only, refused in one line.

``torch.load(weights_only=True)`` builds tensors, plain containers, numbers and strings, and
refuses any other object the file names. Its refusal is six lines that advise
``weights_only=False``, which would run whatever the file says; a file holding such objects
(a whole pickled model, a checkpoint of another toolkit) is named here in one line instead,
as is a file that is missing, not a regular file (a FIFO would block the read) or not a torch
file at all.
"""

from __future__ import annotations

import os
import pickle
import re

import torch

from pipeline.core.errors import CapstackError
from pipeline.core.regular import NotRegular, open_regular

_REFUSED_GLOBAL = re.compile(r"GLOBAL (\S{1,120}) was not an allowed global")


def load_tensors(path: str | os.PathLike, what: str):
    """What the torch file ``path`` holds (mapped to the CPU), ``what`` naming it in a
    refusal: ``PATH: WHAT not found``, ``PATH: not a regular file (a FIFO), never read``,
    ``PATH: holds objects capstack does not load (NAME): not a plain tensor WHAT`` or
    ``PATH: not a readable WHAT (torch's first line)``."""
    try:
        file = open_regular(path, f"a {what}")
    except FileNotFoundError:
        raise CapstackError(f"{path}: {what} not found") from None
    except NotRegular:
        raise
    except OSError as error:
        raise CapstackError(f"{path}: cannot read {what} ({error.strerror})") from None
    with file:
        try:
            return torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as error:
            if "Weights only load failed" not in str(error):
                raise CapstackError(f"{path}: not a readable {what} "
                                    f"({_first_line(error)})") from None
            if "Unsupported operand" in str(error):  # bytes no pickler wrote
                raise CapstackError(f"{path}: not a readable {what} (not a file torch.save "
                                    f"wrote)") from None
            named = _REFUSED_GLOBAL.search(str(error))
            raise CapstackError(f"{path}: holds objects capstack does not load"
                                f"{f' ({named.group(1)})' if named else ''}: not a plain tensor "
                                f"{what} (capstack reads tensors and plain data, and runs "
                                f"nothing a file names)") from None
        except Exception as error:  # a truncated or foreign file: say which
            raise CapstackError(f"{path}: not a readable {what} ({_first_line(error)})") from None


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
