"""The grids' pictures of a patching run that failed part-way: a grid none of whose cells was
computed (every cell NaN in the file) was drawn as a whole grey heatmap with a colour bar of made-up
ticks, and `plot` said it wrote a figure; a figure with no information is not drawn. Checked against
the file's cells read with h5py."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from op_models import gpt2
from patch_tasks import token_task
from toy_models import raising_at

import hookrun

pytest.importorskip("matplotlib")
from hookrun.cli import figures  # noqa: E402
from hookrun.cli.plot_command import main as plot_main  # noqa: E402
from hookrun.cli.report_command import main as report_main  # noqa: E402

SITES = {"resid": {"at": "transformer.h.*", "over": ["position"]}, "mlp": {"at": "transformer.h.*.mlp", "over": ["position"]}}


def failed_run(path, fail_at: int):
    """An exact grid over two sites of a 2-layer GPT-2 whose forward raises at call `fail_at`."""
    _, _, _, _, items = token_task(50, n=4, length=6, at=2)
    model = gpt2(2)
    raising_at(model, fail_at, RuntimeError("boom"))
    cfg = {"patching": {"input": "input_ids", "clean": "clean", "corrupt": "corrupt", "method": "exact", "sites": SITES,
                        "metric": {"name": "logit_diff", "answer": "answer", "wrong": "wrong", "position": -1}},
           "data": {"batch_size": 4, "target": None}, "progress": False, "output": {"path": str(path)}}
    with pytest.raises(RuntimeError, match="boom"):  # (a RunError line, or the model's own error)
        hookrun.run(cfg, model=model, dataset=items)
    with h5py.File(path, "r") as f:
        meta = json.loads(f.attrs["patching"])
        cells = f["captures/patching/cells/value"][()] if "captures/patching/cells/value" in f else np.zeros(0)
        grids = {}
        for name, lay in meta["layout"].items():
            size = len(lay["modules"]) * int(np.prod(lay["sizes"]))
            whole = np.full(size, np.nan)
            got = cells[lay["offset"]: lay["offset"] + size]
            whole[: len(got)] = got
            grids[name] = whole.reshape(len(lay["modules"]), *lay["sizes"])
        assert f.attrs["status"] == "failed"
    return grids


def drawn(monkeypatch, argv):
    """plot's figures as it saves them: {file name: figure}."""
    seen, save = {}, figures.save

    def spy(fig, path, *args, **kwargs):
        seen[path.name] = fig
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(figures, "save", spy)
    return plot_main(argv), seen


def test_a_grid_with_no_cell_computed_is_not_drawn_and_the_other_is(tmp_path, monkeypatch, capsys):
    path = tmp_path / "half.h5"
    grids = failed_run(path, fail_at=5)  # (clean, corrupt, then the resid grid's cells; the mlp grid's never ran)
    assert np.isfinite(grids["resid"]).all() and not np.isfinite(grids["mlp"]).any()
    rc, seen = drawn(monkeypatch, [str(path), "--out", str(tmp_path / "fig")])
    assert rc == 0
    grid_pngs = sorted(n for n in seen if n.startswith("grid_"))
    assert grid_pngs == ["grid_resid_exact_logit_diff.png"]  # (the mlp grid: no picture of nothing)
    image = seen["grid_resid_exact_logit_diff.png"].axes[0].images[0]
    np.testing.assert_array_equal(np.ma.filled(image.get_array(), np.nan), grids["resid"])
    assert "failed" in seen["grid_resid_exact_logit_diff.png"].axes[0].get_title()
    assert "not drawn: grid_mlp_exact_logit_diff.png: no cell has a value" in capsys.readouterr().out
    with hookrun.open_run(path) as run:
        from hookrun.analysis.report import run_data

        data = run_data(run)
    (grids_section,) = [s for s in data["sections"] if s["id"] == "grids"]
    heatmaps = [f["figure"]["data"][0] for item in grids_section["items"] for f in item["figures"]
                if f["figure"]["data"][0]["type"] == "heatmap"]
    assert len(heatmaps) == 1
    np.testing.assert_allclose(np.array(heatmaps[0]["z"], dtype=float), grids["resid"], rtol=1e-6)
    assert "mlp" in grids_section["note"] and "no cell" in grids_section["note"]


def test_a_run_that_failed_before_any_cell_draws_nothing_and_says_why(tmp_path, monkeypatch, capsys):
    path = tmp_path / "none.h5"
    grids = failed_run(path, fail_at=3)  # (the first chunk of cells)
    assert not any(np.isfinite(g).any() for g in grids.values())
    rc, seen = drawn(monkeypatch, [str(path), "--out", str(tmp_path / "fig")])
    err = capsys.readouterr().err
    assert rc == 2 and not seen and "nothing could be drawn" in err and "failed: 0 cells so far" in err  # (a patching run's rows are cells, as inspect counts them)
    assert report_main([str(path), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "nothing to show" in err and "failed" in err and not (tmp_path / "r.html").exists()
