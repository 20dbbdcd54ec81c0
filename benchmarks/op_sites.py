"""What op sites cost, measured side by side: `python benchmarks/op_sites.py`.

A GPT-2-shaped random-init model (6 layers, n_embd 256, 4 heads, eager attention, byte vocabulary
of 259, so the LM head is small), batches of 8 x 128 tokens of the text shipped with hookrun, every
route a whole `hookrun.run` (checks, the file written and closed, the same file settings), every
route computing the whole forward (no early stop):

| route | what it records |
|---|---|
| `A_sites` | the attention pattern of every layer through op sites: `transformer.h.*.attn/softmax` |
| `B_modules` | each attention module's output: `transformer.h.*.attn`, `output.0` (module hooks) |
| `C_bare` | nothing: no hooks, the same loop and file (no TorchFunctionMode is ever entered) |
| `D_weights` | the same bytes as A through module hooks: `transformer.h.*.attn`, `output.1` (GPT-2's eager attention returns its weights) |

The routes run in one process after a warm-up, round after round, each round in a shuffled order;
each ratio is the median of the per-round ratios (so a slow spell of the shared machine slows both
sides of a pair). Times are wall clock and the process's CPU time (all threads, the writer's too).

    python benchmarks/op_sites.py                           # the comparison (a few minutes on 2 cores)
    python benchmarks/op_sites.py --quick                   # a smoke run: 2 layers, 2 batches, 1 round
    python benchmarks/op_sites.py --markdown docs/benchmarks.md   # also append the table there
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import hookrun
from hookrun.data.text import SAMPLE
from hookrun.models import hf

BOUND = 1.15
RECORD = {"name": "record", "what": "output"}


def routes(a: argparse.Namespace, folder: Path) -> dict:
    torch.manual_seed(0)
    model = hf(config={"n_layer": a.layers, "n_head": 4, "n_embd": a.width, "n_positions": a.tokens, "vocab_size": 259,
                       "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}).eval()
    lines = [ln for ln in SAMPLE.read_text().splitlines() if ln.strip()]
    texts = folder / "texts.txt"
    texts.write_text("\n".join((lines * (a.batches * a.batch // len(lines) + 1))[: a.batches * a.batch]) + "\n")
    data = {"dataset": {"_target_": "hookrun.data.text", "files": str(texts), "max_length": a.tokens},
            "batch_size": a.batch, "store": []}
    hooks = {
        "A_sites": {"p": {"at": "transformer.h.*.attn/softmax", "type": "forward", "actions": [RECORD]}},
        "B_modules": {"o": {"at": "transformer.h.*.attn", "type": "forward", "actions": [{**RECORD, "what": "output.0"}]}},
        "C_bare": None,
        "D_weights": {"w": {"at": "transformer.h.*.attn", "type": "forward", "actions": [{**RECORD, "what": "output.1"}]}},
    }

    def route(name: str):
        def go() -> int:
            path = folder / f"{name}.h5"
            hookrun.run({"hooks": hooks[name], "data": data, "device": "cpu", "progress": False,
                         "output": {"path": str(path), "overwrite": True}}, model=model)
            return path.stat().st_size
        return go

    return {name: route(name) for name in hooks}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steadier on a shared machine)")
    p.add_argument("--quick", action="store_true", help="2 layers, 2 batches, 1 round: checks that every route runs")
    p.add_argument("--markdown", type=Path, help="append the results table to this file")
    a = p.parse_args()
    if a.quick:
        a.layers, a.width, a.tokens, a.batches, a.rounds = 2, 64, 32, 2, 1
    torch.set_num_threads(a.threads)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        run = routes(a, Path(tmp))
        sizes = {name: fn() for name, fn in run.items()}  # warm-up: imports, allocator, the first file
        wall: dict[str, list[float]] = {name: [] for name in run}
        cpu: dict[str, list[float]] = {name: [] for name in run}
        order = list(run)
        for r in range(a.rounds):
            random.Random(r).shuffle(order)
            for name in order:
                t0, c0 = time.perf_counter(), time.process_time()
                run[name]()
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
                log(f"  round {r + 1}/{a.rounds} {name:10s} {wall[name][-1]:7.3f} s wall {cpu[name][-1]:7.3f} s cpu")
    extra, bare = per_call_cost(5 if a.quick else 50)
    text = table(a, wall, cpu, sizes, time.time() - started)
    text += (f"\nInterception: {extra:.2f} µs more a torch call made inside a hooked module's forward that fires "
             f"nothing (the bare call: {bare:.2f} µs); min of {5 if a.quick else 50} interleaved forwards of 1000 calls.\n")
    print(text)
    if a.markdown:
        with a.markdown.open("a") as f:
            f.write("\n" + text)


class ManyCalls(torch.nn.Module):
    """A forward of 1000 small torch calls (500 adds, 500 shape reads) and one softmax."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(500):
            x = x + 1
            _ = x.shape
        return x.softmax(-1)


def per_call_cost(reps: int) -> tuple[float, float]:
    """(µs a torch call costs inside a hooked module when it fires nothing, µs of the bare call):
    a site on the softmax only, so the other 1000 calls pass through the mode; min of interleaved reps."""
    model, x = ManyCalls(), torch.randn(4, 4)
    hooks = {"p": {"at": "/softmax", "type": "forward", "actions": []}}
    bare, hooked = [], []
    with torch.no_grad():
        for _ in range(reps):
            t0 = time.perf_counter()
            model(x)
            bare.append(time.perf_counter() - t0)
            with hookrun.capture(model, hooks):
                t0 = time.perf_counter()
                model(x)
                hooked.append(time.perf_counter() - t0)
    return (min(hooked) - min(bare)) * 1e6 / 1000, min(bare) * 1e6 / 1000


def ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    """The median of the per-round ratios num/den."""
    return statistics.median(x / y for x, y in zip(times[num], times[den], strict=True))


def table(a: argparse.Namespace, wall: dict, cpu: dict, sizes: dict, seconds: float) -> str:
    med = {k: statistics.median(v) for k, v in wall.items()}
    rows = [("A / B: attention patterns via op sites / attention outputs via module hooks", "A_sites", "B_modules", BOUND),
            ("A / D: the same bytes via op sites / via the module's output.1", "A_sites", "D_weights", None),
            ("B / C: module hooks / no hooks", "B_modules", "C_bare", None),
            ("A / C: op sites / no hooks", "A_sites", "C_bare", None)]
    lines = [
        f"`python benchmarks/op_sites.py {' '.join(sys.argv[1:])}`".replace(" `", "`"),
        "",
        f"{platform.machine()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch thread(s), torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d')}, {seconds:.0f} s; GPT-2 {a.layers} layers x {a.width}, 4 heads, eager, vocab 259, "
        f"{a.batches} batches of {a.batch} x {a.tokens} tokens, {a.rounds} rounds in shuffled order, the whole forward in "
        f"every route; files: "
        + ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in sizes.items()),
        "",
        "| comparison | wall clock | CPU time | bound | met (wall) | medians (wall) |",
        "|---|---|---|---|---|---|",
    ]
    for label, num, den, bound in rows:
        w, c = ratio(wall, num, den), ratio(cpu, num, den)
        met = ("yes" if w <= bound else "NO") if bound else "(info)"
        lines.append(f"| {label} | {w:.3f} | {c:.3f} | {f'<= {bound:.2f}' if bound else '(info)'} | {met} | "
                     f"{med[num]:.2f} s / {med[den]:.2f} s |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
