"""The shipped edge experiments run from the CLI (small size): experiment=edges writes the [writer, reader]
grid that open_run(p).edges() reads; experiment=faithfulness its curve, whose ends are the model's own
corrupted (no edge kept: 0) and clean (every edge kept: 1) runs; bad edge keys end in one line."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_cli

import hookrun

pytest.importorskip("transformers")
def run_inspect(path, capsys) -> str:
    from hookrun.cli.inspect_command import main

    capsys.readouterr()
    assert main([str(path), "--no-stats"]) == 0
    return capsys.readouterr().out


SMALL = ["device=cpu", "progress=false", "data.dataset.n=2", "data.dataset.length=8"]


@pytest.mark.slow
def test_faithfulness_experiment_runs_from_the_cli(tmp_path, capsys):
    proc = run_cli("experiment=faithfulness", f"hydra.run.dir={tmp_path}", "patching.ig_steps=2", *SMALL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = hookrun.open_run(tmp_path / "captures.h5")
    top, grid = run.edges(top=7)
    assert grid.dims == ("writer", "reader") and grid.shape == (21, 53)
    assert len(top) == 7 and top.columns == ["writer", "reader", "score"]
    assert abs(top[0]["score"]) == pytest.approx(np.nanmax(np.abs(grid.values)))
    assert grid.attrs["method"] == "eap_ig" and grid.attrs["ig_steps"] == 2
    assert grid.attrs["faithfulness_k"] == [0, 10, 50, 200, 479]
    rec = grid.attrs["faithfulness_recovered"]
    np.testing.assert_allclose([rec[0], rec[-1]], [0.0, 1.0], atol=1e-5)
    np.testing.assert_allclose(grid.attrs["node_scores"], np.nansum(grid.values, axis=1), atol=1e-9)

    from hookrun.analysis.report.figure_specs import Heatmap, Lines
    from hookrun.runner.kinds.patching.report import grid_specs

    (name, _, specs), = grid_specs(run)  # the report: the [writer, reader] heatmap, the circuit, the faithfulness curve
    assert name == "edges" and isinstance(specs[0], Heatmap) and specs[0].z.shape == (21, 53)
    from hookrun.analysis.report.figure_specs import Circuit
    from hookrun.analysis.report.plotly_figures import to_plotly

    circuit, = [s for s in specs if isinstance(s, Circuit)]
    top30 = run.edges(top=30)[0]
    assert sorted(e[3] for e in circuit.edges) == sorted(f"{r['writer']} -> {r['reader']}" for r in top30)
    assert {"embed", "logits", "L0.H0", "L3.MLP"} <= set(circuit.nodes)
    assert len(to_plotly(circuit)["data"]) == 34  # a line per edge, then the nodes, then the legend's sign and width
    curve = [s for s in specs if isinstance(s, Lines)]
    assert len(curve) == 2 and list(curve[0].x) == [0, 10, 50, 200, 479] and list(curve[0].series["recovered"]) == rec

    # by default the experiment gives MIB's circuit-track numbers: its ten fractions, CPR and CMD (trapezoids
    # over the fractions, computed here from the curves), in the run's last log line and in inspect
    fractions = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]
    assert grid.attrs["faithfulness_fractions"] == fractions and list(curve[1].x) == fractions
    cpr, cmd = np.asarray(grid.attrs["faithfulness_cpr_curve"]), np.asarray(grid.attrs["faithfulness_cmd_curve"])
    assert cpr[-1] == pytest.approx(1.0, abs=1e-5) and cmd[-1] == pytest.approx(1.0, abs=1e-5)
    assert grid.attrs["faithfulness_cpr"] == pytest.approx(np.trapezoid(cpr, fractions), abs=1e-9)
    assert grid.attrs["faithfulness_cmd"] == pytest.approx(np.trapezoid(np.abs(1 - cmd), fractions), abs=1e-9)
    last = proc.stdout.strip().splitlines()[-1]  # (hookrun's log is on stdout)
    assert "- file: " in last
    assert "recovered at k edges 0: " in last and f"MIB CPR {grid.attrs['faithfulness_cpr']:.4g}, CMD " in last
    shown = run_inspect(tmp_path / "captures.h5", capsys)
    assert f"CPR {grid.attrs['faithfulness_cpr']:.4g}, CMD {grid.attrs['faithfulness_cmd']:.4g} over fractions of 479 edges" in shown
    assert "recovered at k edges 0: " in shown and "cmd (|score|) faithfulness 0.001: " in shown
    scored = int(np.isfinite(grid.values).sum())  # the grid's cells that are edges (a writer before its reader)
    assert scored == 479 and (f"writer 21 x reader 53: {scored} edges; the other {grid.size - scored} cells (a writer at or "
                              "after its reader) are no edge and hold NaN") in shown


@pytest.mark.slow
@pytest.mark.parametrize("change, line", [
    ("patching.ig_steps=0", "patching.ig_steps=0; give the number of interpolation steps"),
    ("patching.faithfulness.edges=[5,5000]", "patching.faithfulness.edges: 5000 is more than the model's 479 edges"),
])
def test_bad_edge_keys_are_one_line_from_the_cli(tmp_path, change, line):
    proc = run_cli("experiment=faithfulness", f"hydra.run.dir={tmp_path}", change, *SMALL)
    assert proc.returncode != 0
    assert line in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_two_ranks_write_the_whole_edge_grid(tmp_path):
    """Under torchrun each rank scores every edge and writes every second cell; the merged view is the
    one-process grid of the same items (hookrun.patch_grid here)."""
    from rank_runs import TORCHRUN, cli

    from hookrun.data.swaps import word_swap
    from hookrun.models.tiny_lm import tiny_lm

    proc = cli("experiment=edges", "hydra.run.dir=two", "patching.method=eap", "patching.ig_steps=1", *SMALL,
               cwd=tmp_path, launcher=TORCHRUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, grid = hookrun.open_run(tmp_path / "two" / "captures.h5").edges()
    want = hookrun.patch_grid(tiny_lm().eval(), word_swap(n=2, length=8), method="eap")["edges"]
    np.testing.assert_array_equal(np.isnan(grid.values), np.isnan(want.values))
    np.testing.assert_allclose(grid.values, want.values, atol=1e-6)
