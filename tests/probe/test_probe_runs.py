"""probe runs as a user runs them: resume after SIGKILL equals the uninterrupted run; rows spilled to
disk (a small `memory`) equal rows held; test_data's items as the test rows; the readers (inspect,
plot, report, a sweep over probe.C in open_sweep)."""

from __future__ import annotations

import json
import os
import signal

import h5py
import numpy as np
import pytest
from conftest import ENV, ROOT
from warm_python import python as warm

import hookrun
from hookrun.store.live import settled

CFG = {"model": {"_target_": "hookrun.models.tiny_cnn"},
       "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 96, "noise": 0.3}, "batch_size": 16},
       "device": "cpu", "progress": False, "output": {"flush_every": 1},
       "probe": {"at": ["block1", "block3"], "target": "label", "method": "ridge", "control": True, "memory": "1MB"},
       "hooks": {"killer": {"at": "fc", "type": "forward",
                            "actions": [{"_target_": "rank_helpers.kill_when_told", "_partial_": True}]}}}


def run_child(path, kill_at=None, **over):
    cfg = {**CFG, "output": {**CFG["output"], "path": str(path)}, **over}
    env = {**os.environ, **ENV, "OMP_NUM_THREADS": "1"}
    env.pop("HOOKRUN_TEST_KILL", None)
    if kill_at is not None:
        env["HOOKRUN_TEST_KILL"] = f"0:{kill_at}"  # rank_helpers.kill_when_told: SIGKILL at that batch
    code = f"import hookrun, json; hookrun.run(json.loads({json.dumps(json.dumps(cfg))}))"
    return warm(["-c", code], env=env, timeout=600)


def results(path):
    run = hookrun.open_run(path)
    return run.probes(), {a: run.probe_weights(a) for a in ("block1", "block3")}


@pytest.mark.slow
def test_resume_after_sigkill_equals_the_uninterrupted_run(tmp_path):
    hookrun.run({**CFG, "output": {**CFG["output"], "path": str(tmp_path / "whole.h5")}})  # (no HOOKRUN_TEST_KILL here)
    killed = run_child(tmp_path / "killed.h5", kill_at=4)
    assert killed.returncode == -signal.SIGKILL
    settled(tmp_path / "killed.h5")  # (the killed writer's flush helper lets go of the file once it has applied its last message)
    with h5py.File(tmp_path / "killed.h5", "r") as f:
        assert "probe" not in f and 0 < f["samples/index"].shape[0] < 96
    again = run_child(tmp_path / "killed.h5", resume=True)
    assert again.returncode == 0, again.stderr[-2000:]
    (t1, w1), (t2, w2) = results(tmp_path / "whole.h5"), results(tmp_path / "killed.h5")
    assert t1.rows == t2.rows
    for a in w1:
        np.testing.assert_allclose(w2[a][0], w1[a][0], rtol=1e-9, atol=1e-12)


def test_rows_spilled_to_disk_equal_rows_held_and_test_data(tmp_path):
    from hookrun.models import tiny_cnn

    model = tiny_cnn()
    base = {"data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 64, "noise": 0.3}, "batch_size": 16},
            "device": "cpu", "progress": False}
    block = {"at": ["block2", "fc"], "target": "label", "method": "logistic", "control": True}
    paths = {}
    for name, memory in (("held", "1GB"), ("spilled", 16 * 32 * 8 * 2 + 16 * 4 * 8 * 2)):  # two batches of rows each
        paths[name] = tmp_path / f"{name}.h5"
        hookrun.run({**base, "output": {"path": str(paths[name])}, "probe": {**block, "memory": memory}}, model=model)
    held, spilled = (hookrun.open_run(paths[n]) for n in ("held", "spilled"))
    assert held.probes().rows == spilled.probes().rows
    for a in ("block2", "fc"):
        np.testing.assert_allclose(spilled.probe_weights(a)[0], held.probe_weights(a)[0], rtol=1e-6, atol=1e-9)
    assert bool(spilled.file["probe/000"].attrs["spilled"]) and not bool(held.file["probe/000"].attrs["spilled"])
    assert not any(p.name.startswith(".probe_rows") for p in tmp_path.iterdir())
    test_data = {"dataset": {"_target_": "hookrun.data.shapes", "size": 32, "seed": 5, "noise": 0.3}}
    path = tmp_path / "td.h5"
    hookrun.run({**base, "output": {"path": str(path)}, "probe": {**block, "test_data": test_data}}, model=model)
    run = hookrun.open_run(path)
    t = run.probes()
    assert [int(run.file[f"probe/{k}"].attrs["test_rows"]) for k in ("000", "001")] == [32, 32]
    assert [int(run.file[f"probe/{k}"].attrs["train_rows"]) for k in ("000", "001")] == [64, 64]
    assert t.column("rows") == [96, 96]
    # the notebook function with the test set as an object: the same table and weights as the node's run
    from hookrun.data.shapes import shapes
    from hookrun.errors import ConfigError

    live = hookrun.probe(model, shapes(64, noise=0.3), batch_size=16, **block, test_data=shapes(32, seed=5, noise=0.3))
    assert live.rows == t.rows
    np.testing.assert_array_equal(live.weights["fc"][0], run.probe_weights("fc")[0])
    # a test_data node that builds nothing is one line naming it, before any batch (no file)
    bad = {"dataset": {"_target_": "hookrun.data.shapez", "size": 8}}
    with pytest.raises(ConfigError, match=r"^probe.test_data.dataset: cannot import 'hookrun.data.shapez'.*did you mean"):
        hookrun.run({**base, "output": {"path": str(tmp_path / "bad.h5")}, "probe": {**block, "test_data": bad}},
                    model=model)
    assert not (tmp_path / "bad.h5").exists()


