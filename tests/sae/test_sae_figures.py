"""The SAE figures the docs print are what their own steps give (issue 34 item 16, issue 49 item 5):
the README's loop (experiment=sae_cache, experiment=sae_train, experiment=sae_eval) run here at a
smaller size, seeded as the commands are, against the figures docs/sae.md states for that size."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import hookrun

ROOT = Path(__file__).resolve().parents[2]
# cache lines; the training budget (rows, batch); held-out lines evaluated
SMALL = ("data.dataset.limit=128", ("sae.rows=40960", "sae.batch_rows=512", "sae.lr_schedule.warmup=10"),
         "data.dataset.limit=64")
FIGURES = ("ce_loss_score", "explained_variance", "l0")


def run_steps(folder: Path, cache_over: str, train_over: tuple[str, ...], eval_over: str) -> dict[str, float]:
    """The README's three commands, in this process: sae_cache, sae_train (on its cache), sae_eval."""
    pytest.importorskip("sae_lens")
    cache = hookrun.run(hookrun.compose("experiment=sae_cache", cache_over, "progress=false",
                                        f"hydra.run.dir={folder / 'sae_cache'}")).path
    hookrun.run(hookrun.compose("experiment=sae_train", f"sae.from={cache}", f"sae.out={folder / 'h3'}", *train_over,
                                "progress=false", f"hydra.run.dir={folder / 'sae_train'}"))
    out = hookrun.run(hookrun.compose("experiment=sae_eval", f"params.sae={folder / 'h3'}", eval_over, "progress=false",
                                      f"hydra.run.dir={folder / 'sae_eval'}")).path
    with hookrun.open_run(out) as run:
        row = run.evaluation()[0]
    return {k: float(row[k]) for k in FIGURES}


def documented() -> dict[str, float]:
    """docs/sae.md's line `small-size figures: `ce_loss_score X` `explained_variance Y` `l0 Z``."""
    line = re.search(r"small-size figures: (.*)", (ROOT / "docs" / "sae.md").read_text()).group(1)
    return {k: float(v) for k, v in re.findall(r"`(\w+) ([-\d.]+)`", line)}


@pytest.mark.slow
def test_the_documented_steps_give_the_documented_figures(tmp_path):
    got = run_steps(tmp_path, *SMALL)
    print(got)
    want = documented()
    assert set(want) == set(FIGURES), want
    for k in FIGURES:
        assert got[k] == pytest.approx(want[k], abs=5e-3 * max(1.0, abs(want[k]))), (k, got)
