"""The shipped patching experiments run from the CLI (small size) and their grids have the task's
structure: on the last position the clean answer comes back, elsewhere almost nothing moves; every
value equals a reference made without hookrun, on the same weights and items: the exact grids a
raw-hook loop patching one cell a forward, the AtP estimate one from torch.autograd.grad."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import run_cli

import hookrun

pytest.importorskip("transformers")
SMALL = ["device=cpu", "progress=false", "data.dataset.n=4", "data.dataset.length=12"]
SITES = {"resid": "", "attn": ".attn", "mlp": ".mlp"}  # the experiment's sites: transformer.h.* and their attn, mlp


@pytest.fixture(scope="module")
def raw():
    """The patching_grid task (4 items of 12 tokens) on the shipped tiny_lm, with plain PyTorch forward
    hooks: for each site, the exact grid (block, position), one forward per cell with the clean run's
    output at that block and position put into the corrupted run; and the AtP estimate, metric(corrupt)
    + sum over the cell of (clean - corrupt) x d metric / d output; both normalized by the clean and
    corrupted runs' metric (logit of the answer minus the wrong letter's at the last position, the mean
    over the items)."""
    from hookrun.data.swaps import word_swap
    from hookrun.models.tiny_lm import tiny_lm

    model, threads = tiny_lm().eval(), torch.get_num_threads()
    torch.set_num_threads(1)  # 200 forwards of 4 x 12 tokens: one thread is 7x less CPU than two here
    items = [word_swap(n=4, length=12)[i] for i in range(4)]
    clean, corrupt = (torch.stack([it[k] for it in items]) for k in ("clean", "corrupt"))
    answer, wrong = (torch.stack([it[k] for it in items]) for k in ("answer", "wrong"))

    def metric(logits):
        last = logits[:, -1]
        return (last.gather(1, answer[:, None]) - last.gather(1, wrong[:, None])).mean()

    def module(site, block):
        return dict(model.named_modules())[f"transformer.h.{block}{SITES[site]}"]

    def first(out):
        return out[0] if isinstance(out, tuple) else out

    def forward(x, hooks):  # hooks: {module: fn(module, input, output)}
        handles = [m.register_forward_hook(fn) for m, fn in hooks.items()]
        try:
            return metric(model(input_ids=x).logits)
        finally:
            for h in handles:
                h.remove()

    blocks = len(model.transformer.h)
    seen: dict = {}
    with torch.no_grad():
        m_clean = forward(clean, {module(s, b): (lambda m, i, o, k=(s, b): seen.__setitem__(k, first(o).clone()))
                                  for s in SITES for b in range(blocks)}).item()
        m_corrupt = forward(corrupt, {}).item()

        def patched(site, block, pos):
            def put(m, i, o):
                t = first(o).clone()
                t[:, pos] = seen[site, block][:, pos]
                return (t, *o[1:]) if isinstance(o, tuple) else t
            return forward(corrupt, {module(site, block): put}).item()

        exact = {s: (np.array([[patched(s, b, p) for p in range(12)] for b in range(blocks)]) - m_corrupt) / (m_clean - m_corrupt)
                 for s in SITES}
    acts: dict = {}
    m = forward(corrupt, {module(s, b): (lambda mod, i, o, k=(s, b): acts.__setitem__(k, first(o)))
                          for s in SITES for b in range(blocks)})
    keys = list(acts)
    grads = dict(zip(keys, torch.autograd.grad(m, [acts[k] for k in keys]), strict=True))
    atp = {s: np.array([[((seen[s, b] - acts[s, b].detach()) * grads[s, b]).sum(dim=(0, 2))[p].item() / (m_clean - m_corrupt)
                         for p in range(12)] for b in range(blocks)]) for s in SITES}
    torch.set_num_threads(threads)
    return exact, atp


@pytest.mark.slow
def test_patching_grid_runs_from_the_cli_and_restores_the_answer_at_the_last_position(tmp_path, raw):
    proc = run_cli("experiment=patching_grid", f"hydra.run.dir={tmp_path}", *SMALL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = hookrun.open_run(tmp_path / "captures.h5")
    assert run.grids == ["resid", "attn", "mlp"]
    resid = run.grid("resid")
    assert resid.dims == ("module", "position") and resid.shape == (4, 12)
    assert resid.attrs["metric_clean"] > resid.attrs["metric_corrupt"]
    np.testing.assert_allclose(resid.values[-1, -1], 1.0, atol=1e-5)  # the last block's last position: the clean run's logits
    assert np.abs(resid.values[:, :8]).max() < 1e-5  # the shared, uncorrupted prefix changes nothing

    # the same numbers from the notebook entry point, with the model and items built here
    from hookrun.data.swaps import word_swap
    from hookrun.models.tiny_lm import tiny_lm

    g = hookrun.patch_grid(tiny_lm().eval(), word_swap(n=4, length=12), metric={"name": "logit_diff", "normalize": True},
                           sites={"resid": {"at": "transformer.h.*", "over": ["position"]}})["resid"]
    np.testing.assert_allclose(g.values, resid.values, atol=1e-4)
    exact, _ = raw  # and every grid of the CLI run against a raw-hook loop, one cell a forward
    for site in SITES:
        np.testing.assert_allclose(run.grid(site).values, exact[site], atol=1e-4, err_msg=site)


@pytest.mark.slow
def test_attribution_runs_from_the_cli_with_its_exact_check(tmp_path, raw):
    proc = run_cli("experiment=attribution_patching", f"hydra.run.dir={tmp_path}", "patching.verify=4", *SMALL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = hookrun.open_run(tmp_path / "captures.h5")
    est = run.grid("resid")
    assert est.attrs["method"] == "atp"
    assert np.isfinite(est.values).all()
    checked = np.sum([np.isfinite(run.grid(n, which="exact").values).sum() for n in run.grids])
    assert checked == 4
    exact, atp = raw
    for site in SITES:  # the estimate against torch.autograd.grad, the checked cells against the raw-hook loop
        np.testing.assert_allclose(run.grid(site).values, atp[site], atol=1e-4, err_msg=site)
        got = run.grid(site, which="exact").values
        np.testing.assert_allclose(got[np.isfinite(got)], exact[site][np.isfinite(got)], atol=1e-4, err_msg=site)
