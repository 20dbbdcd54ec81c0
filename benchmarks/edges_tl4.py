"""hookrun's EAP edges against TransformerLens 4.3's `attribution_patch(granularity="edge")`: time, same values.

    python benchmarks/edges_tl4.py                          # the shipped task: tiny_lm, word_swap n=8 of 24 tokens
    python benchmarks/edges_tl4.py --quick                  # a smoke run: 2 items of 12 tokens, 1 round
    python benchmarks/edges_tl4.py --tl4 /opt/tl4/bin/python --markdown docs/benchmarks/patching.md

TransformerLens 4.3 lives in a venv of its own (tests/envs/make_tl4.sh; `--tl4`, default $HOOKRUN_TL4_PYTHON
or /opt/tl4/bin/python). The shipped task's model (model=tiny_lm, a random-init HF GPT-2 of 4 layers, 4
heads, d_model 128) is saved with a word-level tokenizer of its vocabulary; this script, run by that venv's
python with --worker, boots a TransformerBridge of it, warms `attribution_patch` up on two pairs (its first
calls are slow) and times it on every pair (one forward and backward per pair, as it runs). hookrun's
`patch_grid(method="eap")` is timed here on the same items, after a warm-up run. Every item gets the first
item's answer and wrong tokens, so both compute the same logit difference at the last position, and the
table says how far TransformerLens' edges (summed over positions) are from hookrun's grid. Medians of
--rounds rounds each; the load average beside them (a figure at a load above 2.5 is a rehearsal).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

METRIC = {"name": "logit_diff", "answer": "answer", "wrong": "wrong", "position": -1}


def worker(folder: str, spec_path: str, out: str, rounds: int) -> None:
    """In the TransformerLens 4.3 venv: time attribution_patch on the saved model; write times and its grid."""
    import numpy as np
    import torch
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.tools.analysis.attribution_patching import (
        EdgeAttributionConfig,
        attribution_patch,
    )
    from transformers import AutoTokenizer, GPT2LMHeadModel

    torch.set_grad_enabled(True)
    spec = json.load(open(spec_path))
    hf = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    bridge = TransformerBridge.boot_transformers("gpt2", hf_model=hf, tokenizer=AutoTokenizer.from_pretrained(folder))
    bridge.eval()
    clean, corrupt, a, b = torch.tensor(spec["clean"]), torch.tensor(spec["corrupt"]), spec["answer"], spec["wrong"]
    cfg = EdgeAttributionConfig(granularity="edge")

    def metric_fn(logits):
        return logits[0, -1, a] - logits[0, -1, b]

    attribution_patch(bridge, clean[:2], corrupt[:2], metric_fn, cfg)  # warm-up
    times, res = [], None
    for _ in range(rounds):
        t = time.perf_counter()
        res = attribution_patch(bridge, clean, corrupt, metric_fn, cfg)
        times.append(time.perf_counter() - t)
    index = {name: i for i, name in enumerate(spec["writers"])}, {name: i for i, name in enumerate(spec["readers"])}
    grid = np.zeros((len(spec["writers"]), len(spec["readers"])))
    for (w, r), s in res.edge_scores.items():
        grid[index[0][_label(w)], index[1][_label(r)]] += s
    json.dump({"times": times, "load": os.getloadavg()[0], "grid": grid.tolist(), "n_edges": len(res.edge_scores)}, open(out, "w"))


def _label(node) -> str:
    """hookrun's name of a TransformerLens 4.3 node."""
    if node.kind == "embed" or node.kind == "logits":
        return node.kind
    if node.kind in ("mlp_out", "mlp_in"):
        return f"L{node.layer}.MLP"
    return f"L{node.layer}.H{node.head}" + ("" if node.kind == "attn_head_out" else f".{node.kind[0]}")


def main() -> None:
    import subprocess
    import tempfile
    from pathlib import Path

    import harness
    import numpy as np
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    import hookrun
    from hookrun.data.swaps import word_swap
    from hookrun.models.tiny_lm import tiny_lm

    p = harness.parser(__doc__)
    harness.quick_and_markdown(p, "2 items of 12 tokens, 1 round: checks that everything runs", "append the table to this file")
    harness.int_options(p, items=8, length=24, rounds=3)
    p.add_argument("--tl4", default=os.environ.get("HOOKRUN_TL4_PYTHON", "/opt/tl4/bin/python"))
    a = harness.parse(p, items=2, length=12, rounds=1)
    started = time.perf_counter()
    model, items = tiny_lm().eval(), [dict(it) for it in word_swap(n=a.items, length=a.length)]
    for it in items:  # one answer pair for every item: TransformerLens' metric_fn sees one pair's logits, not its index
        it["answer"], it["wrong"] = items[0]["answer"], items[0]["wrong"]
    hookrun.patch_grid(model, items[:2], method="eap", metric=METRIC)  # warm-up
    times, loads, grid = [], [], None
    for _ in range(a.rounds):
        t = time.perf_counter()
        grid = hookrun.patch_grid(model, items, method="eap", metric=METRIC)["edges"]
        times.append(time.perf_counter() - t)
        loads.append(os.getloadavg()[0])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        words = [f"t{i}" for i in range(model.config.vocab_size - 1)] + ["<|endoftext|>"]
        tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="t0"))
        tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="t0", eos_token="<|endoftext|>").save_pretrained(folder)
        model.save_pretrained(folder)
        spec = {"clean": [it["clean"].tolist() for it in items], "corrupt": [it["corrupt"].tolist() for it in items],
                "answer": int(items[0]["answer"]), "wrong": int(items[0]["wrong"]),
                "writers": list(grid.writer.values), "readers": list(grid.reader.values)}
        (folder / "spec.json").write_text(json.dumps(spec))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
        proc = subprocess.run([a.tl4, __file__, "--worker", str(folder), str(folder / "spec.json"), str(folder / "tl.json"),
                               str(a.rounds)], capture_output=True, text=True, env=env, timeout=3600)
        if proc.returncode != 0:
            raise SystemExit(f"the TransformerLens 4.3 worker failed:\n{proc.stderr[-3000:]}")
        tl = json.loads((folder / "tl.json").read_text())
    ours, theirs = statistics.median(times), statistics.median(tl["times"])
    mask = np.isfinite(grid.values)
    gap = float(np.max(np.abs(np.asarray(tl["grid"])[mask] - grid.values[mask])))
    t = harness.Targets()
    t.add(f"hookrun eap / TransformerLens 4.3 attribution_patch(granularity=\"edge\") (time, {a.items} pairs)", ours / theirs,
          "<= 0.333", ours / theirs <= 1 / 3, f"{ours:.2f} s / {theirs:.2f} s, medians of {a.rounds}; load "
          f"{'/'.join(f'{x:.1f}' for x in loads)} (hookrun), {tl['load']:.1f} (TransformerLens)")
    t.add("largest abs(hookrun - TransformerLens) edge score (summed over positions)", f"{gap:.1e}", "<= 1e-4", gap <= 1e-4,
          f"{int(mask.sum())} edges, {tl['n_edges']} (writer, reader, position) scores in TransformerLens")
    head = harness.environment(time.perf_counter() - started, *harness.versions("torch"),
                               f"tiny_lm (4 layers, 4 heads, d_model 128), word_swap {a.items} items of {a.length} tokens")
    print(harness.report("edges_tl4.py", head, t.lines(), markdown=a.markdown, append=True))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(*sys.argv[2:5], int(sys.argv[5]))
    else:
        main()
