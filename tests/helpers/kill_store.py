"""Hundreds of SIGKILLs over an HDF5 store's life, each checked with plain h5py (tests only).

    python tests/helpers/kill_store.py DIR --kills 500 [--batches 60] [--seed 0] [--want 120]

This process imports the store once, then forks one writer per kill: the child writes `batches`
batches (flush_every=1, a capture of every sample, a per-step capture, a capture that stops after
30 rows, token rows, checksums on) and the parent sends SIGKILL after a random delay drawn over the
child's whole life (measured first from an unkilled child). Every file a kill leaves is then opened
with plain h5py, once the killed writer's flush helper let go of it (store/live.py's `settled`, as
hookrun's readers wait; HDF5's file locking refuses the file until then), and must agree with its
counts: every dataset's length equals what `samples_complete` / `steps_complete` say, and every
row equals what an unkilled writer writes.
Prints one JSON line: kills, files checked, and each disagreement found (none expected). With
`--want N` it stops once N files were checked (at most `--kills` kills): a kill before the file has
its name leaves nothing to check, and how many do depends on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hookrun, run as a script too

from hookrun.store.h5store import H5Store  # noqa: E402
from hookrun.store.live import settled  # noqa: E402
from hookrun.store.records import Capture, CaptureKey, StepRecord  # noqa: E402
from hookrun.store.verify import table_of  # noqa: E402

B, TOKENS = 4, 3  # samples per batch, token rows per sample


def batch(step: int) -> StepRecord:
    """Batch `step`'s record: values a pure function of the step, so any file can be checked."""
    idx = np.arange(step * B, (step + 1) * B)
    g = torch.Generator().manual_seed(step)
    caps = [
        Capture(CaptureKey("f", "features", "forward", "output"), torch.randn(B, 16, 8, 8, generator=g), False),
        Capture(CaptureKey("m", "features", "forward", "output"), torch.randn(5, generator=g), True),
        Capture(CaptureKey("t", "block", "forward", "output"), torch.randn(B * TOKENS, 32, generator=g), False, tokens=True),
    ]
    if step * B < 30:
        caps.append(Capture(CaptureKey("h", "head", "forward", "output"), torch.randn(B, 10, generator=g), False,
                            index=idx))
    tokens = (np.repeat(idx, TOKENS), np.tile(np.arange(TOKENS), B))
    return StepRecord(step, idx, idx % 10, None, caps, tokens=tokens)


def write(path: Path, batches: int) -> None:
    with H5Store(path, {"config": "kill test"}, flush_every=1, checksum=True) as store:
        for step in range(batches):
            store.write(batch(step))


def child(path: Path, batches: int) -> None:
    code = 1
    try:
        write(path, batches)
        code = 0
    finally:
        os._exit(code)


def check(path: Path) -> list[str]:
    """What in a killed file disagrees with its counts or with the writer's values (empty: nothing).
    A file killed inside a flush (at NAME.flushing) must hold the batches of the flush before. Read
    as hookrun reads a killed run's file: once its flush helper has written its last message."""
    wrong = []
    settled(path)
    with h5py.File(path, "r") as f:
        n, steps = int(f.attrs["samples_complete"]), int(f.attrs["steps_complete"])
        if path.suffix == ".flushing":  # lengths may be past the counts: only the previous flush is sure
            steps, n = (int(v) for v in f.attrs["previous_flush"])
            return [f"{path.name}: {w}" for w in _values(f, steps) + _at_least(f, n, steps)]
        if n != steps * B:
            wrong.append(f"samples_complete={n} but steps_complete={steps}")
        for name, rows in _want(n, steps).items():
            have = f[name].shape[0] if name in f else 0
            if have != rows and not (rows == 0 and name not in f):
                wrong.append(f"{name} has {have} rows, the counts say {rows}")
        wrong += _values(f, steps)
        for name in _walk(f):
            tag = f[name].attrs.get("digest", "")
            if tag:  # the run's /checksums table names this capture's last row
                ends = table_of(f[name], tag)[:, 0]
                if len(ends) and int(ends[-1]) != f[name].shape[0]:
                    wrong.append(f"/checksums ends {name} at row {int(ends[-1])}, the capture has {f[name].shape[0]}")
    return wrong


def _want(n: int, steps: int) -> dict[str, int]:
    return {"samples/index": n, "samples/step": n, "samples/target": n, "samples/token_sample": n * TOKENS,
            "samples/token_position": n * TOKENS, "captures/f/features/output": n,
            "captures/m/features/output": steps, "captures/t/block/output": n * TOKENS,
            "captures/h/head/output": min(n, 32), "captures/h/head/output.index": min(n, 32)}


def _at_least(f: h5py.File, n: int, steps: int) -> list[str]:
    return [f"{name} has {f[name].shape[0] if name in f else 0} rows, fewer than the previous flush's {rows}"
            for name, rows in _want(n, steps).items() if rows and (f[name].shape[0] if name in f else 0) < rows]


def _values(f: h5py.File, steps: int) -> list[str]:
    wrong = []
    for step in range(steps):
            ref = batch(step)
            for cap in ref.captures:
                ds = f[cap.key.path]
                if cap.per_step:
                    got = ds[step]
                elif cap.tokens:
                    got = ds[step * B * TOKENS:(step + 1) * B * TOKENS]
                else:
                    got = ds[step * B:(step + 1) * B]
                if not np.array_equal(got, cap.value.numpy()):
                    wrong.append(f"{cap.key.path} batch {step} differs from the writer's values")
            if not np.array_equal(f["samples/index"][step * B:(step + 1) * B], ref.sample_index):
                wrong.append(f"samples/index batch {step} differs")
    return wrong


def _walk(f: h5py.File) -> list[str]:
    names: list[str] = []
    f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    return names


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("--kills", type=int, default=300)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--want", type=int, default=0, help="stop once this many files were checked")
    args = parser.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    write(args.folder / "ref.h5", args.batches)  # warm, and the life to spread the kills over
    life = time.monotonic() - started
    rng = random.Random(args.seed)
    checked, found, mid_flush = 0, [], 0
    kills = 0
    for i in range(args.kills):
        if args.want and checked >= args.want:
            break
        kills += 1
        path = args.folder / f"k{i}.h5"
        pid = os.fork()
        if pid == 0:
            child(path, args.batches)
        time.sleep(rng.uniform(0, life * 1.05))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        aside = path.with_name(path.name + ".flushing")
        if aside.exists():  # killed inside a flush: the name is free, the file stands aside
            mid_flush += 1
            path = aside
        if path.exists():
            checked += 1
            try:
                wrong = check(path)
            except Exception as exc:  # noqa: BLE001 - a file that does not open is a finding too
                wrong = [f"{type(exc).__name__}: {exc}"]
            if wrong:
                found.append({"kill": i, "wrong": wrong[:3]})
            else:
                path.unlink()
    print(json.dumps({"kills": kills, "checked": checked, "mid_flush": mid_flush, "life_s": round(life, 3), "disagreements": found}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
