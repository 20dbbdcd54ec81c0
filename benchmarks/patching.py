"""Patching grids, measured side by side: `python benchmarks/patching.py`.

1. The exact head grid ([layer, position, head], hook_z patched from the clean run) on one random-init
   HookedTransformer: TransformerLens 3.9's `patching.get_act_patch_attn_head_out_by_pos` (one full
   forward per cell) against `hookrun.patch_grid` (many cells per forward, the blocks below the
   patched one not rerun), in paired rounds whose order is shuffled each round (seeded); the ratio
   is the median of the rounds' ratios. Target: hookrun / TransformerLens <= 0.2, equal values.
2. A Hydra multirun of one process per cell (what a grid cost in hookrun before patching runs):
   `python -m hookrun experiment=patching_grid` with a one-cell site (one block's whole output), a
   few processes timed and their mean multiplied by the grid's cells (an extrapolation, said so in
   the table), against the whole grid in one process.
3. atp against exact on the shipped task (experiment=patching_grid's sites on model=tiny_lm): the
   time of each, and the Spearman rank correlation of atp's cells with the exact ones.

    python benchmarks/patching.py                      # the full comparison
    python benchmarks/patching.py --quick              # a smoke run: small sizes, 1 round
    python benchmarks/patching.py --markdown docs/benchmarks.md
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import harness
import numpy as np
import torch

import hookrun

ROOT = Path(__file__).resolve().parent.parent
HEADS = {"at": "blocks.*.attn.hook_z", "over": ["position", "head"], "dims": ["sample", "position", "head", "feature"]}
TASK_SITES = {"resid": {"at": "transformer.h.*", "over": ["position"]}, "attn": {"at": "transformer.h.*.attn", "over": ["position"]},
              "mlp": {"at": "transformer.h.*.mlp", "over": ["position"]}}


def tl_model(a):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = HookedTransformerConfig(n_layers=a.layers, d_model=a.width, n_heads=4, d_head=a.width // 4, n_ctx=a.tokens,
                                      d_vocab=a.vocab, act_fn="gelu")
        return HookedTransformer(cfg).eval()


def head_grid(a, t: harness.Targets) -> None:
    from transformer_lens import patching

    model = tl_model(a)
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, a.vocab, (a.prompts, a.tokens), generator=g)
    corrupt = clean.clone()
    corrupt[:, a.tokens // 2] = torch.randint(0, a.vocab, (a.prompts,), generator=g)
    ans, wrong = torch.randint(0, a.vocab, (a.prompts,), generator=g), torch.randint(0, a.vocab, (a.prompts,), generator=g)
    items = [{"clean": clean[i], "corrupt": corrupt[i], "answer": ans[i], "wrong": wrong[i]} for i in range(a.prompts)]
    r = torch.arange(a.prompts)
    metric = lambda lg: (lg[r, -1, ans] - lg[r, -1, wrong]).mean()  # noqa: E731

    def tl():
        _, cache = model.run_with_cache(clean)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return patching.get_act_patch_attn_head_out_by_pos(model, corrupt, cache, metric).numpy()

    def hr():
        return hookrun.patch_grid(model, items, input="input", sites={"heads": HEADS})["heads"].values

    def hr_no_skip():  # the same, every block run in every packed forward (the stack not found)
        from hookrun.runner.kinds.patching import engine

        find = engine.BlockStack.find
        engine.BlockStack.find = staticmethod(lambda model: None)
        try:
            return hr()
        finally:
            engine.BlockStack.find = find

    rounds = harness.paired_rounds({"transformer_lens": tl, "hookrun": hr, "hookrun_all_blocks": hr_no_skip}, a.rounds,
                                   harness.seeded_shuffle())
    ratio = harness.ratio(rounds.wall, "hookrun", "transformer_lens")
    diff = float(np.abs(rounds.first["hookrun"] - rounds.first["transformer_lens"]).max())
    cells = a.layers * a.tokens * 4
    t.add("1. exact head grid: hookrun / TransformerLens get_act_patch_attn_head_out_by_pos (time)", ratio, "<= 0.2",
          ratio <= 0.2, f"{statistics.median(rounds.wall['hookrun']):.2f} s / {statistics.median(rounds.wall['transformer_lens']):.2f} s, "
          f"{cells} cells, {a.prompts} prompts, medians of {a.rounds} rounds")
    t.add("1. the same grid: max abs difference", f"{diff:.1e}", "<= 1e-4", diff <= 1e-4, "every cell")
    skip = harness.ratio(rounds.wall, "hookrun", "hookrun_all_blocks")
    t.add("1. blocks below the patched one not rerun / every block rerun (hookrun, time)", skip, "< 1", skip < 1,
          f"{statistics.median(rounds.wall['hookrun']):.2f} s / {statistics.median(rounds.wall['hookrun_all_blocks']):.2f} s")


def task_grid(a, method: str, **extra):
    from hookrun.data.swaps import word_swap
    from hookrun.models.tiny_lm import tiny_lm

    model, data = tiny_lm().eval(), word_swap(n=a.items, length=a.length)
    t0 = time.perf_counter()
    g = hookrun.patch_grid(model, data, method=method, sites=TASK_SITES, metric={"name": "logit_diff", "normalize": True}, **extra)
    return g, time.perf_counter() - t0


def multirun(a, t: harness.Targets) -> None:
    _, grid_seconds = task_grid(a, "exact")
    cells = 3 * 4 * a.length
    times = []
    for layer in range(a.processes):  # one cell each: block `layer`'s whole output
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "hookrun", "experiment=patching_grid", "device=cpu", "progress=false",
                        f"data.dataset.n={a.items}", f"data.dataset.length={a.length}",
                        f"hydra.run.dir={ROOT / 'outputs' / 'bench_patching' / str(layer)}", "output.overwrite=true",
                        f"patching.sites.resid.at=transformer.h.{layer}", "patching.sites.resid.over=[]",
                        "~patching.sites.attn", "~patching.sites.mlp"],
                       cwd=ROOT, check=True, capture_output=True, env=harness.child_env())
        times.append(time.perf_counter() - t0)
    per = statistics.mean(times)
    t.add("2. one process per cell (extrapolated) / hookrun's grid in one process (time)", per * cells / grid_seconds, "(report)",
          None, f"{per:.2f} s per process, mean of {a.processes} timed, x {cells} cells = {per * cells:.0f} s "
          f"(extrapolated) against {grid_seconds:.2f} s")


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def atp_vs_exact(a, t: harness.Targets) -> None:
    exact, te = task_grid(a, "exact")
    atp, ta = task_grid(a, "atp")
    x = np.concatenate([exact[k].values.ravel() for k in TASK_SITES])
    y = np.concatenate([atp[k].values.ravel() for k in TASK_SITES])
    t.add("3. atp / exact on the shipped task (time)", ta / te, "(report)", None, f"{ta:.2f} s / {te:.2f} s, {len(x)} cells")
    rho = spearman(x, y)
    t.add("3. atp vs exact: Spearman rank correlation of the cells", rho, "(report)", None,
          f"{len(x)} cells of experiment=patching_grid's sites, {a.items} items of {a.length} tokens")
    moved = np.abs(x) > 1e-6  # the cells before the swapped word are 0 in both (their activations are equal)
    t.add("3. the same over the cells exact patching moves (|value| > 1e-6)", spearman(x[moved], y[moved]), "(report)", None,
          f"{int(moved.sum())} cells")


def main() -> None:
    p = harness.parser(__doc__)
    harness.quick_and_markdown(p, "small sizes, 1 round: checks that everything runs", "append the table to this file")
    harness.int_options(p, layers=3, width=64, tokens=12, vocab=512, prompts=8, rounds=3, items=8, length=24, processes=3)
    a = harness.parse(p, layers=2, tokens=6, prompts=4, rounds=1, items=4, length=12, processes=1)
    started = time.perf_counter()
    t = harness.Targets()
    head_grid(a, t)
    multirun(a, t)
    atp_vs_exact(a, t)
    head = harness.environment(time.perf_counter() - started, *harness.versions("torch", "transformer-lens"),
                               f"threads {torch.get_num_threads()}")
    print(harness.report("patching.py", head, t.lines(), markdown=a.markdown, append=True))


if __name__ == "__main__":
    main()
