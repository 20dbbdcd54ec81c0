"""SAE training from a hookrun cache against SAELens' trainer fed from memory: `python benchmarks/sae_train.py`.

The same TopK SAE, trainer config and seed on the same rows (random float16 token rows written as a
hookrun cache), three routes, each in its own child process (peak RSS from os.wait4), interleaved
round after round, the load average read before and after each round:

- `memory`:   SAELens' `SAETrainer` fed from a float32 tensor already in memory (the cache read whole
              first; that read is not timed): the trainer's own speed, the bound.
- `hookrun`:  the `sae:` kind's engine: the cache read through its shuffled loader (windows of
              `--buffer-rows`, a new seeded order per pass) and its prefetch thread (with
              `--device cuda`: pinned buffers, the next batch copied while the step runs) into
              the same trainer.
- `hookrun_4x`: the same from a cache four times larger, the same budget: peak memory must not grow
              with the cache's rows.

Rows per second = the training budget / the seconds `fit()` takes; ratios are medians of per-round
ratios. Memory: the child's peak RSS (os.wait4; the imports of torch and SAELens dominate it), and
the resident memory it still holds after `fit()` beyond what it held before reading any row (the
data: the tensor, or the loader's windows).

    python benchmarks/sae_train.py                 # 262144-row cache, 80 steps of 4096 (minutes on 2 cores)
    python benchmarks/sae_train.py --quick         # a smoke run: tiny sizes, 1 round
    python benchmarks/sae_train.py --markdown docs/benchmarks_sae.md
    python benchmarks/sae_train.py --device cuda   # on a GPU: the memory route's tensor is on the GPU
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness

ROUTES = ["memory", "hookrun", "hookrun_4x"]


def write_cache(path: Path, rows: int, d_in: int, seed: int = 0) -> None:
    """`rows` float16 rows of sparse non-negative sums (SAE-like data) as a hookrun cache."""
    import numpy as np
    import torch

    from hookrun.store.h5store import H5Store
    from hookrun.store.records import Capture, CaptureKey, StepRecord

    rng = np.random.default_rng(seed)
    dictionary = rng.standard_normal((4 * d_in, d_in)).astype(np.float32)
    with H5Store(path, {"config": "{}"}) as store:
        for step, lo in enumerate(range(0, rows, 65536)):
            n = min(65536, rows - lo)
            codes = rng.exponential(1.0, (n, 4 * d_in)).astype(np.float32) * (rng.random((n, 4 * d_in)) < 0.02)
            cap = Capture(CaptureKey("res", "blocks.3", "forward", "output"),
                          torch.from_numpy((codes @ dictionary).astype(np.float16)), False)
            store.write(StepRecord(step, np.arange(lo, lo + n), None, None, [cap]))


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
    harness.int_options(p, cache_rows=262144, d_in=256, d_sae=2048, k=32, batch=4096, steps=80, buffer_rows=131072,
                        rounds=3, threads=1)
    p.add_argument("--child", choices=ROUTES)
    p.add_argument("--device", default="cpu", help="cpu, or cuda: both routes train on the GPU")
    p.add_argument("--cache")
    a = harness.parse(p, cache_rows=4096, d_in=32, d_sae=128, k=8, batch=256, steps=8, buffer_rows=1024, rounds=1)
    if a.child:
        return child(a)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        caches = {"small": Path(tmp) / "cache.h5", "big": Path(tmp) / "cache_4x.h5"}
        write_cache(caches["small"], a.cache_rows, a.d_in)
        write_cache(caches["big"], 4 * a.cache_rows, a.d_in)
        common = [f"--{k.replace('_', '-')}={getattr(a, k)}" for k in
                  ("d_in", "d_sae", "k", "batch", "steps", "buffer_rows", "threads", "device")]
        rate: dict[str, list[float]] = {r: [] for r in ROUTES}
        rss: dict[str, list[float]] = {r: [] for r in ROUTES}
        held: dict[str, list[float]] = {r: [] for r in ROUTES}
        loads: list[float] = []
        order = list(ROUTES)
        for r in range(a.rounds):
            harness.per_round_shuffle(r, order)
            loads.append(os.getloadavg()[0])
            for route in order:
                cache = caches["big" if route == "hookrun_4x" else "small"]
                os.sync()
                out, usage = harness.run_child([sys.executable, __file__, "--child", route, "--cache", str(cache), *common],
                                               route, env=harness.child_env(OMP_NUM_THREADS=str(a.threads)))
                rate[route].append(out["rows"] / out["seconds"])
                rss[route].append(usage.ru_maxrss / 1024)
                held[route].append(out["held_mib"])
                harness.log(f"  round {r + 1}/{a.rounds} {route:11s} {rate[route][-1]:10.0f} rows/s "
                            f"peak {rss[route][-1]:7.0f} MiB, held after fit {held[route][-1]:6.0f} MiB")
            loads.append(os.getloadavg()[0])
    speed = statistics.median(h / m for h, m in zip(rate["hookrun"], rate["memory"], strict=True))
    growth = statistics.median(rss["hookrun_4x"]) / statistics.median(rss["hookrun"])
    held_growth = statistics.median(held["hookrun_4x"]) / max(1.0, statistics.median(held["hookrun"]))
    t = harness.Targets()
    t.add("rows/s: hookrun from a local cache / SAELens from memory", speed, ">= 0.90", speed >= 0.9,
          f"{statistics.median(rate['hookrun']):.0f} / {statistics.median(rate['memory']):.0f} rows/s")
    t.add("peak RSS: 4x the cache's rows / 1x (hookrun)", growth, "<= 1.10", growth <= 1.1,
          f"{statistics.median(rss['hookrun_4x']):.0f} / {statistics.median(rss['hookrun']):.0f} MiB "
          f"(memory route: {statistics.median(rss['memory']):.0f} MiB)")
    t.add("memory held after fit: 4x the cache's rows / 1x (hookrun)", held_growth, "<= 1.10", held_growth <= 1.1,
          f"{statistics.median(held['hookrun_4x']):.0f} / {statistics.median(held['hookrun']):.0f} MiB "
          f"(memory route, the cache in a tensor: {statistics.median(held['memory']):.0f} MiB)")
    head = harness.environment(time.perf_counter() - started, *harness.versions("torch", "sae-lens"),
                               threads=f"{a.threads} torch thread(s), device {a.device}")
    sizes = (f"cache {a.cache_rows} rows x {a.d_in} (float16; 4x: {4 * a.cache_rows}), topk d_sae {a.d_sae} k {a.k}, "
             f"{a.steps} steps of {a.batch} rows, shuffle window {a.buffer_rows} rows, {a.rounds} round(s); "
             f"load average (1 min) {min(loads):.1f}-{max(loads):.1f}")
    print(harness.report("sae_train.py", head, t.lines(), sizes, markdown=a.markdown))


if __name__ == "__main__":
    main()
