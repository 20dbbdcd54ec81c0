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
    from hookrun.analysis.report.sweep_charts import sweep_charts, sweep_metrics
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


@pytest.fixture(scope="module")
def cli_sweeps(tmp_path_factory):
    """Two sweeps as Hydra makes them: one of 2 x 2 jobs nested as `N/run` with a string parameter
    that matplotlib and plotly would read as markup, and one whose second job is refused by its plan on the
    model (the third never starts)."""
    from conftest import run_cli

    here = tmp_path_factory.mktemp("sweeps")
    small = ["data.limit=1", "data.batch_size=2", "progress=false"]
    nested = run_cli("-m", "experiment=ablate_layer3", "params.factor=0,1", '+params.tag="$\\frac$","<b>x</b>"', *small,
                     "hydra.sweep.dir=tag", "hydra.sweep.subdir=${hydra.job.num}/run", cwd=here)
    assert nested.returncode == 0, nested.stderr[-2000:]
    assert "hookrun: sweep folder: tag (4 jobs; python -m hookrun.inspect tag)" in nested.stdout  # (it said 0 jobs)
    refused = run_cli("-m", "experiment=ablate_layer3", "hooks.ablate.at=layer3,layer9,layer4", "params.factor=0",
                       *small, "hydra.sweep.dir=bad", cwd=here)
    assert refused.returncode == 2 and "hookrun: error: hooks.ablate.at: ResNet has no module 'layer9'; closest names: layer4, " \
        "layer3, layer2, layer1, layer4.1" in refused.stderr  # (refused on the model: by job 1 itself)
    return here


def test_a_sweep_of_other_overrides_into_an_earlier_sweeps_folder_leaves_its_record(cli_sweeps):
    """Its jobs were each refused ("exists"), but Hydra had rewritten multirun.yaml first: the earlier
    sweep then listed the new sweep's jobs as its own, and --verify failed on it."""
    from conftest import run_cli

    record = (cli_sweeps / "bad" / "multirun.yaml").read_bytes()
    again = run_cli("-m", "experiment=ablate_layer3", "params.factor=5,6", "data.limit=1", "hydra.sweep.dir=bad", cwd=cli_sweeps)
    assert again.returncode == 2 and again.stderr.startswith("hookrun: error: hydra.sweep.dir=bad: an earlier sweep of other "
                                                             "overrides is there (experiment=ablate_layer3 hooks.ablate.at=layer3,layer9,layer4")
    assert (cli_sweeps / "bad" / "multirun.yaml").read_bytes() == record and not (cli_sweeps / "bad" / "2").exists()


def test_a_nested_sweeps_jobs_values_and_charts_are_what_hydra_ran(cli_sweeps):
    """Jobs found in `N/run`, each override's value as the job's own config holds it (a backslash is no
    YAML escape), each value once on a chart's axis with a point per job, and plotly given the
    values as text, never markup. References: each job's .hydra/config.yaml and its file by h5py."""
    import yaml

    from hookrun.analysis.report.plotly_figures import to_plotly
    from hookrun.analysis.report.sweep_charts import sweep_charts

    sweep = open_sweep(cli_sweeps / "tag")
    assert [j.num for j in sweep.jobs] == ["0/run", "1/run", "2/run", "3/run"] and sweep.swept == ["params.factor", "params.tag"]
    means = {}
    for job in sweep.jobs:
        params = yaml.safe_load((job.folder / ".hydra" / "config.yaml").read_text())["params"]
        assert job.overrides["params.tag"] == params["tag"] and job.overrides["params.factor"] == params["factor"]
        with h5py.File(job.file, "r") as f:
            means[(params["factor"], params["tag"])] = float(np.mean(f["captures/logits/fc/output"][()], dtype=np.float64))
    assert {t for _, t in means} == {"$\\frac$", "<b>x</b>"}
    table = sweep.table(stats=("mean",))
    chart = next(c for c in sweep_charts(table, sweep.swept, ["logits/fc/output:mean"]) if c.xlabel == "params.tag")
    assert chart.x == ["$\\frac$", "<b>x</b>"]
    for factor in (0, 1):
        np.testing.assert_allclose(chart.series[f"params.factor={factor}"], [means[(factor, t)] for t in chart.x], rtol=1e-5)
    shown = to_plotly(chart)
    assert shown["data"][0]["x"] == ["$\\frac$", "&lt;b&gt;x&lt;/b&gt;"]


