"""The shipped patching experiments run from the CLI (small size) and their grids have the task's
structure: on the last position the clean answer comes back, elsewhere almost nothing moves."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_cli

import hookrun

pytest.importorskip("transformers")
SMALL = ["device=cpu", "progress=false", "data.dataset.n=4", "data.dataset.length=12"]


@pytest.mark.slow
def test_patching_grid_runs_from_the_cli_and_restores_the_answer_at_the_last_position(tmp_path):
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


@pytest.mark.slow
def test_attribution_runs_from_the_cli_with_its_exact_check(tmp_path):
    proc = run_cli("experiment=attribution", f"hydra.run.dir={tmp_path}", "patching.verify=4", *SMALL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = hookrun.open_run(tmp_path / "captures.h5")
    est = run.grid("resid")
    assert est.attrs["method"] == "atp"
    assert np.isfinite(est.values).all()
    checked = np.sum([np.isfinite(run.grid(n, which="exact").values).sum() for n in run.grids])
    assert checked == 4
