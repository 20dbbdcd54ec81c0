"""A linear-CKA matrix of 4 layers against the bare forward and a hand script: `python benchmarks/similarity.py`.

The four stages of a torchvision ResNet-18 (random weights, batch-norm statistics on noise) over
`--images` random images held in memory, three routes over the same batches:

- bare: the forward alone, under no_grad (the time the target divides by);
- hookrun: `hookrun.run` with a `similarity:` block (linear_cka, exact, pool flatten), to a file;
- minibatch: the same with `estimator: minibatch` (unbiased HSIC per batch; no pass at the end);
- script: what a user writes by hand: forward hooks that keep every layer's output in memory
  (torch.cat at the end), then numpy's linear CKA of every pair (Kornblith et al.'s gram_linear
  and cka, float64).

Paired rounds in one process, the order shuffled each round (seeded); each ratio is the median of
the rounds' ratios (CPU-time ratios beside them: on a shared machine the wall clock is noisy).
Target: hookrun / bare <= 1.2 (wall). Peak memory: each route once more in a child process of its
own, its resident memory sampled while it runs, above the bare route's. The matrices must agree
(max abs difference). The load average is printed with the table.

    python benchmarks/similarity.py                    # 512 images of 64 x 64, batch 64, 3 rounds
    python benchmarks/similarity.py --quick            # a smoke run: 16 images of 32 x 32, 1 round (no minibatch memory child)
    python benchmarks/similarity.py --markdown docs/benchmarks/similarity.md   # also append the table to its page
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness
import numpy as np
import torch
import torchvision

import hookrun

AT = ["layer1", "layer2", "layer3", "layer4"]
MB = 1 << 20


def setup(a):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None
    model.train()
    with torch.no_grad():
        model(torch.rand(16, 3, a.size, a.size))
    g = torch.Generator().manual_seed(1)
    data = [(torch.rand(3, a.size, a.size, generator=g), i % 10) for i in range(a.images)]
    return model.eval(), data


def routes(a, model, data, folder: Path) -> dict:
    xs = torch.stack([x for x, _ in data])
    cfg = {"data": {"batch_size": a.batch}, "device": "cpu", "progress": False,
           "output": {"path": str(folder / "cka.h5"), "overwrite": True},
           "similarity": {"at": AT, "measure": "linear_cka", "pool": "flatten", "memory": "8GB"}}

    def bare():
        with torch.no_grad():
            for s in range(0, len(xs), a.batch):
                model(xs[s: s + a.batch])

    def hr():
        hookrun.run(cfg, model=model, dataset=data)
        with hookrun.open_run(folder / "cka.h5") as run:
            return run.similarity().values

    def minibatch():
        hookrun.run({**cfg, "output": {"path": str(folder / "mb.h5"), "overwrite": True},
                     "similarity": {**cfg["similarity"], "estimator": "minibatch"}}, model=model, dataset=data)

    def script():
        kept: dict[str, list[torch.Tensor]] = {n: [] for n in AT}
        handles = [model.get_submodule(n).register_forward_hook(
            lambda m, i, o, n=n: kept[n].append(o.detach().reshape(len(o), -1).clone())) for n in AT]
        try:
            bare()
        finally:
            for h in handles:
                h.remove()
        grams = [gram_linear(torch.cat(kept[n]).double().numpy()) for n in AT]
        return np.array([[cka(k, l_) for l_ in grams] for k in grams])

    return {"bare": bare, "hookrun": hr, "minibatch": minibatch, "script": script}


def gram_linear(x: np.ndarray) -> np.ndarray:  # Kornblith et al.'s colab
    return x.dot(x.T)


def center_gram(gram: np.ndarray) -> np.ndarray:
    gram = gram.copy()
    means = np.mean(gram, 0, dtype=np.float64)
    means -= np.mean(means) / 2
    gram -= means[:, None]
    gram -= means[None, :]
    return gram


def cka(gram_x: np.ndarray, gram_y: np.ndarray) -> float:
    gram_x, gram_y = center_gram(gram_x), center_gram(gram_y)
    scaled_hsic = gram_x.ravel().dot(gram_y.ravel())
    return float(scaled_hsic / (np.linalg.norm(gram_x) * np.linalg.norm(gram_y)))


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(a, route: str) -> None:
    """One route twice, in this process, the second measured: its seconds and its peak resident memory
    above what the process held before it (sampled every 2 ms), as JSON."""
    torch.set_num_threads(a.threads)
    model, data = setup(a)
    with tempfile.TemporaryDirectory(prefix="cka_bench_") as folder:
        run = routes(a, model, data, Path(folder))
        run[route]()  # imports, allocator and kernels warm: what is measured is the route's own
        base, peak, done = rss(), [0], threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], rss())
                time.sleep(0.002)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        run[route]()
        seconds = time.perf_counter() - t0
        done.set()
        sampler.join()
        print(json.dumps({"seconds": seconds, "peak_mb": (max(peak[0], rss()) - base) / MB}))


def main() -> None:
    p = harness.parser(__doc__)
    harness.quick_and_markdown(p, "small sizes, 1 round: checks that everything runs", "append the table to this file")
    harness.int_options(p, images=512, size=64, batch=64, rounds=3, threads=torch.get_num_threads())
    p.add_argument("--child", choices=["bare", "hookrun", "minibatch", "script"], help=argparse_hide())
    a = harness.parse(p, images=16, size=32, batch=8, rounds=1)
    if a.child:
        return child(a, a.child)
    torch.set_num_threads(a.threads)
    started = time.perf_counter()
    model, data = setup(a)
    t = harness.Targets()
    with tempfile.TemporaryDirectory(prefix="cka_bench_") as folder:
        run = routes(a, model, data, Path(folder))
        rounds = harness.paired_rounds(run, a.rounds, harness.seeded_shuffle())
    size = (f"{a.images} images {a.size} x {a.size}, batch {a.batch}, 4 layers flattened "
            f"({', '.join(str(d) for d in feature_counts(model, a))} features)")
    for num in ("hookrun", "minibatch", "script"):
        ratio = harness.ratio(rounds.wall, num, "bare")
        each = ", ".join(f"{x / y:.2f}" for x, y in zip(rounds.wall[num], rounds.wall["bare"], strict=True))
        bound, ok = ("<= 1.2", ratio <= 1.2) if num != "script" else ("(peer)", None)
        cpu = harness.ratio(rounds.cpu, num, "bare")
        what = {"hookrun": "exact", "minibatch": "hookrun estimator: minibatch", "script": "hooks into memory + numpy"}
        t.add(f"{num} / bare forward (wall)", ratio, bound, ok, f"{what[num]}; {size}; rounds {each}; by CPU time {cpu:.3f}")
    t.add("hookrun / script (wall)", harness.ratio(rounds.wall, "hookrun", "script"), "< 1", None,
          f"the same batches; by CPU time {harness.ratio(rounds.cpu, 'hookrun', 'script'):.3f}")
    diff = float(np.abs(rounds.first["hookrun"] - rounds.first["script"]).max())
    t.add("max abs difference of the matrices", f"{diff:.2e}", "<= 1e-6", diff <= 1e-6, "hookrun's file against numpy's")
    peaks = {}
    measured = ("bare", "hookrun", "script") if a.quick else ("bare", "hookrun", "minibatch", "script")  # (a smoke run)
    for route in measured:
        cmd = [sys.executable, __file__, "--child", route, "--images", str(a.images), "--size", str(a.size),
               "--batch", str(a.batch), "--threads", str(a.threads)]
        # (large blocks mmapped, so each is returned when freed: the warm run's freed memory is not held
        # by the allocator, below the base, where the measured run reuses it unseen)
        env = harness.child_env(MALLOC_MMAP_THRESHOLD_="131072")
        peaks[route] = harness.run_child(cmd, f"the {route} route", env, warm=harness.QUICK, imports=harness.VISION_IMPORTS)[0]["peak_mb"]
    for route in measured[1:]:
        t.add(f"peak RSS above the bare forward: {route} (MB)", f"{peaks[route] - peaks['bare']:.0f}", "(lower wins)",
              None, f"the route's peak resident memory above the process's before it, less the bare forward's "
                    f"({peaks['bare']:.0f} MB); the script holds {a.images} x {sum(feature_counts(model, a))} float32")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    head = harness.environment(time.perf_counter() - started, *harness.versions("torch", "numpy"), "device cpu",
                               f"load average {load}", threads=f"threads {torch.get_num_threads()}")
    print(harness.report("similarity.py", head, t.lines(), markdown=a.markdown, append=True))


def feature_counts(model, a) -> list[int]:
    out = {}
    handles = [model.get_submodule(n).register_forward_hook(lambda m, i, o, n=n: out.__setitem__(n, o[0].numel()))
               for n in AT]
    with torch.no_grad():
        model(torch.zeros(1, 3, a.size, a.size))
    for h in handles:
        h.remove()
    return [out[n] for n in AT]


def argparse_hide() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
