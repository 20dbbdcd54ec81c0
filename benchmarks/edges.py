"""How well estimates rank cells, against the exact grid: `python benchmarks/edges.py`.

On the shipped task (experiment=patching_grid: word_swap on model=tiny_lm, metric logit_diff at the
last position) and a second one (the same windows, metric the answer's log-probability), the exact
grid of the attention and MLP outputs of every block at every position is the reference. Each
estimate ranks the same cells: atp, atp_ig with m = 5 and 20 (the same sites), and the node scores
of eap and eap_ig (m = 5) at each position (a block's heads summed for its attention, its MLP
writer for its MLP). Reported: the Spearman correlation of each with the exact grid's effects
(value - metric_corrupt) at the positions from the first corrupted token on (those before it are 0
for every method) and the overlap of their top-10 cells by |effect|, with the time of each
and the machine's load average beside it.

    python benchmarks/edges.py              # n=8 items of 24 tokens
    python benchmarks/edges.py --quick      # a smoke run: 4 items of 12 tokens
    python benchmarks/edges.py --markdown docs/benchmarks/patching.md

--memory: peak memory of an edges run against its `patching.memory` (runner/kinds/patching/edges/bounded.py)
on a random HF GPT-2-shaped model (--layers 24 --d-model 1024 --heads 16 by default; --quick: 2 layers,
d_model 64). Each run is a child process of its own: EAP-IG (--ig-steps) with every reader's gradient
held (memory 64GiB, all copies in one backward), then at the smallest budget at which that route runs
one copy a backward, then at the smallest budget the run accepts (found from its refusals in a probing
child), each reader group's gradient folded into the grid as it comes, one copy a backward.
On the CPU the peak is the child's VmHWM above its VmRSS once the model and items are built and a
4-token run has warmed hookrun up (the peak
reset through /proc/self/clear_refs, glibc's large allocations mmapped so a free returns them); on
CUDA (--device cuda) torch's peak allocated above what was allocated before the run. The bounded
grid's largest difference from the unbounded one is beside it.

    python benchmarks/edges.py --memory --layers 8 --items 2 --length 12
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import harness
import numpy as np
from scipy.stats import spearmanr

import hookrun
from hookrun.data.swaps import word_swap
from hookrun.models.tiny_lm import tiny_lm

SITES = {"attn": {"at": "transformer.h.*.attn", "over": ["position"]}, "mlp": {"at": "transformer.h.*.mlp", "over": ["position"]}}
TASKS = {"logit_diff": {"name": "logit_diff"}, "logprob": {"name": "logprob"}}


def cells(grids: dict, base: float, first: int) -> np.ndarray:
    """[site, layer, position >= first] effects, flattened (the positions before the first corrupted token
    change nothing in a causal model: every method gives them 0, and their ties would inflate Spearman's rho)."""
    return np.concatenate([grids["attn"].values[:, first:].reshape(-1), grids["mlp"].values[:, first:].reshape(-1)]) - base


def node_cells(grid, layers: int, heads: int, first: int) -> np.ndarray:
    by_pos = np.asarray(grid.attrs["node_scores_by_position"])[:, first:]  # [writers, positions]
    attn = [by_pos[1 + layer * (heads + 1): 1 + layer * (heads + 1) + heads].sum(0) for layer in range(layers)]
    mlp = [by_pos[1 + layer * (heads + 1) + heads] for layer in range(layers)]
    return np.concatenate([np.concatenate(attn), np.concatenate(mlp)])


def top_overlap(a: np.ndarray, b: np.ndarray, k: int = 10) -> int:
    return len(set(np.argsort(-np.abs(a))[:k]) & set(np.argsort(-np.abs(b))[:k]))


def memory_model(a):
    """The random GPT-2-shaped model and its items (a swapped token mid-prompt; logit difference of the two)."""
    import torch
    import transformers as tr

    torch.manual_seed(0)
    cfg = tr.GPT2Config(vocab_size=a.vocab, n_positions=max(32, a.length), n_embd=a.d_model, n_layer=a.layers,
                        n_head=a.heads)
    model = tr.GPT2LMHeadModel(cfg).eval()
    g = torch.Generator().manual_seed(1)
    items = []
    for _ in range(a.items):
        c = torch.randint(0, a.vocab, (a.length,), generator=g)
        k = c.clone()
        k[a.length // 2] = (k[a.length // 2] + 7) % a.vocab
        items.append({"input_ids": c, "corrupt": k, "answer": int(c[a.length // 2]), "wrong": int(k[a.length // 2])})
    return model.to(a.device), items


def status(key: str) -> int:
    text = open("/proc/self/status").read()
    return int(re.search(rf"^{key}:\s+(\d+) kB", text, re.M).group(1)) * 1024


def memory_child(a) -> None:
    """One edges run (a.budget: bytes, 0 for the smallest the run accepts, found from its refusals); its peak as JSON."""
    import numpy as np
    import torch

    from hookrun.errors import ConfigError

    model, items = memory_model(a)
    kw = {"clean": "input_ids", "method": "eap_ig", "ig_steps": a.ig_steps}
    if a.budget == 0:
        memory = 1
        for _ in range(2):  # below one reader group (before any forward), then below one copy's forward and backward
            try:
                hookrun.patch_grid(model, items, memory=memory, **kw)
            except ConfigError as exc:
                memory = int(re.search(r"give at least (\d+) bytes", str(exc)).group(1))
        from hookrun.runner.kinds.patching.edges.bounded import EdgeBytes
        from hookrun.runner.kinds.patching.edges.graph import find_graph

        sizes = EdgeBytes.of(model, find_graph(model)[1], find_graph(model)[0], items[0]["input_ids"].expand(len(items), -1))
        # the fast route at one copy a backward: every reader's zeros and gradient, and their sum over the copies,
        # where the bounded route has the writers' differences
        print(json.dumps({"budget": memory, "fast": memory - sizes.deltas + 3 * sizes.grads}))
        return
    warm = [{**it, "input_ids": it["input_ids"][:4], "corrupt": it["corrupt"][:4]} for it in items[:1]]
    hookrun.patch_grid(model, warm, memory=64 << 30, **kw)  # hookrun's imports and first-run state, outside the peak
    cuda = a.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        before = status("VmRSS")
    t = time.perf_counter()
    grid = hookrun.patch_grid(model, items, memory=a.budget, **kw)["edges"]
    seconds = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated() - before if cuda else status("VmHWM") - before
    np.save(a.out, grid.values)
    print(json.dumps({"peak": peak, "seconds": seconds, "load": os.getloadavg()[0]}))


def memory_main(a) -> None:
    import numpy as np

    started = time.perf_counter()
    env = harness.child_env(MALLOC_MMAP_THRESHOLD_="131072", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    args = [sys.executable, __file__, "--memory-child", "--layers", str(a.layers), "--d-model", str(a.d_model),
            "--heads", str(a.heads), "--vocab", str(a.vocab), "--items", str(a.items), "--length", str(a.length),
            "--ig-steps", str(a.ig_steps), "--device", a.device]
    probe = harness.run_child([*args, "--budget", "0"], "the probing run", env)[0]
    rows = ["| run | budget (MiB) | peak above the built model (MiB) | within | seconds | load (1 min) | max abs diff |",
            "|---|---|---|---|---|---|---|"]
    grids = {}
    for name, budget in (("every reader's gradient held", 64 << 30), ("fast route, one copy a backward", probe["fast"]),
                         ("bounded, smallest budget", probe["budget"])):
        out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"edges_memory_{os.getpid()}_{budget}.npy")
        r = harness.run_child([*args, "--budget", str(budget), "--out", out], name, env)[0]
        grids[name] = np.load(out)
        os.remove(out)
        diff = np.nanmax(np.abs(grids[name] - grids["every reader's gradient held"]))
        within = "yes" if r["peak"] <= budget else "NO"
        rows.append(f"| {name} | {budget / (1 << 20):.1f} | {r['peak'] / (1 << 20):.1f} | {within} | {r['seconds']:.2f} | "
                    f"{r['load']:.1f} | {diff:.2e} |")
        harness.log(rows[-1])
    scale = np.nanmax(np.abs(grids["every reader's gradient held"]))
    head = harness.environment(time.perf_counter() - started, *harness.versions("torch"),
                               f"random GPT-2 ({a.layers} layers, d_model {a.d_model}, {a.heads} heads), {a.items} items "
                               f"of {a.length} tokens, eap_ig m={a.ig_steps}, {a.device}, scores up to {scale:.3g}")
    print(harness.report("edges.py", head, rows, markdown=a.markdown, append=True))


def main() -> None:
    p = harness.parser(__doc__)
    harness.quick_and_markdown(p, "4 items of 12 tokens: checks that everything runs", "append the table to this file")
    harness.int_options(p, items=8, length=24, layers=24, d_model=1024, heads=16, vocab=512, ig_steps=5, budget=0)
    p.add_argument("--memory", action="store_true", help="peak memory against patching.memory (see above)")
    p.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="")
    a = harness.parse(p, items=4, length=12, layers=2, d_model=64, heads=4, vocab=64, ig_steps=3)
    if a.memory_child:
        return memory_child(a)
    if a.memory:
        return memory_main(a)
    started = time.perf_counter()
    model, items = tiny_lm().eval(), word_swap(n=a.items, length=a.length)
    layers, heads = model.config.n_layer, model.config.n_head
    first = min(int((items[i]["clean"] != items[i]["corrupt"]).nonzero()[0]) for i in range(len(items)))
    rows = ["| task | method | Spearman vs exact | top-10 overlap | seconds | load (1 min) |", "|---|---|---|---|---|---|"]
    for task, metric in TASKS.items():
        t = time.perf_counter()
        exact = hookrun.patch_grid(model, items, metric=metric, sites=SITES)
        exact_s = time.perf_counter() - t
        base = exact["attn"].attrs["metric_corrupt"]
        ref = cells(exact, base, first)
        rows.append(f"| {task} | exact ({ref.size} cells) | 1 | 10 | {exact_s:.2f} | {os.getloadavg()[0]:.1f} |")
        runs = {"atp": {"method": "atp"}, "atp_ig m=5": {"method": "atp_ig", "ig_steps": 5},
                "atp_ig m=20": {"method": "atp_ig", "ig_steps": 20}, "eap (node sums)": {"method": "eap"},
                "eap_ig m=5 (node sums)": {"method": "eap_ig", "ig_steps": 5}}
        for name, block in runs.items():
            t = time.perf_counter()
            if block["method"].startswith("eap"):
                est = node_cells(hookrun.patch_grid(model, items, metric=metric, **block)["edges"], layers, heads, first)
            else:
                est = cells(hookrun.patch_grid(model, items, metric=metric, sites=SITES, **block), base, first)
            s = time.perf_counter() - t
            rho = spearmanr(ref, est).statistic
            rows.append(f"| {task} | {name} | {rho:.3f} | {top_overlap(ref, est)} | {s:.2f} | {os.getloadavg()[0]:.1f} |")
            harness.log(f"{task} {name}: spearman {rho:.3f}")
    head = harness.environment(time.perf_counter() - started, *harness.versions("torch"),
                               f"{a.items} items of {a.length} tokens, tiny_lm ({layers} layers, {heads} heads), cells at "
                               f"positions {first}..{a.length - 1} (from the first corrupted token)")
    print(harness.report("edges.py", head, rows, markdown=a.markdown, append=True))


if __name__ == "__main__":
    main()
