"""Patching over many ranks and in a multirun (issue 32): two torchrun ranks split the cells and the
merged view holds the whole grid; a killed rank's shard resumes with its own cells; a multirun
writes one grid per job. References: the one-process run of the same command, and the grid
computed here with plain forward hooks on the same shipped model and items (one forward per cell).
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from rank_runs import TORCHRUN, cli

import hookrun

pytest.importorskip("transformers")
N, T = 4, 12
ARGS = ["experiment=patching_grid", "device=cpu", "progress=false", f"data.dataset.n={N}", f"data.dataset.length={T}",
        "~patching.sites.attn", "~patching.sites.mlp", "patching.cells_per_forward=4", "output.flush_every=1"]
CELLS = 4 * T  # 4 blocks x 12 positions


def patched_grid(position: int) -> np.ndarray:
    """Each block's output at each position patched from the clean run into the corrupted one with
    a forward hook, one forward per cell; the normalized logit difference at `position`."""
    from hookrun.data.swaps import word_swap
    from hookrun.models.tiny_lm import tiny_lm

    model, items = tiny_lm().eval(), word_swap(n=N, length=T)
    clean, corrupt = (torch.stack([it[k] for it in items]) for k in ("clean", "corrupt"))
    answer, wrong = (torch.stack([it[k] for it in items]) for k in ("answer", "wrong"))
    blocks, rows = model.transformer.h, torch.arange(N)

    def metric(ids: torch.Tensor) -> float:
        at = model(input_ids=ids).logits[:, position]
        return float((at[rows, answer] - at[rows, wrong]).double().mean())

    kept: dict[int, torch.Tensor] = {}
    handles = [b.register_forward_hook(lambda m, a, out, i=i: kept.__setitem__(i, out[0] if isinstance(out, tuple) else out))
               for i, b in enumerate(blocks)]
    with torch.no_grad():
        m_clean = metric(clean)
        for h in handles:
            h.remove()
        m_corrupt = metric(corrupt)
        grid = np.empty((len(blocks), T))
        for layer, block in enumerate(blocks):
            for pos in range(T):
                def patch(m, a, out, layer=layer, pos=pos):
                    x = (out[0] if isinstance(out, tuple) else out).clone()
                    x[:, pos] = kept[layer][:, pos]
                    return (x, *out[1:]) if isinstance(out, tuple) else x
                handle = block.register_forward_hook(patch)
                try:
                    grid[layer, pos] = (metric(corrupt) - m_corrupt) / (m_clean - m_corrupt)
                finally:
                    handle.remove()
    return grid


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    return patched_grid(-1)


@pytest.fixture(scope="module")
def tl_task():
    """A tiny HookedTransformer and three items (tests/patching/test_patching_runs.py's kind)."""
    from test_patching_runs import V
    from tl_models import hooked_transformer

    model = hooked_transformer(V)
    clean = torch.randint(0, V, (3, 5), generator=torch.Generator().manual_seed(1))
    corrupt = torch.cat([clean[:, :1], torch.randint(0, V, (3, 1)), clean[:, 2:]], 1)
    items = [{"clean": c, "corrupt": x, "answer": torch.tensor(3), "wrong": torch.tensor(4)} for c, x in zip(clean, corrupt, strict=True)]
    return model, items


def test_the_shares_of_two_ranks_make_the_grid_of_transformer_lens(tl_task):
    """In one process: each rank's share of the cells (every second one, from its own), exact and
    atp with verify, together equal TransformerLens' one-forward-per-cell grid."""
    from test_patching_runs import HEADS
    from test_patching_runs import reference as tl_reference

    from hookrun.config.build import build
    from hookrun.hooks.actions import ActionEnv
    from hookrun.runner.kinds.patching.block import load_items, parse_block
    from hookrun.runner.kinds.patching.engine import PatchEngine
    from hookrun.runner.kinds.patching.notebook import run_cells

    model, items = tl_task
    expected = tl_reference(model, items).reshape(-1)
    for method in ("exact", "atp"):
        block = parse_block({"input": "input", "sites": {"heads": HEADS}, "metric": {"_target_": "patch_metrics.last_logit"},
                             "method": method, "verify": 6 if method == "atp" else 0, "cells_per_forward": 3},
                            build=lambda node, where: build(node, where))
        with PatchEngine(model, block, load_items(items, block), ActionEnv()) as engine:
            full_values, _ = run_cells(engine)
            shares = [run_cells(engine, range(rank, engine.layout.size, 2)) for rank in (0, 1)]
        for rank, (values, exact) in enumerate(shares):  # NaN outside the rank's own cells
            assert np.isnan(values[1 - rank::2]).all() and np.isfinite(values[rank::2]).all()
            assert np.isnan(exact[1 - rank::2]).all()
        values = np.where(np.isnan(shares[0][0]), shares[1][0], shares[0][0])
        np.testing.assert_allclose(values, full_values, atol=1e-6)
        if method == "exact":
            np.testing.assert_allclose(values, expected, atol=1e-4)
        else:  # the verified cells: the 6 largest of the whole grid, split between the ranks, each exact
            exact = np.where(np.isnan(shares[0][1]), shares[1][1], shares[0][1])
            assert np.isfinite(exact).sum() == 6
            np.testing.assert_allclose(exact[np.isfinite(exact)], expected[np.isfinite(exact)], atol=1e-4)


@pytest.mark.parametrize("rank, world", [(1, 2), (0, 6)])
def test_a_rank_takes_every_world_th_cell_and_more_ranks_than_cells_are_refused(tmp_path, tl_task, rank, world):
    from hookrun.config import load, with_live
    from hookrun.errors import ConfigError
    from hookrun.runner.prepare import prepare

    model, items = tl_task
    cfg = load(with_live({"data": {"inputs": {"input": "clean"}, "target": None}, "output": {"path": str(tmp_path / "p.h5")},
                          "patching": {"input": "input", "sites": {"r": {"at": "blocks.0.hook_resid_pre", "over": ["position"]}}}},
                         model, items))
    p = prepare(cfg, model=model, dataset=items)
    kind = p.settings.kind
    assert kind.share(rank, world).startswith(f"cells {rank}, {rank + world}")
    try:
        if world > 5:  # 5 cells: one module, 5 positions
            with pytest.raises(ConfigError, match=r"^patching: the run has 6 processes but its grids only 5 cell\(s\);.*at most 5"):
                kind.prepare_run(p)
            assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())  # left unhooked
        else:
            kind.prepare_run(p)
            assert list(kind.engine.cells) == [1, 3]
    finally:
        kind.close()
        p.env.close()


