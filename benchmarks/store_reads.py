"""Store reads: random-access records/s in training batches, LMDB and HDF5, 0/2/4 workers.

For 36x2048 (regions) and 196x2048 (grid) float16 records, against the floor
measured in the same run: a bare loop of ``lmdb`` gets copied into one
preallocated batch array (what any batch must do). A batch is read by one
call (``StoreReader.read_batch``), in the DataLoader's workers when there are
some, and stays float16 (conversion belongs on the device). "0+reuse" reads
in the main process into one reused ``BatchBuffer`` instead of a fresh array.

    python benchmarks/store_reads.py [--records 1000] [--batch 50] [--dir DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

import common  # this checkout importable  # noqa: F401

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

from pipeline.features.stores import Record, Schema, create_writer, field, open_store
from pipeline.features.stores.buffer import BatchBuffer
from pipeline.features.stores.lmdb import _HEADER, _record_key, shared_env


class BatchReads(Dataset):
    """Each item is a whole batch: a list of ids in, one padded array out."""

    def __init__(self, store, ids, reuse: bool = False):
        self.store, self.ids = store, ids
        self.buffer = BatchBuffer() if reuse else None

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, positions):
        info = torch.utils.data.get_worker_info()
        allocate = shared_empty if info is not None else self.buffer or np.empty
        batch = self.store.read_batch([self.ids[p] for p in positions], allocate=allocate)
        return torch.from_numpy(batch.features), torch.from_numpy(batch.mask)


def shared_empty(shape, dtype):
    """An array in shared memory: a worker's batch then reaches the trainer uncopied."""
    return torch.empty(shape, dtype=torch.float16 if dtype == np.float16 else torch.float32
                       ).share_memory_().numpy()


def write(path: Path, n: int, rows: int, dim: int) -> list[int]:
    rng = np.random.default_rng(0)
    meta = {**Schema((field("features", (dim,), "float16"),)).to_meta(),
            "producer": {"name": "benchmark", "settings": {}, "about": {}},
            "fingerprint": "bench", "capstack_version": "bench"}
    block = rng.standard_normal((rows, dim)).astype(np.float16)
    with create_writer(path, meta) as w:
        for start in range(0, n, 100):
            w.write([(i, Record(block, 100, 100)) for i in range(start, min(n, start + 100))])
        w.finish()
    return list(range(n))


def floor_lmdb(path: Path, ids, batch: int, rows: int, dim: int, rounds: int) -> float:
    """Bare lmdb gets copied into one preallocated array: records/s."""
    env = shared_env(path)
    out = np.empty((batch, rows, dim), np.float16)
    rng = np.random.default_rng(1)
    started = time.perf_counter()
    done = 0
    for _ in range(rounds):
        chosen = rng.choice(ids, size=batch, replace=False)
        with env.begin(buffers=True) as txn:
            for k, i in enumerate(chosen):
                buf = txn.get(_record_key(int(i)))
                out[k] = np.frombuffer(buf, np.float16, rows * dim, _HEADER.size).reshape(rows, dim)
        done += batch
    return done / (time.perf_counter() - started)


def loader_rate(path: Path, ids, batch: int, workers: int, rounds: int,
                reuse: bool = False) -> float:
    store = open_store(path)
    sampler = BatchSampler(RandomSampler(range(len(ids)),
                                         generator=torch.Generator().manual_seed(0)),
                           batch, drop_last=True)
    loader = DataLoader(BatchReads(store, ids, reuse), sampler=sampler, batch_size=None,
                        num_workers=workers, persistent_workers=workers > 0,
                        prefetch_factor=4 if workers else None)
    it = iter(loader)
    next(it)  # start-up (worker processes) is not the steady state
    started = time.perf_counter()
    done = 0
    for _ in range(rounds):
        try:
            features, _ = next(it)
        except StopIteration:
            it = iter(loader)
            features, _ = next(it)
        done += features.shape[0]
    return done / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # 4 workers, 2 cores
    print(f"{'record':>10} {'backend':>7} {'workers':>7} {'records/s':>10} {'vs floor':>8}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for rows, dim, label in ((36, 2048, "36x2048"), (196, 2048, "196x2048")):
            paths = {}
            for suffix in (".lmdb", ".h5"):
                paths[suffix] = Path(tmp) / f"{label}{suffix}"
                ids = write(paths[suffix], args.records, rows, dim)
            floor = floor_lmdb(paths[".lmdb"], ids, args.batch, rows, dim, args.rounds * 2)
            print(f"{label:>10} {'floor':>7} {'-':>7} {floor:10.0f} {1.0:8.2f}")
            for suffix, backend in ((".lmdb", "lmdb"), (".h5", "hdf5")):
                runs = [("0", 0, False), ("0+reuse", 0, True), ("2", 2, False), ("4", 4, False)]
                for name, workers, reuse in runs:
                    rate = loader_rate(paths[suffix], ids, args.batch, workers, args.rounds, reuse)
                    print(f"{label:>10} {backend:>7} {name:>7} {rate:10.0f} "
                          f"{rate / floor:8.2f}")


if __name__ == "__main__":
    main()
