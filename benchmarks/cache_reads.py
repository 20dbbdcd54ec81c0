"""The reader side of benchmarks/cache.py: the same token rows (d_model 256, float32) written once by
hookrun's store and once as a Hugging Face `datasets` folder, then read in batches of 4096 rows as
torch tensors, in order and shuffled, each reader in its own process. The files are read from the
page cache (they were just written), as a training job rereading its cache would.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

D, BATCH = 256, 4096
CAPTURE = ("res", "transformer.h.3", "output")


def _rows(n: int, lo: int, hi: int) -> np.ndarray:
    return np.random.default_rng(lo).standard_normal((hi - lo, D), dtype=np.float32)


def make_h5(n: int, folder: Path) -> dict:
    """cache.h5 through hookrun's store (1024 token rows a batch)."""
    from hookrun.store.h5store import H5Store
    from hookrun.store.records import Capture, CaptureKey, StepRecord

    with H5Store(folder / "cache.h5", {"config": "{}"}, expected_samples=n) as store:
        for step, lo in enumerate(range(0, n, 1024)):
            hi = min(lo + 1024, n)
            cap = Capture(CaptureKey(CAPTURE[0], CAPTURE[1], "forward", CAPTURE[2]), torch.from_numpy(_rows(n, lo, hi)), False)
            store.write(StepRecord(step, np.arange(lo, hi), None, None, [cap]))
    return {"seconds": 0.0, "rows": n}


def make_files(n: int, folder: Path) -> dict:
    """cache.h5 (make_h5), and arrow/ through datasets."""
    import datasets

    make_h5(n, folder)
    datasets.disable_progress_bars()
    features = datasets.Features({"x": datasets.Sequence(datasets.Value("float32"), length=D)})
    shards = [datasets.Dataset.from_dict({"x": _rows(n, lo, min(lo + 65536, n))}, features=features)
              for lo in range(0, n, 65536)]
    datasets.concatenate_datasets(shards).save_to_disk(str(folder / "arrow"))
    return {"seconds": 0.0, "rows": n}


def _timed(n: int, batches) -> dict:
    t = time.perf_counter()
    rows = 0
    checksum = 0.0
    for x in batches:
        rows += len(x)
        checksum += float(x[0, 0])
    seconds = time.perf_counter() - t
    return {"seconds": seconds, "rows": rows, "rows_per_s": rows / seconds, "checksum": checksum}


def _epochs(loader, epochs: int):
    """The loader's batches over `epochs` epochs (set_epoch before each, as a training loop does)."""
    for e in range(epochs):
        loader.set_epoch(e)
        yield from loader


def read_inorder(n: int, folder: Path, epochs: int = 1) -> dict:
    """hookrun's loader in file order; with epochs > 1 the timed read is that many passes (a pass
    over a file in the page cache can take 50 ms, too short to time on a shared machine)."""
    from hookrun import open_run

    with open_run(folder / "cache.h5") as run:
        return _timed(n, _epochs(run.loader(CAPTURE, batch_size=BATCH, shuffle=False), epochs))


def read_shuffled(n: int, folder: Path, epochs: int = 1) -> dict:
    from hookrun import open_run

    with open_run(folder / "cache.h5") as run:
        return _timed(n, _epochs(run.loader(CAPTURE, batch_size=BATCH, shuffle=True, seed=0), epochs))


def read_h5py_fancy(n: int, folder: Path, seconds: float = 20.0) -> dict:
    """Naive random rows: a permutation, each batch's indices sorted (h5py needs them increasing),
    read with fancy indexing. Stops after `seconds` (it is slow); rows/s is over what it read."""
    import h5py

    perm = np.random.default_rng(0).permutation(n)
    with h5py.File(folder / "cache.h5", "r") as f:
        ds = f["captures/" + "/".join(CAPTURE)]
        start = time.perf_counter()

        def batches():
            for i in range(0, n, BATCH):
                if time.perf_counter() - start > seconds:
                    return
                yield torch.from_numpy(ds[np.sort(perm[i : i + BATCH])])

        return _timed(n, batches())


def _arrow(folder: Path, shuffle: bool):
    import datasets

    ds = datasets.load_from_disk(str(folder / "arrow"))
    ds = ds.shuffle(seed=0) if shuffle else ds
    return ds.with_format("torch")


def read_datasets_inorder(n: int, folder: Path) -> dict:
    ds = _arrow(folder, False)
    return _timed(n, (ds[i : i + BATCH]["x"] for i in range(0, len(ds), BATCH)))


def read_datasets_shuffled(n: int, folder: Path) -> dict:
    """SAELens' way: load_from_disk(...).shuffle(seed), read in slices of 4096 as torch tensors."""
    ds = _arrow(folder, True)
    return _timed(n, (ds[i : i + BATCH]["x"] for i in range(0, len(ds), BATCH)))


READERS = {f.__name__: f for f in (make_files, read_inorder, read_shuffled, read_h5py_fancy, read_datasets_inorder,
                                   read_datasets_shuffled)}
