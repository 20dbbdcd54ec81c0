"""MIB's circuit-track scores of hookrun's edge rankings on the shipped task: `python benchmarks/mib_table.py`.

The shipped task is experiment=edges' (model=tiny_lm, word_swap n=8 of 24 tokens, logit difference at
the last position; 479 edges). Each way of scoring the edges ranks them, and hookrun's MIB evaluation
(`faithfulness: {fractions: mib}`, runner/kinds/patching/edges/mib.py) gives CPR (the area under the
faithfulness curve of the signed ranking's circuits) and CMD (the area between 1 and the curve of the
|score| ranking's), counterfactual ablation. The scorings:

- eap, eap_ig (m = --ig-steps): hookrun's edge scores.
- atp_ig node scores: each edge scored by its writer's AtP-IG score at the same m (a node's score is the
  sum of its outgoing EAP-IG edges; the script checks that against an atp_ig run on every block's
  attention and MLP output and prints the largest difference), so circuits grow node by node.
- exact: each edge's own effect, m_clean - m(clean run with that one edge ablated), every edge once
  (hookrun's faithfulness forward with every edge kept but one; 479 circuits packed along the batch).
- random: Gaussian scores (seed 0).

The last three go in as an EAP-IG graph JSON through `faithfulness.from` (edges/formats.py).

    python benchmarks/mib_table.py                 # the table in docs/edges.md
    python benchmarks/mib_table.py --quick         # a smoke run: 2 items of 12 tokens, m = 2
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import harness
import numpy as np

import hookrun
from hookrun.data.swaps import word_swap
from hookrun.models.tiny_lm import tiny_lm
from hookrun.runner.kinds.patching import notebook
from hookrun.runner.kinds.patching.edges.eap import writer_outputs
from hookrun.runner.kinds.patching.edges.formats import to_eap_ig
from hookrun.runner.kinds.patching.edges.run import ablated_metrics

METRIC = {"name": "logit_diff", "answer": "answer", "wrong": "wrong", "position": -1}
SITES = {"attn": {"at": "transformer.h.*.attn", "over": ["position"]}, "mlp": {"at": "transformer.h.*.mlp", "over": ["position"]}}
MIB = {"fractions": "mib"}


def exact_scores(model, items, **kw) -> np.ndarray:
    """[writers, readers]: m_clean - m(every edge kept but this one), the others' inputs rebuilt exactly; `kw`:
    patch_grid's (the metric by default METRIC)."""
    out: dict = {}
    real = notebook.compute

    def measure(engine, graph, wiring, *args, **kwargs):
        corrupt = writer_outputs(engine, wiring, engine.base_ids)  # the writers on the corrupted input
        edges = np.argwhere(graph.mask)
        keep = np.repeat(graph.mask[None], len(edges), axis=0)
        keep[np.arange(len(edges)), edges[:, 0], edges[:, 1]] = False
        values = ablated_metrics(engine, graph, wiring, keep, "corrupt", corrupt, chunk=64)
        scores = np.full(graph.mask.shape, np.nan)
        scores[edges[:, 0], edges[:, 1]] = engine.metric_clean - values
        out["scores"] = scores
        return real(engine, graph, wiring, *args, **kwargs)

    notebook.compute = measure
    try:
        hookrun.patch_grid(model, items, **{"method": "eap", "metric": METRIC, **kw})
    finally:
        notebook.compute = real
    return out["scores"]


def atp_ig_check(model, items, grid, m: int) -> float:
    """The largest |difference| between atp_ig's cells (every block's attention and MLP output, summed over
    positions) and the eap_ig node scores of the same writers (a block's heads summed)."""
    cells = hookrun.patch_grid(model, items, method="atp_ig", ig_steps=m, metric=METRIC, sites=SITES)
    layers, heads = model.config.n_layer, model.config.n_head
    base = cells["attn"].attrs["metric_corrupt"]
    node = np.asarray(grid.attrs["node_scores"])
    diffs = []
    for layer in range(layers):
        first = 1 + layer * (heads + 1)
        diffs.append(float(cells["attn"].values[layer].sum() - base * cells["attn"].shape[1]) - node[first: first + heads].sum())
        diffs.append(float(cells["mlp"].values[layer].sum() - base * cells["mlp"].shape[1]) - node[first + heads])
    return max(abs(d) for d in diffs)


