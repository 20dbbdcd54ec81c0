"""Reading back odd runs: a file without a config, a sweep with an unreadable job, a module name with
a slash, the plots of two runs in one folder. References: plain h5py and the files' own layout."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from conftest import make_cfg
from toy_runs import toy_cfg

import hookrun
from hookrun.analysis.sweep import open_sweep
from hookrun.cli.inspect_command import main as inspect_main


def test_inspect_a_file_without_config(tmp_path, capsys):
    with h5py.File(tmp_path / "bare.h5", "w") as f:
        f.attrs["format_version"] = "1"
        f.create_dataset("samples/index", data=np.arange(3))
    assert inspect_main([str(tmp_path / "bare.h5")]) == 0
    assert "status    unknown" in capsys.readouterr().out


def test_sweep_table_shows_an_unreadable_job_and_goes_on(tmp_path):
    for num in ("0", "1"):
        job = tmp_path / num
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- seed={num}\n")
        hookrun.run(toy_cfg(job, seed=int(num)))
    (tmp_path / "0" / "captures.h5").write_bytes(b"not HDF5 at all")
    table = open_sweep(tmp_path).table()
    assert len(table) == 2
    assert table[0]["status"].startswith("unreadable: ") and "not a readable HDF5 file" in table[0]["status"]
    assert table[1]["status"] == "complete" and "b/body/output:mean" in table.columns


def test_a_sweep_with_a_null_value_a_resumed_job_and_a_running_one_plots_what_it_is(tmp_path):
    """`-m data.limit=null,1` (a null among numbers), a job resumed (`resume=true` is how it ran, not a
    parameter) and a job whose file says running: the table swept by data.limit alone, the chart drawn
    with null as a category, and its title saying which job's point is partial."""
    from hookrun.analysis.report.figure_specs import sweep_charts, sweep_metrics
    from hookrun.cli.plot_command import plot_sweep

    for num, given in (("0", ["data.limit=null"]), ("1", ["data.limit=1", "resume=true"]), ("2", ["data.limit=2"])):
        job = tmp_path / num
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in given))
        hookrun.run(toy_cfg(job, seed=int(num)))
    with h5py.File(tmp_path / "2" / "captures.h5", "r+") as f:
        f.attrs["status"] = "running"
    sweep = open_sweep(tmp_path)
    assert sweep.swept == ["data.limit"] and "resume" not in sweep.table().columns
    table = sweep.table(stats=("mean",))
    charts = sweep_charts(table, sweep.swept, sweep_metrics(table, sweep.swept))
    assert charts and all(c.x == [1, 2, None] for c in charts), [c.x for c in charts]
    assert all(c.title.endswith("against data.limit (job 2 not complete: its points partial)") for c in charts)
    drawn = plot_sweep(sweep, tmp_path / "figures")
    assert drawn and all(p.stat().st_size > 0 for p in drawn)


def test_a_sweep_folder_whose_jobs_left_nothing_says_so(tmp_path, capsys):
    """A sweep whose first job failed before its first batch leaves Hydra's multirun.yaml alone (the
    job's folder is removed): each reader says what the folder is, not "no file .../captures.h5"."""
    from hookrun.errors import NotFoundError

    (tmp_path / "multirun.yaml").write_text("hydra: {}\n")
    for read in (hookrun.open_run, open_sweep):
        with pytest.raises(NotFoundError, match=r"is a sweep folder \(multirun.yaml\) with no job's run in it"):
            read(tmp_path)
    assert inspect_main([str(tmp_path)]) == 2
    assert "is a sweep folder (multirun.yaml) with no job's run in it" in capsys.readouterr().err


def test_a_module_name_with_a_slash_is_reachable_by_its_label(tmp_path):
    hooks = {"p": {"at": "parts.a/b", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    path = hookrun.run(toy_cfg(tmp_path, "toy_models.WithSpare", hooks)).path
    with hookrun.open_run(path) as run:
        (info,) = run.captures
        assert info.label == "p/parts.a/b/output" and info.path == "/captures/p/parts.a%2Fb/output"
        assert run["p/parts.a/b/output"].shape == (12, 8)
        assert run["parts.a/b", "output"].shape == (12, 8)


def test_plots_of_two_runs_into_one_folder_never_replace_each_other(tmp_path, checkpoint):
    pytest.importorskip("matplotlib")
    from hookrun.cli import plot_command as plot

    hooks = {"l": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    a = hookrun.run(make_cfg(tmp_path / "a", checkpoint, hooks)).path
    b = hookrun.run(make_cfg(tmp_path / "b", checkpoint, hooks, seed=3, **{"data.dataset.seed": 9})).path
    assert plot.main([str(a)]) == 0
    assert sorted(p.name for p in (a.parent / "figures").glob("*.png")) == ["fmap_l__layer2__output.png", "hist_l__layer2__output.png"]
    out = tmp_path / "shared"
    assert plot.main([str(a), "--out", str(out)]) == 0
    first = {p.name: p.read_bytes() for p in out.glob("*.png")}
    assert plot.main([str(b), "--out", str(out)]) == 0
    after = {p.name: p.read_bytes() for p in out.glob("*.png")}
    assert all(after[name] == data for name, data in first.items())  # run a's figures are untouched
    assert len(after) == 2 * len(first)
    assert plot.main([str(a), "--out", str(out)]) == 0  # the same run again: its own figures are refreshed
    assert len(list(out.glob("*.png"))) == 2 * len(first)
