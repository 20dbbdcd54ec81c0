"""A sweep's job folders wherever Hydra's conventions put them, and the sweep charts' titles naming the
jobs with no line. References: each job's file read with h5py, its .hydra/config.yaml."""

from __future__ import annotations

import h5py
import numpy as np
import yaml
from conftest import run_cli

from hookrun.analysis.sweep import is_sweep, open_sweep


def test_a_sweep_whose_subdir_nests_a_value_with_slashes_finds_every_job(tmp_path):
    """`hydra.sweep.subdir=${hydra.job.override_dirname}` with a path as a value (`+params.tag=a/b`)
    puts each job's folder several folders deep: the sweep said "0 jobs", open_sweep listed both
    as "not run" and inspect refused the folder, with both complete files there."""
    done = run_cli("-m", "experiment=ablate_layer3", "params.factor=0.5", "+params.tag=a/b,c/d/e", "data.limit=1",
                   "data.batch_size=2", "progress=false", "hydra.sweep.dir=sw",
                   "hydra.sweep.subdir=${hydra.job.override_dirname}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "hookrun: sweep folder: sw (2 jobs; python -m hookrun.inspect sw)" in done.stdout
    files = sorted(tmp_path.glob("sw/**/captures.h5"))
    assert len(files) == 2 and is_sweep(tmp_path / "sw")
    sweep = open_sweep(tmp_path / "sw")
    table = sweep.table(stats=("mean",))
    assert sweep.swept == ["params.tag"] and len(table) == 2
    for job, row in zip(sweep.jobs, table.rows, strict=True):
        tag = yaml.safe_load((job.folder / ".hydra" / "config.yaml").read_text())["params"]["tag"]
        assert row["status"] == "complete" and row["params.tag"] == tag == job.overrides["params.tag"]
        with h5py.File(job.file, "r") as f:
            assert f.attrs["status"] == "complete"
            mean = float(np.mean(f["captures/logits/fc/output"][()], dtype=np.float64))
        np.testing.assert_allclose(row["logits/fc/output:mean"], mean, rtol=1e-6)
    assert sorted(j.file for j in sweep.jobs) == files


def test_a_probe_sweeps_chart_names_the_jobs_it_has_no_line_for(tmp_path):
    """`probe.at` with a module the model lacks in job 1: job 1 refused (by its run, on the model), job 2
    never started. The chart "one line per job" drew job 0's line alone and said nothing of the two
    others (the generic sweep charts name them)."""
    from hookrun.runner.kinds.probe.reader import sweep_figures

    done = run_cli("-m", "experiment=probe_shapes", "probe.at=[block1,block2,block3,fc],[block1,nope],[fc]",
                   "data.dataset.size=64", "data.batch_size=32", "probe.control=false", "progress=false",
                   "hydra.sweep.dir=sw", cwd=tmp_path)
    assert done.returncode != 0 and "probe.at: TinyCNN has no module 'nope'" in done.stderr
    sweep = open_sweep(tmp_path / "sw")
    assert [r["status"] for r in sweep.table()] == ["complete", "refused: probe.at: TinyCNN has no module 'nope'; top-level "
                                                    "modules: block1, pool1, block2, pool2, block3, fc", "not run"]
    ((name, chart),) = sweep_figures(sweep)
    assert chart.title == "linear probes: test score by depth, one line per job (job 1 refused: no line; job 2 not run: no line)"
    with h5py.File(tmp_path / "sw" / "0" / "captures.h5", "r") as f:
        tests = {str(g.attrs["module"]): float(g.attrs["test_score"]) for g in f["probe"].values()}
    assert chart.series == {"probe.at=['block1', 'block2', 'block3', 'fc']": [tests[at] for at in chart.x]}
    assert chart.x == ["block1", "block2", "block3", "fc"]


def test_an_sae_sweeps_charts_name_the_jobs_they_have_no_point_for():
    """Two SAE jobs with figures, one failed before its first step's and one never run: the frontier
    chart's title named neither."""
    from hookrun.analysis.kind_readers import Table
    from hookrun.runner.kinds.sae.reader import sweep_figures

    rows = [{"job": "0", "sae.k": 4, "status": "complete", "l0": 4.0, "explained_variance": 0.5, "ce_loss_score": 0.9},
            {"job": "1", "sae.k": 8, "status": "complete", "l0": 8.0, "explained_variance": 0.7},
            {"job": "2", "sae.k": 16, "status": "failed"}, {"job": "3", "sae.k": 32, "status": "not run"},
            {"job": "4", "sae.k": 64, "status": "complete", "l0": 64.0, "explained_variance": 0.9, "ce_loss_score": 0.95}]

    class Sweep:
        swept = ["sae.k"]

        def table(self, captures=None):
            return Table(["job", "sae.k", "status", "l0", "explained_variance", "ce_loss_score"], rows)

    (_, frontier), (_, scored) = sweep_figures(Sweep())
    assert frontier.title == "SAE sweep: sparsity against reconstruction (job 2 failed: no point; job 3 not run: no point)"
    assert list(frontier.x) == [4.0, 8.0, 64.0] and list(frontier.y) == [0.5, 0.7, 0.9]
    assert scored.title == ("SAE sweep: sparsity against the spliced model's loss recovered (job 1 complete: no point; "
                            "job 2 failed: no point; job 3 not run: no point)")


def test_open_sweep_of_an_object_store_url_says_what_it_reads():
    """open_sweep('s3://bucket/sweep') said "no folder 's3:/bucket/sweep'": the URL bent into a path
    and no word of what to give."""
    import pytest

    from hookrun.errors import NotFoundError

    with pytest.raises(NotFoundError, match=r"^'s3://bucket/sweep' is an object-store URL; open_sweep reads the sweep "
                                            r"folder Hydra wrote on this machine \(outputs/multirun/DATE/TIME\); open a "
                                            r"run in the store with open_run\(URL\)$"):
        open_sweep("s3://bucket/sweep")


def test_a_sweeps_capture_columns_and_charts_follow_depth_not_text_order(tmp_path):
    """MobileNet's features.0 .. features.12 recorded in two jobs: the sweep table's columns (inspect's,
    the report's) and its charts went features.0, features.1, features.10, features.11, features.12,
    features.2 (the file's text order); the report's captures section orders them by depth."""
    from hookrun.analysis.report import sweep_data

    done = run_cli("-m", "model=resnet18", "model._target_=torchvision.models.mobilenet_v3_small", "model.num_classes=4",
                   "data.dataset.size=4", "data.dataset.image_size=[3,32,32]", "data.batch_size=4",
                   "seed=0,1", "+hooks={f: {at: 'features.*', type: forward, actions: [{name: record, what: output}]}}",
                   "progress=false", "hydra.sweep.dir=sw", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    sweep = open_sweep(tmp_path / "sw")
    depth = [f"f/features.{i}/output" for i in range(13)]
    with h5py.File(sweep.jobs[0].file, "r") as f:
        assert sorted(f["captures/f"]) != [d.split("/")[1] for d in depth]  # (the file lists them in text order)
    columns = [c.split(":")[0] for c in sweep.table(stats=("mean",)).columns if c.startswith("f/")]
    assert columns == depth
    (sweep_section,) = [s for s in sweep_data(sweep)["sections"] if s["id"] == "sweep"]
    charts = [f["figure"]["layout"]["yaxis"]["title"]["text"] for f in sweep_section["items"][1]["figures"]]
    assert [c.split(":")[0] for c in charts] == depth
