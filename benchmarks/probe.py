"""Linear probes on 4 layers of a ResNet-18 over in-memory tensors: `python benchmarks/probe.py`.

Three routes over the same images and labels, each in a child process of its own (its peak RSS from
os.wait4), the work timed inside it after a warm-up batch:
- bare: the forward over every batch under no_grad, nothing hooked;
- hookrun: `hookrun.run` with a `probe:` block (layer1..layer4, mean over space, logistic C=1,
  standardize, split 0.25, no control), to a file; its pass = its wall time minus the solver's own
  time (the file's fit_seconds per hook point);
- sklearn: the script a user writes: forward hooks that append each layer's mean-pooled output to
  lists in memory, then per layer train_test_split, StandardScaler and
  LogisticRegression(C=1, lbfgs, tol=1e-8, the tolerance hookrun uses), fitted one after another.
Each route imports what it needs before the clock: the script scikit-learn, hookrun scipy.optimize,
h5py and its run modules (a probe run imports no scikit-learn: the table says so).
Each ratio is the median of the rounds' (the time's detail gives each round's, and the ratio of the
routes' CPU time, their ended children's included: on a shared machine the wall clock is noisy).
Targets: hookrun's pass / bare <= 1.15; hookrun's whole run against the sklearn script in time and
peak memory (the peer to beat). Rounds alternate the order (seeded); ratios are medians of the
rounds'. The load average is printed with the table.

    python benchmarks/probe.py                 # 1024 images of 64 x 64, batch 64, 3 rounds, threads as installed
    python benchmarks/probe.py --threads 1     # every route on one thread (OMP_NUM_THREADS=1: torch and BLAS)
    python benchmarks/probe.py --quick         # 128 images of 32 x 32, 1 round
    python benchmarks/probe.py --markdown docs/benchmarks/probe.md
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


def child(route: str, n: int, size: int, batch: int) -> dict:
    import torch

    model, x, y = setup(n, size)
    with torch.no_grad():
        model(x[:batch])  # warm-up
    if route == "sklearn":  # the imports each route needs, before the clock starts
        import sklearn.linear_model  # noqa: F401
        import sklearn.model_selection  # noqa: F401
        import sklearn.preprocessing  # noqa: F401
    elif route == "hookrun":  # (lazy: what hookrun.run loads is imported on its first call)
        import h5py  # noqa: F401
        import scipy.optimize  # noqa: F401

        import hookrun.runner.kinds.probe.kind  # noqa: F401
        import hookrun.runner.run  # noqa: F401
    t0, c0 = time.perf_counter(), cpu_seconds()
    if route == "bare":
        with torch.no_grad():
            for s in range(0, n, batch):
                model(x[s:s + batch])
        return {"wall": time.perf_counter() - t0, "cpu": cpu_seconds() - c0}
    if route == "hookrun":
        import h5py

        import hookrun

        data = torch.utils.data.TensorDataset(x, y)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "probe.h5"
            hookrun.run({"data": {"batch_size": batch}, "device": "cpu", "progress": False, "output": {"path": str(path)},
                         "probe": {"at": LAYERS, "target": "label", "method": "logistic", "C": 1.0, "pool": "mean"}},
                        model=model, dataset=data)
            wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
            with h5py.File(path, "r") as f:
                fit = sum(float(f[f"probe/{k}"].attrs["fit_seconds"]) for k in f["probe"])
                acc = [float(f[f"probe/{k}"].attrs["test_score"]) for k in sorted(f["probe"])]
        return {"wall": wall, "cpu": cpu, "fit": fit, "test": acc, "sklearn": "sklearn" in sys.modules}
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    feats = {name: [] for name in LAYERS}
    hooks = [getattr(model, name).register_forward_hook(
        lambda m, a, o, name=name: feats[name].append(o.mean((2, 3)).double().numpy())) for name in LAYERS]
    with torch.no_grad():
        for s in range(0, n, batch):
            model(x[s:s + batch])
    for h in hooks:
        h.remove()
    passed = time.perf_counter() - t0
    tr, te = train_test_split(np.arange(n), test_size=0.25, random_state=0)
    acc = []
    for name in LAYERS:
        f = np.concatenate(feats[name])
        sc = StandardScaler().fit(f[tr])
        clf = LogisticRegression(C=1.0, tol=1e-8, max_iter=1000).fit(sc.transform(f[tr]), y.numpy()[tr])
        acc.append(float(clf.score(sc.transform(f[te]), y.numpy()[te])))
    wall = time.perf_counter() - t0
    return {"wall": wall, "cpu": cpu_seconds() - c0, "fit": wall - passed, "test": acc}


def cpu_seconds() -> float:
    """This process's CPU time and its ended children's (the flush helper a run's file starts)."""
    import resource

    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                   resource.getrusage(resource.RUSAGE_CHILDREN)))


