"""hookrun's speed and memory targets, measured side by side: `python benchmarks/run.py`.

Each scenario (benchmarks/scenarios.py) runs in its own child process, so its peak RSS is its
own (os.wait4); the scenarios of a comparison run interleaved, round after round, after an
os.sync() so that no run pays for another's dirty pages, and each ratio is taken between medians.

    python benchmarks/run.py                  # the full comparison (about 10 minutes on 2 cores)
    python benchmarks/run.py --quick          # a smoke run: 2 batches of 4, 1 round
    python benchmarks/run.py --markdown table.md   # also write the table there (replacing the file; the figures: docs/benchmarks/recording.md)
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness

HERE = Path(__file__).resolve().parent


BATCH = 16  # images a batch (scenarios.py's own default); --quick: 4
# what a scenario imports besides hookrun: the warm process of a smoke run (never transformers, which no scenario uses)
IMPORTS = (*harness.VISION_IMPORTS, "torchvision.models.feature_extraction")


def child(name: str, batches: int, folder: Path) -> dict:
    """Run one scenario in a fresh process; its JSON line plus its own peak RSS."""
    harness.sync()
    cmd = [sys.executable, str(HERE / "scenarios.py"), name, "--batches", str(batches), "--dir", str(folder), "--batch", str(BATCH)]
    result, usage = harness.run_child(cmd, f"scenario {name}", harness.child_env(), warm=harness.QUICK, imports=IMPORTS)
    result["rss_mb"] = usage.ru_maxrss / 1024  # Linux: KiB
    return result


def rounds(names: list[str], batches: int, n: int, folder: Path, log) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(n):
        for name in names:
            res = child(name, batches, folder)
            out[name].append(res)
            log(f"  round {r + 1}/{n} {name:18s} {res['seconds']:8.3f} s  {res['rss_mb']:7.0f} MB")
    return out


def med(results: list[dict], key: str = "seconds") -> float:
    return statistics.median(r[key] for r in results)


def main() -> None:
    global BATCH
    p = harness.parser(__doc__)
    p.add_argument("--batches", type=int, default=40, help="batches of 16 for the timing runs (default 40)")
    p.add_argument("--batch-size", type=int, default=BATCH, help=f"images a batch (default {BATCH}; --quick: 4)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved repetitions (default 3)")
    p.add_argument("--rss-batches", type=int, nargs=2, default=[8, 64], metavar=("SMALL", "LARGE"))
    harness.quick_and_markdown(p, "2 batches of 4, 1 round: checks that everything runs", "write the results table to this file too")
    p.add_argument("--dir", type=Path, help="where the scenarios write (default: a temporary folder)")
    a = harness.parse(p, batches=2, rounds=1, rss_batches=[1, 2], batch_size=4)
    BATCH = a.batch_size
    log = harness.log
    started = time.time()
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        folder = Path(tmp)
        timing = ["no_hooks", "record", "tutorial", "feature_extractor", "record_layer1", "early_stop_layer1"]
        log(f"whole runs, {a.batches} batches of {BATCH}, {a.rounds} round(s)")
        t = rounds(timing, a.batches, a.rounds, folder, log)
        if importlib.util.find_spec("torchlens"):
            log("TorchLens (one round: about 10x slower)")
            t.update(rounds(["torchlens"], a.batches, 1, folder, log))
        log("writer throughput")
        # 3 rounds at least (a write is short and noisy), but one in a smoke run: each is a process start
        w = rounds(["store_write", "one_write", "raw_write"], a.batches, a.rounds if a.quick else max(a.rounds, 3), folder, log)
        log(f"peak RSS at {a.rss_batches[0]} and {a.rss_batches[1]} batches")
        small, large = a.rss_batches
        # a point whose batches the timing rounds ran already is that child's peak (the same scenario and size)
        rss = {(name, n): t[name][0]["rss_mb"] if n == a.batches else child(name, n, folder)["rss_mb"]
               for name in ("record", "tutorial") for n in (small, large)}
        log("hook cost")
        # a few µs measured as the difference of two forward passes: one process is noisy on a shared
        # machine, so take the median over several (each the minimum over interleaved rounds)
        costs = [child("hook_cost", 2 if a.quick else 30, folder) for _ in range(1 if a.quick else 5)]  # (rounds)
        for c in costs:
            log(f"  hook_cost: {c['us_per_firing']:.2f} us a firing (raw PyTorch hook {c['raw_us_per_firing']:.2f})")

    targets = harness.Targets()
    row = targets.add
    base = med(t["no_hooks"])
    r1 = med(t["record"]) / base
    row("1. record / no hooks (time)", r1, "<= 1.10", r1 <= 1.10, f"{med(t['record']):.2f} s / {base:.2f} s")
    r2 = med(t["record"]) / med(t["tutorial"])
    row("2. record / tutorial script (time)", r2, "<= 1.00", r2 <= 1.0, f"{med(t['record']):.2f} s / {med(t['tutorial']):.2f} s")
    r3 = rss[("record", large)] / rss[("record", small)]
    row(f"3. peak RSS {large} / {small} batches", r3, "<= 1.10", r3 <= 1.10, f"{rss[('record', large)]:.0f} MB / {rss[('record', small)]:.0f} MB")
    r3t = rss[("tutorial", large)] / rss[("tutorial", small)]
    row("   tutorial script, same", r3t, "(grows)", True, f"{rss[('tutorial', large)]:.0f} MB / {rss[('tutorial', small)]:.0f} MB")
    gb = w["store_write"][0]["bytes"] / 1e9
    r4 = med(w["one_write"]) / med(w["store_write"])
    row("4. writer bytes/s / one h5py write", r4, ">= 0.80", r4 >= 0.8,
        f"{gb / med(w['store_write']):.2f} GB/s vs {gb / med(w['one_write']):.2f} GB/s ({gb:.2f} GB); "
        f"a raw file.write of the same bytes {gb / med(w['raw_write']):.2f} GB/s")
    us = med(costs, "us_per_firing")
    spread = f"{min(c['us_per_firing'] for c in costs):.1f}-{max(c['us_per_firing'] for c in costs):.1f}"
    row("5. cost per hook firing (us)", us, "<= 10", us <= 10,
        f"median of {len(costs)} processes ({spread}); {costs[0]['firings']} firings/forward on {costs[0]['leaves']} "
        f"leaves; raw PyTorch no-op hook alone {med(costs, 'raw_us_per_firing'):.1f} us")
    es = med(t["early_stop_layer1"]) / base
    row("early stop: layer1 / no hooks (time)", es, "< 1", es < 1,
        f"{med(t['early_stop_layer1']):.2f} s; without early stop {med(t['record_layer1']):.2f} s")
    fx = med(t["feature_extractor"]) / base
    row("create_feature_extractor + h5py / no hooks", fx, "(info)", True, f"{med(t['feature_extractor']):.2f} s")
    if "torchlens" in t:
        tl = med(t["torchlens"]) / base
        row("TorchLens full trace + h5py / no hooks", tl, "(info)", True, f"{med(t['torchlens']):.2f} s (1 round)")

    import h5py

    env = harness.environment(time.time() - started, *harness.module_versions("torch", "h5py"),
                              f"HDF5 {h5py.version.hdf5_version}")
    print(harness.report("run.py", env, targets.lines(), markdown=a.markdown))


if __name__ == "__main__":
    main()