def test_a_sweep_chart_names_jobs_that_never_ran_apart_from_partial_ones_and_drops_their_values():
    """`params.factor=0.25,1,bad,2.5,4` with jobs 2 and 3 never run and job 4 running: the title said
    "job 2, 3, 4 not complete: their points partial" and the axis kept 2.5 and bad, with no point."""
    from hookrun.analysis.kind_readers import Table
    from hookrun.analysis.report.sweep_charts import sweep_charts
    from hookrun.cli.figures import lines as png_lines

    jobs = [(0.25, "complete", 1.5), (1, "complete", 2.0), ("bad", "not run", None), (2.5, "not run", None), (4, "running", 3.0)]
    table = Table(["job", "params.factor", "status", "ce"], [{"job": i, "params.factor": v, "status": st, "ce": y}
                                                              for i, (v, st, y) in enumerate(jobs)])
    (chart,) = sweep_charts(table, ["params.factor"], ["ce"])
    assert chart.title == "ce against params.factor (job 2, 3 not run: no point; job 4 not complete: its points partial)"
    assert chart.x == [0.25, 1, 4] and chart.series["ce"] == [1.5, 2.0, 3.0]
    assert list(png_lines(chart).axes[0].lines[0].get_xdata()) == [0.25, 1.0, 4.0]


def test_a_sweep_plots_names_with_dollars_as_written(cli_sweeps, tmp_path):
    """'$\\frac$' as a swept value was matplotlib's maths and a parse error (plot exited 1 with a
    traceback); now every text is drawn as written, and formatter numbers stay numbers."""
    from hookrun.cli import figures
    from hookrun.cli.figure_titles import literal_text
    from hookrun.cli.plot_command import main as plot_main

    assert plot_main([str(cli_sweeps / "tag"), "--out", str(tmp_path / "figs")]) == 0
    assert len(list((tmp_path / "figs").glob("*.png"))) == 2
    plt = figures.pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0.001, 0.002])
    ax.set_xticks([0, 1], ["cost $5-$10", "$\\alpha$"])
    ax.set_title("m$\\alpha$ · $\\frac$")
    figures.tidy_ticks(ax.yaxis)
    literal_text(fig)
    fig.canvas.draw()
    texts = [ax.title, *ax.get_xticklabels()]
    assert [t._preprocess_math(t.get_text()) for t in texts] == [("m$\\alpha$ · $\\frac$", False), ("cost $5-$10", False),
                                                                 ("$\\alpha$", False)]
    assert all("\\mathdefault" in t.get_text() for t in ax.get_yticklabels() if t.get_text())  # (still maths: numbers)
    plt.close(fig)


