"""A patching file's rows are cells (docs/format.md: `/samples/index` holds each row's cell number),
but the cell captures' `dims` attribute named their axis `sample`: xarray built from the file's own
names (and `run.to_xarray()`) showed a `sample` axis whose coordinates, the cell numbers, read as
items of the data set. The axis is `cell` now. Checked with plain h5py and xarray against the cells
recomputed by patching the model directly."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

import hookrun

pytest.importorskip("transformers")
xr = pytest.importorskip("xarray")


def _reference(n: int, length: int, layer: int) -> np.ndarray:
    """Denoising cells of `transformer.h.LAYER` over positions: the corrupted run with the clean
    block output at one position, logit difference at the last position, normalised."""
    from hookrun.data.swaps import word_swap
    from hookrun.models import tiny_lm

    model = tiny_lm(attn_implementation="eager").eval()
    items = [word_swap(n=n, length=length)[i] for i in range(n)]
    clean, corrupt = (torch.stack([torch.as_tensor(it[k]) for it in items]) for k in ("clean", "corrupt"))
    answer, wrong = (torch.tensor([int(it[k]) for it in items])[:, None] for k in ("answer", "wrong"))

    def metric(ids: torch.Tensor) -> float:
        last = model(ids).logits[:, -1]
        return (last.gather(-1, answer) - last.gather(-1, wrong)).mean().item()

    block, kept = model.transformer.h[layer], {}
    with torch.no_grad():
        m_clean, m_corrupt = metric(clean), metric(corrupt)
        h = block.register_forward_hook(lambda mod, i, o: kept.setdefault("x", (o[0] if isinstance(o, tuple) else o).clone()))
        model(clean)
        h.remove()
        out = []
        for p in range(clean.shape[1]):
            def patch(mod, i, o, p=p):
                x = (o[0] if isinstance(o, tuple) else o).clone()
                x[:, p] = kept["x"][:, p]
                return (x, *o[1:]) if isinstance(o, tuple) else x
            h = block.register_forward_hook(patch)
            out.append((metric(corrupt) - m_corrupt) / (m_clean - m_corrupt))
            h.remove()
    return np.array(out)


def test_cell_rows_are_named_cell_and_read_back_with_h5py_and_xarray(tmp_path):
    cfg = hookrun.compose("experiment=patching_grid", "data.dataset.n=4", "data.dataset.length=8", "progress=false",
                          "~patching.sites.attn", "~patching.sites.mlp", "patching.sites.resid.at=[transformer.h.2]",
                          f"output.path={tmp_path / 'c.h5'}")
    path = hookrun.run(cfg).path
    with h5py.File(path, "r") as f:  # what docs/format.md says, nothing of hookrun
        ds = f["captures/patching/cells/value"]
        assert list(ds.attrs["dims"]) == ["cell"] and list(f["captures/patching/cells/exact"].attrs["dims"]) == ["cell"]
        cells = xr.DataArray(ds[:], dims=list(ds.attrs["dims"]), coords={"cell": f["samples/index"][:]})
        g = json.loads(f.attrs["patching"])["layout"]["resid"]
    grid = cells.sortby("cell").values[g["offset"]: g["offset"] + int(np.prod(g["sizes"]))]
    np.testing.assert_allclose(grid, _reference(4, 8, 2), atol=1e-5)
    with hookrun.open_run(path) as run:
        data = run.to_xarray()["patching/cells/value"]
    assert data.dims == ("cell",)
    np.testing.assert_array_equal(data["cell"].values, cells["cell"].values)