@pytest.mark.slow
def test_two_ranks_split_the_cells_and_the_view_holds_the_whole_grid(tmp_path, reference):
    proc = cli(*ARGS, "hydra.run.dir=two", cwd=tmp_path, launcher=TORCHRUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    hookrun.run(hookrun.compose(*ARGS, f"hydra.run.dir={tmp_path / 'one'}"))  # the same command in one process (this one)

    for rank in (0, 1):  # each rank wrote every second cell, from its own
        with h5py.File(tmp_path / "two" / f"captures.rank-0000{rank}.h5") as f:
            assert f["samples/index"][:].tolist() == list(range(rank, CELLS, 2))
    run = hookrun.open_run(tmp_path / "two" / "captures.h5")
    assert run.grids == ["resid"] and run.status == "complete"
    assert run.samples.tolist() != sorted(run.samples.tolist())  # rows in rank order, not cell order
    grid = run.grid("resid")
    assert grid.dims == ("module", "position") and grid.shape == (4, T)
    np.testing.assert_allclose(grid.values, reference, atol=1e-5)
    np.testing.assert_allclose(grid.values, hookrun.open_run(tmp_path / "one" / "captures.h5").grid("resid").values, atol=1e-6)
    assert grid.attrs["metric_clean"] > grid.attrs["metric_corrupt"]


@pytest.mark.slow
def test_a_killed_rank_resumes_with_its_own_cells(tmp_path, reference):
    args = [*ARGS, "+patching.metric._target_=patch_metrics.logit_diff_or_kill", "hydra.run.dir=run"]  # (normalized)
    killed = cli(*args, cwd=tmp_path, launcher=TORCHRUN, env={"HOOKRUN_TEST_KILL": "1:5"})  # rank 1, its third chunk
    assert killed.returncode != 0
    with h5py.File(tmp_path / "run" / "captures.rank-00001.h5") as f:
        written = f["samples/index"][:].tolist()
    assert 0 < len(written) < CELLS // 2 and written == list(range(1, 2 * len(written), 2))

    resumed = cli(*args, "resume=true", cwd=tmp_path, launcher=TORCHRUN)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with h5py.File(tmp_path / "run" / "captures.rank-00001.h5") as f:
        assert f["samples/index"][:].tolist() == list(range(1, CELLS, 2))  # went on; wrote none twice
    run = hookrun.open_run(tmp_path / "run" / "captures.h5")
    assert run.status == "complete"
    np.testing.assert_allclose(run.grid("resid").values, reference, atol=1e-5)


@pytest.mark.slow
def test_a_multirun_writes_one_grid_per_job(tmp_path, reference):
    proc = cli("-m", *ARGS, "patching.metric.position=-1,-2", "hydra.sweep.dir=multi", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for job, expected in ((0, reference), (1, patched_grid(-2))):
        run = hookrun.open_run(tmp_path / "multi" / str(job) / "captures.h5")
        np.testing.assert_allclose(run.grid("resid").values, expected, atol=1e-5, rtol=1e-4)
