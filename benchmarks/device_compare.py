"""The shipped experiments on CUDA against the same runs on the CPU: `python benchmarks/device_compare.py OUTDIR`.

Each experiment runs twice as a user types it (`python -m hookrun experiment=E device=cuda`, then
`device=cpu`; `python benchmarks/device_compare.py OUTDIR edges gradcam` runs those alone); every floating-point data set in the two files (read with h5py alone, not hookrun) is
compared: the largest |cuda - cpu| over the largest |cpu| per file. cuDNN's convolutions use TF32 by
default, so convolution models differ at about 1e-3 relative; a wrong CUDA path differs at order 1.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np

EXPERIMENTS = ["resnet_layer1", "gradcam", "attribution_shapes", "attribution_resnet50", "patching_grid", "edges",
               "faithfulness", "logit_lens"]


def arrays(path: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset) and obj.dtype.kind == "f" and obj.size:
            out[name] = obj[()]
    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return out


def run(experiment: str, device: str, folder: Path) -> tuple[Path, float, str]:
    path = folder / f"{experiment}_{device}.h5"
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "hookrun", f"experiment={experiment}", f"device={device}",
                        f"output.path={path}", "output.overwrite=true", "progress=false",
                        f"hydra.run.dir={folder / 'hydra' / experiment / device}"], capture_output=True, text=True)
    return path, time.perf_counter() - t, (p.stderr.strip().splitlines() or [""])[-1] if p.returncode else ""


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/device_check")
    folder.mkdir(parents=True, exist_ok=True)
    chosen = sys.argv[2:] or EXPERIMENTS  # a subset, by name
    print(f"{'experiment':24} {'cuda s':>7} {'cpu s':>7} {'arrays':>6}  worst relative difference (array)")
    for e in chosen:
        (gpu, tg, err_g), (cpu, tc, err_c) = run(e, "cuda", folder), run(e, "cpu", folder)
        if err_g or err_c:
            print(f"{e:24} FAILED: cuda: {err_g or 'ok'} | cpu: {err_c or 'ok'}")
            continue
        a, b = arrays(gpu), arrays(cpu)
        worst, where = 0.0, ""
        for name in sorted(set(a) & set(b)):
            if a[name].shape != b[name].shape:
                worst, where = float("inf"), f"{name}: shape {a[name].shape} vs {b[name].shape}"
                break
            if np.isnan(a[name]).all() and np.isnan(b[name]).all():
                continue  # e.g. a grid's unmeasured cells
            ref = float(np.nanmax(np.abs(b[name]))) or 1.0
            d = float(np.nanmax(np.abs(a[name] - b[name]))) / ref
            if d > worst:
                worst, where = d, name
        missing = sorted(set(a) ^ set(b))
        print(f"{e:24} {tg:7.1f} {tc:7.1f} {len(set(a) & set(b)):6d}  {worst:.2e} ({where})"
              + (f"; only in one file: {missing[:3]}" if missing else ""))


if __name__ == "__main__":
    main()
