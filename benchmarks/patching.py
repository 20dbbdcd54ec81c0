"""Patching grids, measured side by side: `python benchmarks/patching.py`.

1. The exact head grid ([layer, position, head], hook_z patched from the clean run) on two random-init
   HookedTransformers (tiny: 3 layers, d_model 64, 4 heads, 12 tokens; wide: 6 layers, d_model 256,
   8 heads, 24 tokens; 8 prompts each): TransformerLens 3.9's `patching.get_act_patch_attn_head_out_by_pos`
   (one full forward per cell) against `hookrun.patch_grid` (many cells per forward, each run from its
   first patched position on with the base run's keys and values before it, from the lowest patched
   block, unembedded only at the metric's position), in paired rounds whose order is shuffled each
   round (seeded); the ratio is the median of the rounds' ratios. Target: hookrun / TransformerLens
   <= 0.2, equal values. hookrun with each saving turned off (--variants) shows what each one pays;
   the machine's load average is written beside every figure.
2. A Hydra multirun of one process per cell (what a grid cost in hookrun before patching runs):
   `python -m hookrun experiment=patching_grid` with a one-cell site (one block's whole output), a
   few processes timed and their mean multiplied by the grid's cells (an extrapolation, said so in
   the table), against the whole grid in one process.
3. atp against exact on the shipped task (experiment=patching_grid's sites on model=tiny_lm): the
   time of each, and the Spearman rank correlation of atp's cells with the exact ones.

    python benchmarks/patching.py                      # the full comparison
    python benchmarks/patching.py --quick              # a smoke run: small sizes, 1 round
    python benchmarks/patching.py --sections 1         # the head grids only
    python benchmarks/patching.py --markdown docs/benchmarks/patching.md
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import harness
import numpy as np
import torch

import hookrun

ROOT = Path(__file__).resolve().parent.parent
HEADS = {"at": "blocks.*.attn.hook_z", "over": ["position", "head"], "dims": ["sample", "position", "head", "feature"]}
TASK_SITES = {"resid": {"at": "transformer.h.*", "over": ["position"]}, "attn": {"at": "transformer.h.*.attn", "over": ["position"]},
              "mlp": {"at": "transformer.h.*.mlp", "over": ["position"]}}


def tl_model(m: Model):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = HookedTransformerConfig(n_layers=m.layers, d_model=m.width, n_heads=m.heads, d_head=m.width // m.heads,
                                      n_ctx=m.tokens, d_vocab=m.vocab, act_fn="gelu")
        return HookedTransformer(cfg).eval()


class Model(NamedTuple):
    name: str
    layers: int
    width: int
    heads: int
    tokens: int
    vocab: int
    prompts: int


def load() -> str:
    """The machine's load averages (1, 5, 15 min) on its CPUs: printed beside every figure."""
    return f"load {'/'.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs"


@contextmanager
def routes(**off: bool):
    """hookrun's exact-grid savings switched as given (runner/kinds/patching/suffix.py's ROUTES), `route=False`:
    the suffix route never taken, `stack=False`: every block run in every full-path forward, `equal=False`: cells
    whose clean and corrupted values are equal computed too (PatchEngine.skip_equal)."""
    from hookrun.runner.kinds.patching import engine, suffix

    saved, find, stack = dict(vars(suffix.ROUTES)), engine.SuffixRoute.find, engine.BlockStack.find
    engine.PatchEngine.skip_equal = off.get("equal", True)
    try:
        for k in ("suffix", "skip", "narrow"):
            setattr(suffix.ROUTES, k, off.get(k, True))
        if not off.get("route", True):
            engine.SuffixRoute.find = staticmethod(lambda *args: None)
        if not off.get("stack", True):
            engine.BlockStack.find = staticmethod(lambda model: None)
        yield
    finally:
        vars(suffix.ROUTES).update(saved)
        engine.PatchEngine.skip_equal = True
        engine.SuffixRoute.find, engine.BlockStack.find = find, stack


# hookrun's routes: each saving turned off in turn (the cells before the corrupted token, whose clean and
# corrupted activations are equal, computed too: every later variant computes them), then the route off (the
# full path, the blocks below the patched one still skipped), then every block run in every forward
VARIANTS = {"hookrun": {}, "hookrun_no_equal_cells": {"equal": False},
            "hookrun_no_suffix": {"suffix": False, "equal": False}, "hookrun_no_skip": {"skip": False, "equal": False},
            "hookrun_no_narrow": {"narrow": False, "equal": False}, "hookrun_full_path": {"route": False, "equal": False},
            "hookrun_all_blocks": {"route": False, "stack": False, "equal": False}}


