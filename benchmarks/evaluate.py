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
    python benchmarks/evaluate.py --threads 1            # one torch thread: steadier where other processes run
    python benchmarks/evaluate.py --quick                # a smoke run: a tiny model, 1 round
    python benchmarks/evaluate.py --markdown docs/benchmarks/evaluate.md   # also append the table there
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import harness
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
    p = harness.parser(__doc__)
    harness.int_options(p, layers=12, width=768, heads=12, vocab=50257, tokens=128, batch=4, batches=6, rounds=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's; 1 is steadier on a shared machine)")
    harness.quick_and_markdown(p, "a tiny model, 2 batches, 1 round: checks that everything runs", "append the results table to this file")
    a = harness.parse(p, layers=2, width=64, heads=4, vocab=259, tokens=32, batches=2, rounds=1)
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        timed = harness.paired_rounds(routes(a, Path(tmp), device), a.rounds, harness.seeded_shuffle(0))
    wall, cpu = timed.wall, timed.cpu
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{platform.machine()}, {torch.get_num_threads()} torch threads"
    lines = [
        "| comparison | wall clock (median of per-round ratios) | CPU time | bound | met (wall) | detail (medians, wall) |",
        "|---|---|---|---|---|---|",
    ]
    med = {k: statistics.median(v) for k, v in wall.items()}
    for label, num, den, bound in (("evaluate (ablation: zero) / plain forward", "evaluate", "forward", BOUND),
                                   ("evaluate / hookrun run without evaluate", "evaluate", "hookrun", None),
                                   ("hookrun run without evaluate / plain forward", "hookrun", "forward", None)):
        w, c = harness.ratio(wall, num, den), harness.ratio(cpu, num, den)
        met = ("yes" if w <= bound else "NO") if bound else "(info)"
        lines.append(f"| {label} | {w:.3f} | {c:.3f} | {f'<= {bound}' if bound else ''} | {met} | "
                     f"{med[num]:.3f} s / {med[den]:.3f} s |")
    head = (f"{where}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}, {time.time() - started:.0f} s; GPT-2 "
            f"{a.layers} layers x {a.width}, vocab {a.vocab}, {a.batches} batches of {a.batch} x {a.tokens} tokens, "
            f"{a.rounds} rounds (order shuffled each round); one modify_output hook on transformer.h.0")
    text = harness.report("evaluate.py", head, lines, markdown=a.markdown, append=True)
    print(text, end="")


if __name__ == "__main__":
    main()