@pytest.mark.slow
def test_inspect_plot_report_and_a_sweep_over_C(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    small = ["experiment=probe_shapes", "data.dataset.size=64", "data.batch_size=32", "probe.at=[block1,block3]"]
    one = tmp_path / "one"
    r = warm(["-m", "hookrun", *small, f"hydra.run.dir={one}"], env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    t = hookrun.open_run(one).probes()
    out = warm(["-m", "hookrun.inspect", str(one)], env=env,
               timeout=300).stdout
    for row in t:
        assert f"{row['at']}" in out and f"test {row['test']:.3f}" in out
    r = warm(["-m", "hookrun.plot", str(one)], env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert any(p.name.startswith("probe_depth") for p in (one / "figures").iterdir())
    from hookrun.analysis.report.plotly_figures import to_plotly
    from hookrun.cli import figures
    from hookrun.runner.kinds.probe.reader import MAJORITY, depth_figure

    with h5py.File(next(one.glob("*.h5")), "r") as f:
        spec = depth_figure(f)
    assert spec.series["test accuracy"] == t.column("test") and spec.series["control task (test)"] == t.column("control")
    assert spec.series[MAJORITY] == t.column("majority") and spec.references == (MAJORITY,)
    drawn = {line.get_label(): line for line in figures.lines(spec).axes[0].get_lines()}
    assert drawn[MAJORITY].get_linestyle() == "--" and drawn[MAJORITY].get_marker() in ("None", None, "")
    assert drawn["test accuracy"].get_marker() == "o"  # (the probe's own scores keep their markers)
    assert [d["line"]["dash"] for d in to_plotly(spec)["data"] if d["name"] == MAJORITY] == ["dash"]
    r = warm(["-m", "hookrun.report", str(one)], env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Linear probes by depth" in (one / "report.html").read_text()
    sweep = tmp_path / "sweep"
    r = warm(["-m", "hookrun", "-m", *small, "probe.C=0.01,100", f"hydra.sweep.dir={sweep}"],
             env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    table = hookrun.open_sweep(sweep).table()
    with pytest.raises(AttributeError, match=r"^a sweep has no probes\(\): its jobs' numbers are one table, sweep.table"):
        hookrun.open_sweep(sweep).probes()  # (a run's method asked of the sweep: where the numbers are)
    rows = {r_["probe.C"]: r_ for r_ in table}
    for C in (0.01, 100):
        want = hookrun.open_run(sweep / str([0.01, 100].index(C))).probes()
        assert rows[C]["test@block3"] == want[1]["test"]
        assert rows[C]["probe converged"] is all(want.column("converged"))  # (a job stopped at max_iter: False)
    # plot on the sweep: test score against C (two jobs), and the kind's chart of every job by depth
    from hookrun.analysis.kind_readers import kind_sweep_figures
    from hookrun.cli.plot_command import plot_sweep

    names = {p.name for p in plot_sweep(hookrun.open_sweep(sweep), tmp_path / "fig")}
    assert {"probe_sweep_test_by_depth.png", "sweep_test_block3_vs_probe.C.png"} <= names, names
    ((stem, chart),) = kind_sweep_figures(hookrun.open_sweep(sweep))
    assert chart.x == ["block1", "block3"] and chart.series == {
        f"probe.C={C}": hookrun.open_run(sweep / str(i)).probes().column("test") for i, C in enumerate([0.01, 100])}