def head_grid(a, m: Model, t: harness.Targets) -> None:
    from transformer_lens import patching

    model = tl_model(m)
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, m.vocab, (m.prompts, m.tokens), generator=g)
    corrupt = clean.clone()
    corrupt[:, m.tokens // 2] = torch.randint(0, m.vocab, (m.prompts,), generator=g)
    ans, wrong = torch.randint(0, m.vocab, (m.prompts,), generator=g), torch.randint(0, m.vocab, (m.prompts,), generator=g)
    items = [{"clean": clean[i], "corrupt": corrupt[i], "answer": ans[i], "wrong": wrong[i]} for i in range(m.prompts)]
    r = torch.arange(m.prompts)
    metric = lambda lg: (lg[r, -1, ans] - lg[r, -1, wrong]).mean()  # noqa: E731

    def tl():
        _, cache = model.run_with_cache(clean)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return patching.get_act_patch_attn_head_out_by_pos(model, corrupt, cache, metric).numpy()

    def hr(**off):
        def run():
            with routes(**off):
                return hookrun.patch_grid(model, items, input="input", sites={"heads": HEADS})["heads"].values
        return run

    run = {"transformer_lens": tl, **{name: hr(**off) for name, off in VARIANTS.items() if name in a.variants}}
    harness.log(f"1. {m.name}: {m.layers} layers, d_model {m.width}, {m.heads} heads, {m.tokens} tokens, {m.prompts} prompts, {load()}")
    rounds = harness.paired_rounds(run, a.rounds, harness.seeded_shuffle())
    here = load()
    med = {k: statistics.median(v) for k, v in rounds.wall.items()}
    ratio = harness.ratio(rounds.wall, "hookrun", "transformer_lens")
    diff = max(float(np.abs(rounds.first[k] - rounds.first["transformer_lens"]).max()) for k in run)
    cells = m.layers * m.tokens * m.heads
    size = f"{m.name}: {m.layers} layers, d_model {m.width}, {m.heads} heads, {m.tokens} tokens, {m.prompts} prompts"
    t.add(f"1. exact head grid, {size}: hookrun / TransformerLens get_act_patch_attn_head_out_by_pos (time)", ratio,
          "<= 0.2", ratio <= 0.2, f"{med['hookrun']:.2f} s / {med['transformer_lens']:.2f} s, {cells} cells, medians of "
          f"{a.rounds} rounds; {here}")
    t.add(f"1. {m.name}: the same grid, every hookrun route: max abs difference", f"{diff:.1e}", "<= 1e-4", diff <= 1e-4,
          f"every cell; {here}")
    for name in run:  # each saving against the same route without it (the suffix route's pieces: without equal cells too)
        if name in ("transformer_lens", "hookrun"):
            continue
        base = "hookrun" if name == "hookrun_no_equal_cells" or "hookrun_no_equal_cells" not in run else "hookrun_no_equal_cells"
        x = harness.ratio(rounds.wall, base, name)
        t.add(f"1. {m.name}: {base} / {name} (time)", x, "< 1", x < 1, f"{med[base]:.2f} s / {med[name]:.2f} s; {here}")


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
    harness.int_options(p, layers=3, width=64, heads=4, tokens=12, vocab=512, prompts=8, wide_layers=6, wide_width=256,
                        wide_heads=8, wide_tokens=24, rounds=3, items=8, length=24, processes=3)
    p.add_argument("--sections", default="1,2,3", help="which sections to run (1: head grids, 2: multirun, 3: atp)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="hookrun's routes timed in section 1")
    a = harness.parse(p, layers=2, tokens=6, prompts=4, rounds=1, items=4, length=12, processes=1, wide_layers=2,
                      wide_width=64, wide_tokens=8)
    a.variants = set(a.variants.split(",")) | {"hookrun"}
    sections = set(a.sections.split(","))
    started = time.perf_counter()
    t = harness.Targets()
    if "1" in sections:
        head_grid(a, Model("tiny", a.layers, a.width, a.heads, a.tokens, a.vocab, a.prompts), t)
        head_grid(a, Model("wide", a.wide_layers, a.wide_width, a.wide_heads, a.wide_tokens, a.vocab, a.prompts), t)
    if "2" in sections:
        multirun(a, t)
    if "3" in sections:
        atp_vs_exact(a, t)
    head = harness.environment(time.perf_counter() - started, *harness.versions("torch", "transformer-lens"),
                               f"threads {torch.get_num_threads()}", load())
    print(harness.report("patching.py", head, t.lines(), markdown=a.markdown, append=True))


if __name__ == "__main__":
    main()
