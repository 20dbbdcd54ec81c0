"""One capture on 1 process x 2 threads against 2 processes x 1 thread: `python benchmarks/ranks.py`.

The same command (experiment=resnet_layer1: ResNet-18, 224x224 synthetic images, batch 16, the
outputs of layer1's blocks) runs as one process with OMP_NUM_THREADS=2, under
`torchrun --standalone --nproc_per_node=2` with OMP_NUM_THREADS=1, and (a control) as one process
with OMP_NUM_THREADS=1, interleaved round after round;
ratios are taken between medians. Reported: the whole command's wall time, the capture time (the
slowest rank's run(), from hookrun's log), the samples per second of each, the time rank 0 took to
write the merged view, the same view rebuilt alone over the finished shards, and each rank's peak
RSS (every process writes its own `ru_maxrss` when it exits).

    python benchmarks/ranks.py                 # 16 batches, 3 rounds (about 5 minutes on 2 cores)
    python benchmarks/ranks.py --quick         # 2 batches of 64x64 images, 1 round: a smoke run
    python benchmarks/ranks.py --markdown docs/benchmarks/ranks.md   # also append the table there
    python benchmarks/ranks.py --view-only     # only the view over 16 synthetic shards x 20 captures
"""

from __future__ import annotations

import atexit
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness

ROOT = Path(__file__).resolve().parents[1]
BATCH = 16


def child() -> None:
    """Run hookrun's CLI in this process and leave this rank's peak RSS in $HOOKRUN_BENCH_RSS."""
    folder = Path(os.environ["HOOKRUN_BENCH_RSS"])
    rank = os.environ.get("RANK", "single")

    def save() -> None:
        (folder / f"rss-{rank}.json").write_text(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))

    atexit.register(save)
    sys.path.insert(0, str(ROOT))
    from hookrun.cli.app import main

    sys.argv = ["hookrun", *sys.argv[2:]]
    main()


def scenario(name: str, batches: int, folder: Path, small: bool = False) -> dict:
    """One whole command; its wall time, capture time, merge time and peak RSS per rank."""
    run_dir = folder / name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    args = ["experiment=resnet_layer1", f"data.dataset.size={batches * BATCH}", "device=cpu", "progress=false",
            f"hydra.run.dir={run_dir}"] + (["data.dataset.image_size=[3,64,64]"] if small else [])
    threads = "2" if "2 threads" in name else "1"
    env = {**os.environ, "OMP_NUM_THREADS": threads, "HOOKRUN_BENCH_RSS": str(run_dir), "PYTHONPATH": str(ROOT)}
    launch = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"] if name.startswith("2 processes") else []
    harness.sync()
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, *launch, str(Path(__file__).resolve()), "--child", *args], env=env,
                          capture_output=True, text=True, cwd=folder)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
    log = (run_dir / "hookrun.log").read_text()
    runs = [float(s) for s in re.findall(r"complete: \d+ batches, \d+ samples, [\d.]+ MB in ([\d.]+) s", log)]
    merge = re.findall(r"merged \d+ shard\(s\) into .*?, in ([\d.]+) s", log)
    rss = {p.stem[4:]: json.loads(p.read_text()) for p in sorted(run_dir.glob("rss-*.json"))}
    return {"wall": wall, "capture": max(runs), "merge": float(merge[0]) if merge else None, "rss": rss, "dir": run_dir}


