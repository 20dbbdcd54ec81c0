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
"""

from __future__ import annotations

import os
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


def main() -> None:
    p = harness.parser(__doc__)
    harness.quick_and_markdown(p, "4 items of 12 tokens: checks that everything runs", "append the table to this file")
    harness.int_options(p, items=8, length=24)
    a = harness.parse(p, items=4, length=12)
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