def main() -> None:
    p = harness.parser(__doc__)
    harness.int_options(p, images=1024, size=64, batch=64, rounds=3, threads=0)
    harness.quick_and_markdown(p, "128 images of 32 x 32, 1 round: checks that everything runs",
                               "write the results table to this file too")
    a = harness.parse(p, images=128, size=32, rounds=1)
    started = time.perf_counter()
    env = {k: v for k, v in harness.child_env().items() if not k.endswith("_NUM_THREADS")}  # 0: what a user's process gets
    env.update({"OMP_NUM_THREADS": str(a.threads)} if a.threads else {})
    routes = ["bare", "hookrun", "sklearn"]
    got: dict[str, list[dict]] = {r: [] for r in routes}
    for r in range(a.rounds):
        order = list(routes)
        harness.per_round_shuffle(r, order)
        for route in order:
            out, usage = harness.run_child([sys.executable, __file__, "--child", route, str(a.images), str(a.size),
                                            str(a.batch)], route, env)
            out["rss_mb"] = usage.ru_maxrss / 1024
            got[route].append(out)
            harness.log(f"  round {r + 1}/{a.rounds} {route:8s} {out['wall']:7.3f} s, peak RSS {out['rss_mb']:.0f} MB")
    med = lambda route, key: statistics.median(o[key] for o in got[route])  # noqa: E731
    ratios = [(h["wall"] - h["fit"]) / b["wall"] for h, b in zip(got["hookrun"], got["bare"], strict=True)]
    t = harness.Targets()
    pass_ratio = statistics.median(ratios)
    t.add("probe pass / bare forward (time)", pass_ratio, "<= 1.15", pass_ratio <= 1.15,
          f"{med('hookrun', 'wall') - med('hookrun', 'fit'):.2f} s / {med('bare', 'wall'):.2f} s; the solver's own "
          f"{med('hookrun', 'fit'):.2f} s on top")
    whole = statistics.median(h["wall"] / s["wall"] for h, s in zip(got["hookrun"], got["sklearn"], strict=True))
    by_cpu = statistics.median(h["cpu"] / s["cpu"] for h, s in zip(got["hookrun"], got["sklearn"], strict=True))
    each = ", ".join(f"{h['wall'] / s['wall']:.3f}" for h, s in zip(got["hookrun"], got["sklearn"], strict=True))
    t.add("hookrun run / sklearn script (time)", whole, "<= 1 (the peer to beat)", whole <= 1.0,
          f"{med('hookrun', 'wall'):.2f} s / {med('sklearn', 'wall'):.2f} s (sklearn's fits {med('sklearn', 'fit'):.2f} s); "
          f"rounds {each}; "
          f"by CPU time {by_cpu:.3f}")
    mem = med("hookrun", "rss_mb") / med("sklearn", "rss_mb")
    t.add("hookrun / sklearn script (peak RSS)", mem, "<= 1", mem <= 1.0,
          f"{med('hookrun', 'rss_mb'):.0f} MB / {med('sklearn', 'rss_mb'):.0f} MB; bare forward {med('bare', 'rss_mb'):.0f} MB; "
          f"hookrun's process imported scikit-learn: {'yes' if any(h['sklearn'] for h in got['hookrun']) else 'no'}")
    same = [abs(u - v) for u, v in zip(got["hookrun"][0]["test"], got["sklearn"][0]["test"], strict=True)]
    t.add("test accuracy, hookrun - sklearn (max abs)", max(same), "<= 0.01", max(same) <= 0.01,
          "per layer: " + ", ".join(f"{v:.3f}" for v in got["hookrun"][0]["test"]))
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    head = harness.environment(time.perf_counter() - started, *harness.versions("torch", "scikit-learn"),
                               f"{a.images} images {a.size}x{a.size}, batch {a.batch}, {a.rounds} round(s), load {load}",
                               threads=f"threads {a.threads or 'as installed (torch and BLAS: one per core)'}")
    print(harness.report("probe.py", head, t.lines(), markdown=a.markdown))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))))
    else:
        main()
