"""One benchmark scenario per process: `python benchmarks/scenarios.py NAME --batches N --dir D`.

Prints one JSON line: {"name", "seconds", "bytes", ...}. The parent (benchmarks/run.py) reads the
child's peak RSS from os.wait4. Every scenario runs ResNet-18 on 224x224 synthetic images, batch
16, and (where it records) the outputs of layer1..layer4, about 1.5 MB per sample in float32.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import h5py
import numpy as np
import torch
import torchvision

LAYERS = ["layer1", "layer2", "layer3", "layer4"]
BATCH = 16


def base_cfg(batches: int, out: Path, hooks=None, **extra) -> dict:
    return {
        "model": {"_target_": "torchvision.models.resnet18", "weights": None},
        "data": {"dataset": {"_target_": "hookrun.data.synthetic", "size": BATCH * batches}, "batch_size": BATCH},
        "device": "cpu", "progress": False, "hooks": hooks,
        "output": {"path": str(out), "overwrite": True}, **extra,
    }


RECORD = {"layers": {"at": LAYERS, "type": "forward", "actions": [{"name": "record", "what": "output"}]}}


def hookrun_run(batches: int, out: Path, hooks=None, **extra) -> dict:
    import hookrun

    t = time.perf_counter()
    hookrun.run(base_cfg(batches, out, hooks, **extra))
    return {"seconds": time.perf_counter() - t, "bytes": out.stat().st_size}


def s_no_hooks(batches: int, out: Path) -> dict:
    return hookrun_run(batches, out)


def s_record(batches: int, out: Path) -> dict:
    return hookrun_run(batches, out, RECORD)


def s_record_layer1(batches: int, out: Path) -> dict:
    return hookrun_run(batches, out, {"l1": {"at": "layer1", "type": "forward", "actions": [{"name": "record", "what": "output"}]}})


def s_early_stop_layer1(batches: int, out: Path) -> dict:
    return hookrun_run(batches, out, {"l1": {"at": "layer1", "type": "forward", "actions": [{"name": "record", "what": "output"}]}},
                       early_stop=True)


def _loader(batches: int):
    from hookrun.data import synthetic

    return torch.utils.data.DataLoader(synthetic(size=BATCH * batches), batch_size=BATCH)


def s_tutorial(batches: int, out: Path) -> dict:
    """The recipe from tutorials: forward hooks append to lists, one h5py write at the end."""
    t = time.perf_counter()
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    store = {name: [] for name in LAYERS}
    for name in LAYERS:
        getattr(model, name).register_forward_hook(lambda m, i, o, name=name: store[name].append(o.detach().cpu()))
    with torch.no_grad():
        for x, _ in _loader(batches):
            model(x)
    with h5py.File(out, "w") as f:
        for name, chunks in store.items():
            f.create_dataset(name, data=torch.cat(chunks).numpy())
    return {"seconds": time.perf_counter() - t, "bytes": out.stat().st_size}


def s_feature_extractor(batches: int, out: Path) -> dict:
    """torchvision's create_feature_extractor, each batch appended to h5py by hand (streaming)."""
    from torchvision.models.feature_extraction import create_feature_extractor

    t = time.perf_counter()
    torch.manual_seed(0)
    model = create_feature_extractor(torchvision.models.resnet18(weights=None).eval(), return_nodes=LAYERS)
    with h5py.File(out, "w") as f, torch.no_grad():
        for x, _ in _loader(batches):
            for name, v in model(x).items():
                a = v.numpy()
                if name not in f:
                    f.create_dataset(name, shape=(0, *a.shape[1:]), maxshape=(None, *a.shape[1:]), dtype=a.dtype,
                                     chunks=(max(1, (1 << 20) // a[0].nbytes), *a.shape[1:]))
                ds = f[name]
                ds.resize(ds.shape[0] + len(a), axis=0)
                ds[-len(a):] = a
    return {"seconds": time.perf_counter() - t, "bytes": out.stat().st_size}


def s_torchlens(batches: int, out: Path) -> dict:
    """TorchLens' full trace (torchlens.trace, every op saved) per batch; the four layers to h5py."""
    import torchlens as tl

    t = time.perf_counter()
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    with h5py.File(out, "w") as f:
        for step, (x, _) in enumerate(_loader(batches)):
            trace = tl.trace(model, x)
            for name in LAYERS:
                f.create_dataset(f"{name}/{step}", data=trace[name].out.detach().numpy())
    return {"seconds": time.perf_counter() - t, "bytes": out.stat().st_size}


def _batch_arrays() -> list[np.ndarray]:
    shapes = [(BATCH, 64, 56, 56), (BATCH, 128, 28, 28), (BATCH, 256, 14, 14), (BATCH, 512, 7, 7)]
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s, dtype=np.float32) for s in shapes]


def s_store_write(batches: int, out: Path) -> dict:
    """hookrun's writer alone: the bytes of one_write, from the same distinct memory (not one batch
    written again and again, which would flatter the writer), batch by batch through the writer thread."""
    from hookrun.store.h5store import H5Store
    from hookrun.store.records import Capture, CaptureKey, StepRecord
    from hookrun.store.writer import BackgroundWriter

    big = [torch.from_numpy(np.concatenate([a] * batches)) for a in _batch_arrays()]  # the same memory as one_write
    t = time.perf_counter()
    store = H5Store(out, {})
    with BackgroundWriter(store) as writer:
        for step in range(batches):
            rows = slice(step * BATCH, (step + 1) * BATCH)
            caps = [Capture(CaptureKey("layers", n, "forward", "output"), a[rows], False) for n, a in zip(LAYERS, big, strict=True)]
            writer.put(StepRecord(step, np.arange(step * BATCH, (step + 1) * BATCH), None, None, caps))
    store.close("complete")
    return {"seconds": time.perf_counter() - t, "bytes": out.stat().st_size}


def s_one_write(batches: int, out: Path) -> dict:
    """The same bytes in one large h5py write per dataset (the disk's ceiling for h5py)."""
    big = [np.concatenate([a] * batches) for a in _batch_arrays()]
    t = time.perf_counter()
    with h5py.File(out, "w") as f:
        for name, a in zip(LAYERS, big, strict=True):
            f.create_dataset(name, data=a)
    return {"seconds": time.perf_counter() - t, "bytes": out.stat().st_size}


def s_raw_write(batches: int, out: Path) -> dict:
    """The same bytes as one_write through a plain file.write, no HDF5: what the disk gives one write."""
    big = [np.concatenate([a] * batches) for a in _batch_arrays()]
    t = time.perf_counter()
    with open(out, "wb") as f:
        for a in big:
            f.write(memoryview(a).cast("B"))
    return {"seconds": time.perf_counter() - t, "bytes": out.stat().st_size}


def s_hook_cost(batches: int, out: Path) -> dict:
    """Fixed cost per firing: a hookrun hook with no action on every leaf module of ResNet-18,
    against the bare forward pass and against a raw no-op PyTorch hook, on a tiny input. `batches`
    is the number of interleaved rounds of 40 forwards per variant (run.py: 30; --quick: 2)."""
    from hookrun.config import parse_hooks
    from hookrun.hooks.actions import ActionEnv
    from hookrun.hooks.plan import make_plan
    from hookrun.hooks.session import HookSession

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 32, 32)
    leaves = [n for n, m in model.named_modules() if n and not list(m.children())]
    fired = [0]

    def count(m, i, o):
        fired[0] += 1

    handles = [dict(model.named_modules())[n].register_forward_hook(count) for n in leaves]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    firings = fired[0]

    env = ActionEnv()
    points = make_plan(model, parse_hooks({"noop": {"at": leaves, "type": "forward", "actions": []}}), env, "eval")
    session = HookSession(points, env)
    session.begin_step(0, 1, torch.arange(1))
    raw_handles: list = []

    def bare_on():
        pass

    def raw_on():
        raw_handles.extend(dict(model.named_modules())[n].register_forward_hook(lambda m, i, o: None) for n in leaves)

    def raw_off():
        while raw_handles:
            raw_handles.pop().remove()

    variants = {"bare": (bare_on, bare_on), "raw": (raw_on, raw_off), "hooked": (session.__enter__, session.remove)}
    best = dict.fromkeys(variants, float("inf"))
    with torch.no_grad():
        for _ in range(5):
            model(x)  # warm-up
        for _ in range(batches):  # interleaved rounds; the minimum of each is the least disturbed
            for name, (on, off) in variants.items():
                on()
                t = time.perf_counter()
                for _ in range(40):
                    model(x)
                best[name] = min(best[name], (time.perf_counter() - t) / 40)
                off()
    bare, raw, hooked = best["bare"], best["raw"], best["hooked"]
    return {"seconds": hooked, "bare_s": bare, "raw_hook_s": raw, "firings": firings, "leaves": len(leaves),
            "us_per_firing": (hooked - bare) / firings * 1e6, "raw_us_per_firing": (raw - bare) / firings * 1e6, "bytes": 0}


def main() -> None:
    global BATCH
    p = argparse.ArgumentParser()
    p.add_argument("name")
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--batch", type=int, default=BATCH, help=f"images a batch (default {BATCH}; run.py --quick: fewer)")
    a = p.parse_args()
    BATCH = a.batch
    out = a.dir / f"{a.name}_{os.getpid()}.h5"
    try:
        result = globals()[f"s_{a.name}"](a.batches, out)
    finally:
        if out.exists():
            out.unlink()
    print(json.dumps({"name": a.name, "batches": a.batches, **result}))


if __name__ == "__main__":
    main()
