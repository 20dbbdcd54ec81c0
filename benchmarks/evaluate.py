"""evaluate's cost, measured side by side: `python benchmarks/evaluate.py`.

A model of GPT-2 small's shape (12 layers x 768, 12 heads, vocabulary 50257; random init) and the same batches of
random tokens through three routes, in paired rounds whose order is shuffled each round (seeded);
each ratio is the median over rounds of that round's ratio, so a machine whose load drifts between
rounds moves both sides of a ratio together. hookrun's routes are whole runs: config checks, the
file written and closed.

| route | what it is |
|---|---|
| `forward` | `model(**batch)` under `no_grad` for every batch, nothing else |
| `hookrun` | `hookrun.run` with one `modify_output` hook (block 0's output scaled by 0.5) |
| `evaluate` | the same with `evaluate: {ablation: zero}`: per batch the clean, intervened and ablated forwards and their metrics (ce, KL over the vocabulary, scores), written to /evaluation |

The issue's target: `evaluate / forward <= 3.2` (three forwards, and the metrics cost little).

    python benchmarks/evaluate.py                        # the full comparison (a few minutes on 2 cores)
    python benchmarks/evaluate.py --quick                # a smoke run: a tiny model, 1 round
    python benchmarks/evaluate.py --markdown docs/benchmarks.md   # also append the table there
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

import hookrun
from hookrun.models import hf

BOUND = 3.2


class RandomTokens(Dataset):
    """`n` rows of `length` random token ids (every token real), fixed per index."""

    def __init__(self, n: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(3, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i])}


def routes(a: argparse.Namespace, folder: Path, device: torch.device) -> dict:
    torch.manual_seed(0)
    model = hf(config={"n_layer": a.layers, "n_head": a.heads, "n_embd": a.width, "n_positions": a.tokens,
                       "vocab_size": a.vocab}).eval().to(device)
    data = RandomTokens(a.batches * a.batch, a.tokens, a.vocab)
    batches = [{k: v.to(device) for k, v in b.items()} for b in DataLoader(data, batch_size=a.batch)]
    hooks = {"scale": {"at": "transformer.h.0", "type": "forward",
                       "actions": [{"name": "modify_output", "op": "scale", "factor": 0.5}]}}

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def forward() -> None:
        with torch.no_grad():
            for b in batches:
                model(**b)
        sync()

    def through_hookrun(evaluate: dict | None, name: str):
        def go() -> None:
            cfg = {"device": str(device), "progress": False, "hooks": hooks, "evaluate": evaluate,
                   "loss": {"_target_": "hookrun.runner.losses.lm", "_partial_": True},
                   "data": {"batch_size": a.batch}, "output": {"path": str(folder / f"{name}.h5"), "overwrite": True}}
            hookrun.run(cfg, model=model, dataset=data)
            sync()
        return go

    return {"forward": forward, "hookrun": through_hookrun(None, "plain"),
            "evaluate": through_hookrun({"ablation": "zero"}, "evaluate")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="a tiny model, 2 batches, 1 round: checks that everything runs")
    p.add_argument("--markdown", type=Path, help="append the results table to this file")
    a = p.parse_args()
    if a.quick:
        a.layers, a.width, a.heads, a.vocab, a.tokens, a.batches, a.rounds = 2, 64, 4, 259, 32, 2, 1
    device = torch.device(a.device)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        run = routes(a, Path(tmp), device)
        for fn in run.values():  # warm-up: imports, allocator, kernels, the first file
            fn()
        wall: dict[str, list[float]] = {name: [] for name in run}
        cpu: dict[str, list[float]] = {name: [] for name in run}
        order = list(run)
        shuffle = random.Random(0).shuffle
        for r in range(a.rounds):
            shuffle(order)
            for name in order:
                t0, c0 = time.perf_counter(), time.process_time()
                run[name]()
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
                print(f"  round {r + 1}/{a.rounds} {name:9s} {wall[name][-1]:7.3f} s wall {cpu[name][-1]:7.3f} s cpu",
                      file=sys.stderr, flush=True)

    def ratio(times: dict, num: str, den: str) -> float:
        return statistics.median(n / d for n, d in zip(times[num], times[den], strict=True))

    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{platform.machine()}, {torch.get_num_threads()} torch threads"
    cmd = "python benchmarks/evaluate.py " + " ".join(sys.argv[1:])
    lines = [
        f"`{cmd.strip()}`", "",
        f"{where}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}, {time.time() - started:.0f} s; GPT-2 "
        f"{a.layers} layers x {a.width}, vocab {a.vocab}, {a.batches} batches of {a.batch} x {a.tokens} tokens, "
        f"{a.rounds} rounds (order shuffled each round); one modify_output hook on transformer.h.0",
        "",
        "| comparison | wall clock (median of per-round ratios) | CPU time | bound | met (wall) | detail (medians, wall) |",
        "|---|---|---|---|---|---|",
    ]
    med = {k: statistics.median(v) for k, v in wall.items()}
    for label, num, den, bound in (("evaluate (ablation: zero) / plain forward", "evaluate", "forward", BOUND),
                                   ("evaluate / hookrun run without evaluate", "evaluate", "hookrun", None),
                                   ("hookrun run without evaluate / plain forward", "hookrun", "forward", None)):
        w, c = ratio(wall, num, den), ratio(cpu, num, den)
        met = ("yes" if w <= bound else "NO") if bound else "(info)"
        lines.append(f"| {label} | {w:.3f} | {c:.3f} | {f'<= {bound}' if bound else ''} | {met} | "
                     f"{med[num]:.3f} s / {med[den]:.3f} s |")
    table = "\n".join(lines)
    print(table)
    if a.markdown:
        with a.markdown.open("a") as f:
            f.write("\n" + table + "\n")


if __name__ == "__main__":
    main()