def test_a_sweep_lists_its_refused_and_unstarted_jobs_and_verify_checks_every_job(cli_sweeps, capsys):
    """Job 1 refused on the model (its line on the command's stderr), job 2 never started: the readers
    showed both alike as `not run`, job 1's refusal and its reason lost. Reference: the command's stderr."""
    sweep = open_sweep(cli_sweeps / "bad")
    line = "hooks.ablate.at: ResNet has no module 'layer9'; closest names: layer4, layer3, layer2, layer1, layer4.1"
    assert [(j.num, j.overrides["hooks.ablate.at"], j.file is not None) for j in sweep.jobs] == \
        [("0", "layer3", True), ("1", "layer9", False), ("2", "layer4", False)]
    assert [r["status"] for r in sweep.table()] == ["complete", f"refused: {line}", "not run"]
    assert inspect_main([str(cli_sweeps / "bad")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{cli_sweeps / 'bad'}: 3 jobs, swept: hooks.ablate.at") and f"refused: {line}" in out
    assert inspect_main(["--verify", str(cli_sweeps / "bad")]) == 1
    captured = capsys.readouterr()
    assert "every checked row matches its checksum" in captured.out and f"job 1 ({cli_sweeps / 'bad' / '1'}) was refused: {line}" in captured.err
    assert "job 2 (" in captured.err and "left no folder" in captured.err
    assert inspect_main(["--verify", str(cli_sweeps / "tag")]) == 0
    assert capsys.readouterr().out.count("every checked row matches its checksum") == 4


def test_a_folder_of_runs_is_no_sweep_and_a_run_folder_finds_its_own_file_name(tmp_path, capsys):
    """Two runs side by side without multirun.yaml (outputs/DATE/TIME) are named, not compared as a sweep;
    a run folder whose output.path is acts.h5 is read through its .hydra/config.yaml."""
    from hookrun.analysis.sweep import is_sweep

    for num in ("10-00-00", "10-05-00"):
        job = tmp_path / "day" / num
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- seed={len(num)}\n")
        (job / ".hydra" / "config.yaml").write_text("output:\n  path: acts.h5\n")
        cfg = toy_cfg(job)
        cfg["output"]["path"] = str(job / "acts.h5")
        hookrun.run(cfg)
    assert not is_sweep(tmp_path / "day")
    assert inspect_main([str(tmp_path / "day")]) == 2
    assert "holds no run's file but 2 run folder(s): 10-00-00, 10-05-00; give one of them" in capsys.readouterr().err
    assert inspect_main([str(tmp_path / "day" / "10-00-00"), "--no-stats"]) == 0
    assert "complete" in capsys.readouterr().out


def test_a_local_url_a_finished_sweep_and_another_kinds_reader_each_say_what_they_are(tmp_path, capsys):
    """file:///... was read as 'file:/...' ("no file"); open_run on a sweep whose jobs finished said its
    jobs had not started; run.probes() on a record run was Python's AttributeError."""
    import shutil

    from hookrun.errors import NotFoundError

    path = hookrun.run(toy_cfg(tmp_path / "one")).path
    with hookrun.open_run(f"file://{path}") as run:
        assert run.path == path and run.status == "complete"
    assert inspect_main([f"file://{path}"]) == 0 and str(path) in capsys.readouterr().out
    sweep = tmp_path / "sweep"
    for job in ("0", "1"):
        (sweep / job / ".hydra").mkdir(parents=True)
        (sweep / job / ".hydra" / "config.yaml").write_text("output: {path: captures.h5}\n")
        shutil.copy(path, sweep / job / "captures.h5")
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    with pytest.raises(NotFoundError, match=r"is a sweep folder of 2 job\(s\) \(0, 1\); open_run reads one run: give a "
                                            r"job's folder, e.g. .*/0', or hookrun.open_sweep\(folder\)"):
        hookrun.open_run(sweep)
    with hookrun.open_run(path) as run:
        for method, message in (("probes", "holds no probes"), ("similarity", "is no similarity run"),
                                ("attribution", "is not an attribution run"), ("sae_curves", "is not an sae training run")):
            with pytest.raises(NotFoundError, match=message):
                getattr(run, method)()
        with pytest.raises(AttributeError, match="no attribute 'nothing'"):
            run.nothing()


def test_a_newer_format_or_a_file_without_its_sample_index_is_one_line(tmp_path, capsys):
    """format_version 2 was read as if it were 1; a file without /samples/index was a KeyError in
    report and plot. Reference: the files as h5py writes them."""
    from hookrun.cli.report_command import main as report_main
    from hookrun.errors import HookrunError

    path = hookrun.run(toy_cfg(tmp_path / "one")).path
    newer, broken = tmp_path / "newer.h5", tmp_path / "broken.h5"
    for target in (newer, broken):
        target.write_bytes(path.read_bytes())
    with h5py.File(newer, "a") as f:
        f.attrs["format_version"] = "2"
    with h5py.File(broken, "a") as f:
        del f["samples/index"]
    for target, message in ((newer, r"is in format 2; this hookrun .* reads format 1: read it with the hookrun that wrote it"),
                            (broken, r"has no /samples/index, which every hookrun run writes when it starts")):
        with pytest.raises(HookrunError, match=message):
            hookrun.open_run(target)
        assert inspect_main([str(target)]) == 2 and report_main([str(target)]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 2
