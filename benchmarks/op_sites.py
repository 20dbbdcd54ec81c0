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
    python benchmarks/op_sites.py --markdown docs/benchmarks/op-sites.md   # also append the table there
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import harness
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
    p = harness.parser(__doc__)
    harness.int_options(p, layers=6, width=256, tokens=128, batch=8, batches=8, rounds=9)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steadier on a shared machine)")
    harness.quick_and_markdown(p, "2 layers, 2 batches, 1 round: checks that every route runs", "append the results table to this file")
    a = harness.parse(p, layers=2, width=64, tokens=32, batches=2, rounds=1)
    torch.set_num_threads(a.threads)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        timed = harness.paired_rounds(routes(a, Path(tmp)), a.rounds, harness.per_round_shuffle)  # the warm-up's sizes
    extra, bare = per_call_cost(5 if a.quick else 50)
    head, lines = table(a, timed.wall, timed.cpu, timed.first, time.time() - started)
    interception = (f"Interception: {extra:.2f} µs more a torch call made inside a hooked module's forward that fires "
                    f"nothing (the bare call: {bare:.2f} µs); min of {5 if a.quick else 50} interleaved forwards of 1000 calls.")
    print(harness.report("op_sites.py", head, lines, interception, markdown=a.markdown, append=True))


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


def table(a: argparse.Namespace, wall: dict, cpu: dict, sizes: dict, seconds: float) -> tuple[str, list[str]]:
    """The line under the command (machine, sizes, files) and the table's lines."""
    med = {k: statistics.median(v) for k, v in wall.items()}
    rows = [("A / B: attention patterns via op sites / attention outputs via module hooks", "A_sites", "B_modules", BOUND),
            ("A / D: the same bytes via op sites / via the module's output.1", "A_sites", "D_weights", None),
            ("B / C: module hooks / no hooks", "B_modules", "C_bare", None),
            ("A / C: op sites / no hooks", "A_sites", "C_bare", None)]
    head = (f"{platform.machine()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch thread(s), torch {torch.__version__}, "
            f"{time.strftime('%Y-%m-%d')}, {seconds:.0f} s; GPT-2 {a.layers} layers x {a.width}, 4 heads, eager, vocab 259, "
            f"{a.batches} batches of {a.batch} x {a.tokens} tokens, {a.rounds} rounds in shuffled order, the whole forward in "
            f"every route; files: " + ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in sizes.items()))
    lines = ["| comparison | wall clock | CPU time | bound | met (wall) | medians (wall) |", "|---|---|---|---|---|---|"]
    for label, num, den, bound in rows:
        w, c = harness.ratio(wall, num, den), harness.ratio(cpu, num, den)
        met = ("yes" if w <= bound else "NO") if bound else "(info)"
        lines.append(f"| {label} | {w:.3f} | {c:.3f} | {f'<= {bound:.2f}' if bound else '(info)'} | {met} | "
                     f"{med[num]:.2f} s / {med[den]:.2f} s |")
    return head, lines


if __name__ == "__main__":
    main()