def scored(model, items, grid, scores: np.ndarray, folder: Path, name: str) -> dict:
    """CPR and CMD of a [writers, readers] grid, read back through faithfulness.from (an EAP-IG graph JSON)."""
    cfg = {"n_layers": model.config.n_layer, "n_heads": model.config.n_head, "parallel_attn_mlp": False,
           "d_model": model.config.n_embd}
    path = folder / f"{name}.json"
    path.write_text(json.dumps(to_eap_ig(list(grid.writer.values), list(grid.reader.values), scores, cfg)))
    return hookrun.patch_grid(model, items, method="eap", metric=METRIC, faithfulness={**MIB, "from": str(path)})["edges"].attrs


def main() -> None:
    p = harness.parser(__doc__)
    harness.quick_and_markdown(p, "2 items of 12 tokens, m = 2: checks that everything runs", "write the table to this file too")
    harness.int_options(p, items=8, length=24, ig_steps=5)
    a = harness.parse(p, items=2, length=12, ig_steps=2)
    started = time.perf_counter()
    model, items = tiny_lm().eval(), word_swap(n=a.items, length=a.length)
    rows = ["| scores ranking the edges | CPR (higher is better) | CMD (lower is better) | seconds | load (1 min) |",
            "|---|---|---|---|---|"]

    def row(name: str, attrs: dict, t: float) -> None:
        rows.append(f"| {name} | {attrs['faithfulness_cpr']:.3f} | {attrs['faithfulness_cmd']:.3f} | "
                    f"{time.perf_counter() - t:.1f} | {os.getloadavg()[0]:.1f} |")
        harness.log(rows[-1])

    t = time.perf_counter()
    eap = hookrun.patch_grid(model, items, method="eap", metric=METRIC, faithfulness=MIB)["edges"]
    row("eap", eap.attrs, t)
    t = time.perf_counter()
    eap_ig = hookrun.patch_grid(model, items, method="eap_ig", ig_steps=a.ig_steps, metric=METRIC, faithfulness=MIB)["edges"]
    row(f"eap_ig (m = {a.ig_steps})", eap_ig.attrs, t)
    mask = np.isfinite(eap.values)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t = time.perf_counter()
        gap = atp_ig_check(model, items, eap_ig, a.ig_steps)
        nodes = np.where(mask, np.asarray(eap_ig.attrs["node_scores"])[:, None], np.nan)
        row(f"atp_ig node scores (m = {a.ig_steps}), each edge its writer's", scored(model, items, eap, nodes, folder, "atp_ig"), t)
        t = time.perf_counter()
        row("exact (each edge's own effect)", scored(model, items, eap, exact_scores(model, items), folder, "exact"), t)
        t = time.perf_counter()
        noise = np.where(mask, np.random.default_rng(0).standard_normal(mask.shape), np.nan)
        row("random (Gaussian, seed 0)", scored(model, items, eap, noise, folder, "random"), t)
    head = harness.environment(time.perf_counter() - started, *harness.versions("torch"),
                               f"{a.items} items of {a.length} tokens, tiny_lm, {int(mask.sum())} edges, MIB's ten fractions")
    note = (f"atp_ig's cells (every block's attention and MLP output, positions summed) differ from the eap_ig node "
            f"scores of the same writers by at most {gap:.2g} (metric_clean - metric_corrupt = "
            f"{eap.attrs['metric_clean'] - eap.attrs['metric_corrupt']:.3f}).")
    print(harness.report("mib_table.py", head, rows, note, markdown=a.markdown))


if __name__ == "__main__":
    main()