def rebuild_view(run_dir: Path, repeats: int) -> float:
    """The median time to write the merged view again over the finished shards (no run around it)."""
    import h5py

    sys.path.insert(0, str(ROOT))
    from hookrun.store.merge import build_view

    merged = run_dir / "captures.h5"
    with h5py.File(merged, "r") as f:
        attrs = {"config": f.attrs["config"]}
    shards = sorted(run_dir.glob("captures.rank-*.h5"))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        build_view(merged, shards, attrs)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def view_at_scale(folder: Path, shards: int = 16, captures: int = 20, rows: int = 10_000) -> tuple[float, float]:
    """The view over `shards` synthetic shard files of `captures` captures of `rows` rows of 64x56x56
    float32 each (declared, not written: HDF5 allocates nothing), in ms; and its logical size in TB."""
    import h5py
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from hookrun.store.merge import build_view

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(shards):
        path = folder / f"captures.rank-{r:05d}.h5"
        with h5py.File(path, "w") as f:
            f.attrs.update(status="complete", format_version="1", steps_complete=rows // 16, samples_complete=rows)
            f["samples/index"] = np.arange(r * rows, (r + 1) * rows)
            f["samples/step"] = np.arange(r * rows, (r + 1) * rows) // 16
            for c in range(captures):
                ds = f.create_dataset(f"captures/h{c}/layer{c}/output", shape=(rows, 64, 56, 56), dtype="float32",
                                      chunks=(1, 64, 56, 56))
                ds.attrs.update(hook=f"h{c}", module=f"layer{c}", type="forward", role="output", call=0, rows="samples",
                                torch_dtype="float32", row_shape=np.array([64, 56, 56]), index="")
        paths.append(path)
    times = []
    for _ in range(5):
        started = time.perf_counter()
        build_view(folder / "captures.h5", paths, {"config": "{}"})
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000, shards * captures * rows * 64 * 56 * 56 * 4 / 1e12


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child()
        return
    p = harness.parser(__doc__)
    p.add_argument("--batches", type=int, default=16, help="batches of 16 images (default 16)")
    p.add_argument("--rounds", type=int, default=3)
    harness.quick_and_markdown(p, "2 batches of 64x64 images, 1 round: a smoke run", "append the results table to this file")
    p.add_argument("--view-only", action="store_true", help="only the view over 16 synthetic shards x 20 captures")
    a = harness.parse(p, batches=2, rounds=1)
    if a.view_only:
        with tempfile.TemporaryDirectory(prefix="hookrun-view-") as tmp:
            ms, tb = view_at_scale(Path(tmp))
        print(f"the view alone over 16 shards x 20 captures of 64x56x56 float32 ({tb:.2f} TB declared): "
              f"median of 5 {ms:.0f} ms; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        return
    batches, n = a.batches, a.rounds
    names = ["1 process x 2 threads", "2 processes x 1 thread", "1 process x 1 thread"]  # the last: a control
    results: dict[str, list[dict]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="hookrun-ranks-") as tmp:
        folder = Path(tmp)
        for r in range(n):
            for name in names:
                res = scenario(name, batches, folder, small=a.quick)
                results[name].append(res)
                print(f"round {r + 1}/{n}  {name:24s} wall {res['wall']:7.2f} s  capture {res['capture']:7.2f} s  "
                      f"merge {res['merge'] if res['merge'] is not None else '-'}  rss {res['rss']}", flush=True)
        view_alone = rebuild_view(results[names[1]][-1]["dir"], 5)
        scale_ms, scale_tb = view_at_scale(folder / "scale", *((2, 2, 100) if a.quick else (16, 20, 10_000)))
    samples = batches * BATCH
    med = {name: {k: statistics.median(x[k] for x in rs) for k in ("wall", "capture")} for name, rs in results.items()}
    merges = [x["merge"] for x in results[names[1]]]
    lines = [
        f"{platform.node()}: {platform.machine()}, {os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f} at the end), "
        f"Python {platform.python_version()}, "
        f"{_versions()}, {time.strftime('%Y-%m-%d')}; {samples} samples ({batches} batches of {BATCH}), {n} round(s)",
        "",
        "| scenario | command wall time | capture time (slowest rank) | samples/s (capture) | peak RSS per process |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        rss = results[name][-1]["rss"]
        per = ", ".join(f"{'rank ' + k if k != 'single' else 'the process'} {v:.0f} MB" for k, v in rss.items())
        lines.append(f"| {name} | {med[name]['wall']:.2f} s | {med[name]['capture']:.2f} s | "
                     f"{samples / med[name]['capture']:.1f} | {per} |")
    ratio_capture = med[names[0]]["capture"] / med[names[1]]["capture"]
    ratio_wall = med[names[0]]["wall"] / med[names[1]]["wall"]
    lines += [
        "",
        f"- throughput, 2 processes / 1 process (capture time): **{ratio_capture:.2f}x**; whole command: {ratio_wall:.2f}x",
        f"- control, 1 process x 1 thread / 1 process x 2 threads (capture time): "
        f"{med[names[2]]['capture'] / med[names[0]]['capture']:.2f} (below 1: the second thread slows the run down)",
        f"- merged view written by rank 0: median {statistics.median(merges):.3f} s (rounds: "
        f"{', '.join(f'{m:.3f}' for m in merges)}); rebuilt alone over the finished shards: {view_alone * 1000:.1f} ms",
        f"- the view alone over {'2 shards x 2' if a.quick else '16 shards x 20'} captures of 64x56x56 float32 "
        f"({scale_tb:.2f} TB declared): median of 5 {scale_ms:.0f} ms: its time grows with shards x captures, not bytes",
    ]
    text = "\n".join(lines)
    print(text)
    harness.save(text, a.markdown, append=True)


def _versions() -> str:
    import h5py

    return ", ".join([*harness.module_versions("torch", "h5py"), f"HDF5 {h5py.version.hdf5_version}"])


if __name__ == "__main__":
    main()
