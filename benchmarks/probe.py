"""Linear probes on 4 layers of a ResNet-18 over in-memory tensors: `python benchmarks/probe.py`.

Three routes over the same images and labels, timed in paired rounds in one child process (each
route called once before the rounds, to warm imports, allocator and kernels; the running order
shuffled each round, seeded), so that both sides of a ratio see the machine at the same moment:
- bare: the forward over every batch under no_grad, nothing hooked;
- hookrun: `hookrun.run` with a `probe:` block (layer1..layer4, mean over space, logistic C=1,
  standardize, split 0.25, no control), to a file; its pass = its wall time minus the solver's own
  time (the file's fit_seconds per hook point);
- sklearn: the script a user writes: forward hooks that append each layer's mean-pooled output to
  lists in memory, then per layer train_test_split, StandardScaler and
  LogisticRegression(C=1, lbfgs, tol=1e-8, the tolerance hookrun uses), fitted one after another.
Each ratio is the median of the rounds' ratios (the detail gives each round's, and the whole run's
ratio by CPU time: the process's and its ended children's, a run's flush helper). Peak memory: each
route once more in a child process of its own, with the imports that route needs only (a probe run
imports no scikit-learn: the table says so), its peak RSS from os.wait4.
Targets: hookrun's pass / bare <= 1.15; hookrun's whole run against the sklearn script in time and
peak memory (the peer to beat). The load average is printed with the table.

    python benchmarks/probe.py                 # 1024 images of 64 x 64, batch 64, 5 rounds, threads as installed
    python benchmarks/probe.py --threads 1     # every route on one thread (OMP_NUM_THREADS=1: torch and BLAS)
    python benchmarks/probe.py --quick         # 128 images of 32 x 32, 1 round
    python benchmarks/probe.py --markdown docs/benchmarks/probe.md   # also append the table there
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

LAYERS = ["layer1", "layer2", "layer3", "layer4"]


def setup(n: int, size: int):
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None
    model.train()
    with torch.no_grad():
        model(torch.rand(16, 3, size, size))
    model.eval()
    g = torch.Generator().manual_seed(1)
    x = torch.rand(n, 3, size, size, generator=g) * 0.5
    y = torch.randint(0, 4, (n,), generator=g)
    h = size // 2
    for i in range(n):  # a bright square in the quadrant the label names
        r, c = divmod(int(y[i]), 2)
        x[i, :, r * h + h // 4: r * h + 3 * h // 4, c * h + h // 4: c * h + 3 * h // 4] += 0.5
    return model, x, y


def routes(model, x, y, batch: int, folder: Path) -> tuple[dict, dict[str, list[float]]]:
    """The three routes over the same batches, each a function that runs it once and imports what it needs
    on its first call (the warm-up's); and each call's solver seconds (hookrun: the file's fit_seconds;
    the script: its time after the pass)."""
    import numpy as np
    import torch

    n, fits = len(x), {"hookrun": [], "sklearn": []}
    path = folder / "probe.h5"

    def bare():
        with torch.no_grad():
            for s in range(0, n, batch):
                model(x[s:s + batch])

    def hr():
        import h5py

        import hookrun

        hookrun.run({"data": {"batch_size": batch}, "device": "cpu", "progress": False,
                     "output": {"path": str(path), "overwrite": True},
                     "probe": {"at": LAYERS, "target": "label", "method": "logistic", "C": 1.0, "pool": "mean"}},
                    model=model, dataset=torch.utils.data.TensorDataset(x, y))
        with h5py.File(path, "r") as f:
            fits["hookrun"].append(sum(float(f[f"probe/{k}"].attrs["fit_seconds"]) for k in f["probe"]))
            return [float(f[f"probe/{k}"].attrs["test_score"]) for k in sorted(f["probe"])]

    def script():
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import train_test_split
        from sklearn.preprocessing import StandardScaler

        feats = {name: [] for name in LAYERS}
        hooks = [getattr(model, name).register_forward_hook(
            lambda m, a, o, name=name: feats[name].append(o.mean((2, 3)).double().numpy())) for name in LAYERS]
        try:
            bare()
        finally:
            for h in hooks:
                h.remove()
        passed = time.perf_counter()
        tr, te = train_test_split(np.arange(n), test_size=0.25, random_state=0)
        acc = []
        for name in LAYERS:
            f = np.concatenate(feats[name])
            sc = StandardScaler().fit(f[tr])
            clf = LogisticRegression(C=1.0, tol=1e-8, max_iter=1000).fit(sc.transform(f[tr]), y.numpy()[tr])
            acc.append(float(clf.score(sc.transform(f[te]), y.numpy()[te])))
        fits["sklearn"].append(time.perf_counter() - passed)
        return acc

    return {"bare": bare, "hookrun": hr, "sklearn": script}, fits


def child(route: str, n: int, size: int, batch: int) -> dict:
    """One route once in a process of its own, for its peak resident memory (os.wait4 in the parent),
    with the imports that route needs only."""
    import torch

    model, x, y = setup(n, size)
    with torch.no_grad():
        model(x[:batch])  # warm-up
    with tempfile.TemporaryDirectory() as tmp:
        routes(model, x, y, batch, Path(tmp))[0][route]()
    return {"sklearn": "sklearn" in sys.modules}


def timed(n: int, size: int, batch: int, rounds: int) -> dict:
    """Paired rounds of the three routes in this one process (the order shuffled each round, seeded)."""
    import resource

    def ended_children() -> float:  # (the CPU time of the helper process a run's file starts, once it ended)
        u = resource.getrusage(resource.RUSAGE_CHILDREN)
        return u.ru_utime + u.ru_stime

    model, x, y = setup(n, size)
    kids: dict[str, list[float]] = {}

    def counted(name, fn):
        def go():
            c0 = ended_children()
            out = fn()
            kids.setdefault(name, []).append(ended_children() - c0)
            return out
        return go

    with tempfile.TemporaryDirectory() as tmp:
        run, fits = routes(model, x, y, batch, Path(tmp))
        r = harness.paired_rounds({k: counted(k, fn) for k, fn in run.items()}, rounds, harness.seeded_shuffle())
    cpu = {k: [c + e for c, e in zip(v, kids[k][1:], strict=True)] for k, v in r.cpu.items()}
    return {"wall": r.wall, "cpu": cpu, "fits": {k: v[1:] for k, v in fits.items()}, "test": r.first}


def main() -> None:
    p = harness.parser(__doc__)
    harness.int_options(p, images=1024, size=64, batch=64, rounds=5, threads=0)
    harness.quick_and_markdown(p, "128 images of 32 x 32, 1 round: checks that everything runs",
                               "append the results table to this file")
    a = harness.parse(p, images=128, size=32, rounds=1)
    started = time.perf_counter()
    env = {k: v for k, v in harness.child_env().items() if not k.endswith("_NUM_THREADS")}  # 0: what a user's process gets
    env.update({"OMP_NUM_THREADS": str(a.threads)} if a.threads else {})
    sizes = [str(a.images), str(a.size), str(a.batch)]
    got, _ = harness.run_child([sys.executable, __file__, "--child", "time", *sizes, str(a.rounds)], "the timed rounds", env, warm=harness.QUICK, imports=harness.VISION_IMPORTS)
    wall, fits = got["wall"], got["fits"]
    peaks, imported = {}, False
    for route in ("bare", "hookrun", "sklearn"):
        out, usage = harness.run_child([sys.executable, __file__, "--child", route, *sizes], f"the {route} route", env, warm=harness.QUICK, imports=harness.VISION_IMPORTS)
        peaks[route] = usage.ru_maxrss / 1024
        imported = imported or (route == "hookrun" and out["sklearn"])
    med = statistics.median
    passes = [h - f for h, f in zip(wall["hookrun"], fits["hookrun"], strict=True)]
    t = harness.Targets()
    pass_ratio = med(p_ / b for p_, b in zip(passes, wall["bare"], strict=True))
    t.add("probe pass / bare forward (time)", pass_ratio, "<= 1.15", pass_ratio <= 1.15,
          f"{med(passes):.2f} s / {med(wall['bare']):.2f} s; the solver's own {med(fits['hookrun']):.2f} s on top; "
          f"rounds {', '.join(f'{p_ / b:.3f}' for p_, b in zip(passes, wall['bare'], strict=True))}")
    whole = harness.ratio(wall, "hookrun", "sklearn")
    each = ", ".join(f"{h / s_:.3f}" for h, s_ in zip(wall["hookrun"], wall["sklearn"], strict=True))
    t.add("hookrun run / sklearn script (time)", whole, "<= 1 (the peer to beat)", whole <= 1.0,
          f"{med(wall['hookrun']):.2f} s / {med(wall['sklearn']):.2f} s (sklearn's fits {med(fits['sklearn']):.2f} s); "
          f"rounds {each}; by CPU time {harness.ratio(got['cpu'], 'hookrun', 'sklearn'):.3f} (the process's and its ended children's)")
    mem = peaks["hookrun"] / peaks["sklearn"]
    t.add("hookrun / sklearn script (peak RSS)", mem, "<= 1", mem <= 1.0,
          f"{peaks['hookrun']:.0f} MB / {peaks['sklearn']:.0f} MB; bare forward {peaks['bare']:.0f} MB; "
          f"hookrun's process imported scikit-learn: {'yes' if imported else 'no'}")
    same = [abs(u - v) for u, v in zip(got["test"]["hookrun"], got["test"]["sklearn"], strict=True)]
    t.add("test accuracy, hookrun - sklearn (max abs)", max(same), "<= 0.01", max(same) <= 0.01,
          "per layer: " + ", ".join(f"{v:.3f}" for v in got["test"]["hookrun"]))
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    head = harness.environment(time.perf_counter() - started, *harness.versions("torch", "scikit-learn"),
                               f"{a.images} images {a.size}x{a.size}, batch {a.batch}, {a.rounds} round(s), load {load}",
                               threads=f"threads {a.threads or 'as installed (torch and BLAS: one per core)'}")
    print(harness.report("probe.py", head, t.lines(), markdown=a.markdown, append=True))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sizes = [int(v) for v in sys.argv[3:]]
        print(json.dumps(timed(*sizes) if sys.argv[2] == "time" else child(sys.argv[2], *sizes)))
    else:
        main()
