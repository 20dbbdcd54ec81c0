"""Attribution runs against a hand loop of captum: `python benchmarks/attribution.py`.

Integrated gradients and occlusion over a data set of `--images` random images on a torchvision
ResNet-18 (batch-norm statistics on noise): hookrun's attribution run (`hookrun.run` with an
`attribution:` block, to a file) against a hand loop of captum over the same batches, with
`internal_batch_size` (integrated gradients) and `perturbations_per_eval` (occlusion) set to what
hookrun chose from the same memory budget. Paired rounds in one process, the order shuffled each
round (seeded); the ratio is the median of the rounds' ratios. Targets: hookrun / hand loop <= 1.05,
equal values (max abs difference), peak memory within the budget (CUDA: torch's peak allocated per
route; on a CPU the row says it was not measured). The load average is printed with the table.

    python benchmarks/attribution.py                   # 64 images of 64 x 64, 3 rounds
    python benchmarks/attribution.py --quick           # a smoke run: 4 images of 32 x 32, 1 round
    python benchmarks/attribution.py --markdown docs/benchmarks/attribution.md
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import harness
import numpy as np
import torch
import torchvision

import hookrun

MB = 1 << 20


def resnet(a):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None
    model.train()
    with torch.no_grad():
        model(torch.rand(16, 3, a.size, a.size))
    return model.eval().to(a.device)


def peak(device: torch.device, fn):
    """fn()'s value and the peak bytes allocated above what was allocated before (CUDA), or None."""
    if device.type != "cuda":
        return fn(), None
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn()
    torch.cuda.synchronize(device)
    return out, torch.cuda.max_memory_allocated(device) - before


def compare(a, t: harness.Targets, model, data, method: str, block: dict) -> None:
    from captum import attr as ca

    folder = Path(tempfile.mkdtemp(prefix="attr_bench_"))
    cfg = {"data": {"batch_size": a.batch}, "device": str(a.device), "progress": False,
           "output": {"path": str(folder / f"{method}.h5"), "overwrite": True},
           "attribution": {"method": method, "memory": f"{a.budget_mb}MB", **block}}

    def hr():
        hookrun.run(cfg, model=model, dataset=data)
        with hookrun.open_run(folder / f"{method}.h5") as run:
            return run.attribution().values, json.loads(run.attribution().attrs["budget"])

    (values, budget), hr_peak = peak(a.device, hr)
    xs = torch.stack([x for x, _ in data]).to(a.device)
    ys = torch.tensor([y for _, y in data], device=a.device)

    def hand():
        out = []
        for s in range(0, len(data), a.batch):
            x, y = xs[s: s + a.batch], ys[s: s + a.batch]
            if method == "integrated_gradients":
                ibs = min(len(x) * a.steps, max(len(x), budget["rows_per_forward"]))
                r = ca.IntegratedGradients(model).attribute(x, target=y, n_steps=a.steps, internal_batch_size=ibs,
                                                            return_convergence_delta=True)[0]
            else:
                r = ca.Occlusion(model).attribute(x, target=y, sliding_window_shapes=tuple(block["window"]),
                                                  strides=tuple(block["strides"]), baselines=0,
                                                  perturbations_per_eval=budget["perturbations_per_eval"])
            out.append(r.detach().cpu())
        return torch.cat(out).numpy()

    want, hand_peak = peak(a.device, hand)
    rounds = harness.paired_rounds({"hookrun": hr, "captum": hand}, a.rounds, harness.seeded_shuffle())
    ratio = harness.ratio(rounds.wall, "hookrun", "captum")
    cpu = harness.ratio(rounds.cpu, "hookrun", "captum")
    rows = ", ".join(f"{x / y:.2f}" for x, y in zip(rounds.wall["hookrun"], rounds.wall["captum"], strict=True))
    size = (f"{len(data)} images {a.size} x {a.size}, batch {a.batch}, budget {a.budget_mb} MB ({budget}); rounds {rows}; "
            f"by CPU time {cpu:.3f}")
    t.add(f"{method}: hookrun run / captum hand loop (wall)", ratio, "<= 1.05", ratio <= 1.05, size)
    diff = float(np.abs(values - want).max())
    t.add(f"{method}: max abs difference", f"{diff:.2e}", "(check)", diff <= 1e-5 * float(np.abs(want).max()),
          f"of values up to {float(np.abs(want).max()):.3g}")
    if hr_peak is None:
        t.add(f"{method}: peak memory", "not measured", "<= budget", None, "CUDA only (torch's peak allocated)")
    else:
        t.add(f"{method}: peak memory hookrun / captum (MB)", f"{hr_peak / MB:.0f} / {hand_peak / MB:.0f}",
              f"<= {a.budget_mb}", hr_peak <= a.budget_mb * MB, "above what was allocated before")


def main() -> None:
    p = harness.parser(__doc__)
    harness.quick_and_markdown(p, "small sizes, 1 round: checks that everything runs", "append the table to this file")
    harness.int_options(p, images=64, size=64, batch=16, steps=32, window=16, rounds=3, budget_mb=512)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = harness.parse(p, images=4, size=32, batch=2, steps=4, window=16, rounds=1, budget_mb=64)
    a.device = torch.device(a.device)
    started = time.perf_counter()
    g = torch.Generator().manual_seed(1)
    data = [(torch.rand(3, a.size, a.size, generator=g), int(i % 10)) for i in range(a.images)]
    model = resnet(a)
    t = harness.Targets()
    compare(a, t, model, data, "integrated_gradients", {"steps": a.steps})
    w, s = [3, a.window, a.window], [3, a.window // 2, a.window // 2]
    compare(a, t, model, data, "occlusion", {"window": w, "strides": s})
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    head = harness.environment(time.perf_counter() - started, *harness.versions("torch", "captum"), f"device {a.device}",
                               f"load average {load}", threads=f"threads {torch.get_num_threads()}")
    print(harness.report("attribution.py", head, t.lines(), markdown=a.markdown, append=True))


if __name__ == "__main__":
    main()
