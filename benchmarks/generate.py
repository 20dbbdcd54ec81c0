"""mode=generate's cost, measured side by side: `python benchmarks/generate.py`.

The same prompts (the text sample shipped with hookrun, repeated), the same random-init GPT-2
and the same greedy `generate` arguments through four routes, interleaved round after round in
one process, each ratio taken between medians. Each route is timed by the wall clock and by the
process's CPU time (every thread, the writer's too): on a shared machine the wall clock swings
with the other processes' load, the CPU time much less. hookrun's routes are whole runs:
config checks, the preflight call of `generate`, the file written and closed.

| route | what it is |
|---|---|
| `bare` | `model.generate(**batch, ...)` for every batch of the same DataLoader batches, nothing else |
| `raw_steer` | the same with a raw `register_forward_hook` adding a vector to one block's output |
| `hookrun_steer` | `hookrun.run(mode=generate)` with that steering hook alone (writes ids and text) |
| `hookrun_record` | `hookrun.run(mode=generate)` recording the residual stream after every block at every token, prompt and generated (`rows: token`), into the HDF5 file |

    python benchmarks/generate.py                          # the full comparison (a few minutes on 2 cores)
    python benchmarks/generate.py --quick                  # a smoke run: a tiny model, 1 round
    python benchmarks/generate.py --markdown docs/benchmarks/generate.md   # also append the table there
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import h5py
import harness
import torch
from torch.utils.data import DataLoader, default_collate

import hookrun
from hookrun.data.text import SAMPLE, text
from hookrun.models import hf

BOUND = 1.10


def routes(args: argparse.Namespace, folder: Path) -> dict:
    """The model, the prompts and the four routes, each a function that runs once."""
    torch.manual_seed(0)
    model = hf(config={"n_layer": args.layers, "n_head": 4, "n_embd": args.width, "n_positions": 256, "vocab_size": 259,
                       "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}).eval()
    prompts = folder / "prompts.txt"
    lines = [ln for ln in SAMPLE.read_text().splitlines() if ln.strip()]
    prompts.write_text("\n".join(lines * args.repeat) + "\n")
    data = {"_target_": "hookrun.data.text", "files": str(prompts), "max_length": args.prompt, "padding_side": "left"}
    dataset = text(files=str(prompts), max_length=args.prompt, padding_side="left")
    gen = {"max_new_tokens": args.new, "min_new_tokens": args.new, "do_sample": False, "pad_token_id": 0}  # all tokens
    vector = torch.randn(args.width, generator=torch.Generator().manual_seed(1))
    vector = (vector / vector.norm()).tolist()
    steer = {"steer": {"at": "transformer.h.0", "type": "forward",
                       "actions": [{"name": "modify_output", "op": "add", "value": vector, "dim": -1, "factor": 4.0}]}}
    record = {"resid": {"at": "transformer.h.*", "type": "forward",
                        "actions": [{"name": "record", "what": "output", "rows": "token"}]}}
    batches = list(DataLoader(dataset, batch_size=args.batch, collate_fn=default_collate))

    def bare() -> None:
        with torch.no_grad():
            for batch in batches:
                model.generate(**batch, **gen)

    def raw_steer() -> None:
        v = torch.tensor(vector) * 4.0
        handle = model.transformer.h[0].register_forward_hook(lambda m, a, o: o + v)
        try:
            bare()
        finally:
            handle.remove()

    def through_hookrun(hooks: dict, name: str):
        def go() -> None:
            cfg = {"mode": "generate", "generate": gen, "device": "cpu", "progress": False, "hooks": hooks,
                   "data": {"dataset": data, "batch_size": args.batch},
                   "output": {"path": str(folder / f"{name}.h5"), "overwrite": True}}
            hookrun.run(cfg, model=model)
        return go

    return {"bare": bare, "raw_steer": raw_steer, "hookrun_steer": through_hookrun(steer, "steer"),
            "hookrun_record": through_hookrun(record, "record")}, len(dataset)


def main() -> None:
    p = harness.parser(__doc__)
    harness.int_options(p, layers=8, width=512, batch=8)
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens (max_length; shorter lines are left-padded)")
    p.add_argument("--new", type=int, default=32, help="max_new_tokens")
    p.add_argument("--repeat", type=int, default=8, help="times the 12 sample lines are repeated")
    p.add_argument("--rounds", type=int, default=5)
    harness.quick_and_markdown(p, "a tiny model, 1 round: checks that everything runs", "append the results table to this file")
    a = harness.parse(p, layers=2, width=64, new=4, repeat=1, rounds=1)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        run, n = routes(a, Path(tmp))
        timed = harness.paired_rounds(run, a.rounds)  # in the order of `run`, every round
        times, cpu = timed.wall, timed.cpu
        with h5py.File(Path(tmp) / "record.h5", "r") as f:
            rows = f["samples/token_sample"].shape[0]
            size = (Path(tmp) / "record.h5").stat().st_size
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    lines = [
        f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d')}, {time.time() - started:.0f} s; GPT-2 {a.layers} layers x {a.width}, vocab 259, "
        f"{n} prompts of {a.prompt} tokens (left-padded) in batches of {a.batch}, {a.new} new tokens (greedy), "
        f"{a.rounds} rounds; record: {rows} token rows x {a.layers} blocks, {size / 1e6:.1f} MB",
        "",
        "| comparison | CPU time | wall clock | bound | met (CPU) | detail (CPU; wall) |",
        "|---|---|---|---|---|---|",
    ]
    for label, num, den in (("hookrun record every block, every token / bare generate", "hookrun_record", "bare"),
                            ("hookrun steering hook alone / bare generate", "hookrun_steer", "bare"),
                            ("hookrun steering hook / raw steering hook", "hookrun_steer", "raw_steer")):
        ratio, wall = med_cpu[num] / med_cpu[den], med[num] / med[den]
        lines.append(f"| {label} | {ratio:.3f} | {wall:.3f} | <= {BOUND:.2f} | {'yes' if ratio <= BOUND else 'NO'} | "
                     f"{med_cpu[num]:.2f} s / {med_cpu[den]:.2f} s; {med[num]:.2f} s / {med[den]:.2f} s |")
    table = "\n".join(lines)
    print(table)
    harness.save(table, a.markdown, append=True)


if __name__ == "__main__":
    main()
