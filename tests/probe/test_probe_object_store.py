"""A probe run to an object store (output.path s3://..., moto's S3 server on 127.0.0.1) SIGKILLed
mid-pass and resumed gives the uninterrupted one-process probes of a local file bit for bit, one
process or two ranks (torchrun), and those equal scikit-learn's Ridge on raw-hook features
(test_probe_ranks.reference). Two ranks go through the states of test_probe_rank_resume.py: rank 1
killed mid-pass; resumed, rank 0 killed once rank 1 had handed its rows over and its manifest said
complete; resumed again, rank 1 rebuilds its rows from its complete shard (rejoin). Rank 1's rows
reach rank 0 through the staging folder (the run folder), never a path made of the URL, and nothing
is left there at the end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from moto_s3 import BUCKET, moto_bucket, s3_env
from rank_runs import TORCHRUN, cli
from test_probe_rank_resume import KILLS
from test_probe_ranks import ARGS, AT, assert_same_probes, one_process, reference

import hookrun

s3 = pytest.fixture(moto_bucket)  # moto's server, a clean bucket: the object-store tests' fixture
PREFIX = "probe/captures.h5"
URL = f"s3://{BUCKET}/{PREFIX}"
RUN = [*ARGS, KILLS, "output.flush_every=1", "hydra.run.dir=run", f"output.path={URL}"]  # 5 batches


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    """The experiment's block, uninterrupted, one process, to a local file (in this process)."""
    return one_process(tmp_path_factory.mktemp("one") / "one.h5")


def status(client, name: str = "manifest.json") -> str:
    """A manifest's status, read with boto3."""
    return json.loads(client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/{name}")["Body"].read())["status"]


def assert_one_process_probes(tmp_path, one, sklearn: bool = False) -> None:
    with hookrun.open_run(URL, cache_dir=tmp_path / "cache") as got, hookrun.open_run(one) as want:
        assert got.status == "complete"
        assert_same_probes(got, want, sklearn)  # the same rows, recomputed, in the same blocks: bit for bit


@pytest.mark.slow
def test_one_process_killed_mid_pass_resumes_to_the_local_probes(s3, tmp_path, one):
    server, client = s3
    run = [*RUN, "output.part_bytes=1"]  # a part per batch: the kept batches are uploaded parts
    killed = cli(*run, cwd=tmp_path, env={**s3_env(server), "HOOKRUN_TEST_KILL": "0:3"})  # its 4th batch
    assert killed.returncode != 0
    assert status(client) == "running"
    resumed = cli(*run, "resume=true", cwd=tmp_path, env=s3_env(server))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "probe: the rows of the 3 kept batch(es) recomputed" in resumed.stdout + resumed.stderr
    assert status(client) == "complete"
    assert_one_process_probes(tmp_path, one)
    assert not list((tmp_path / "run").glob(".*probe*"))


@pytest.mark.slow
def test_two_ranks_killed_twice_resume_to_the_one_process_probes(s3, tmp_path, one):
    server, client = s3
    run = tmp_path / "run"
    killed = cli(*RUN, cwd=tmp_path, launcher=TORCHRUN, env={**s3_env(server), "HOOKRUN_TEST_KILL": "1:3"})
    assert killed.returncode != 0  # rank 1 killed at its 2nd batch (rank 0 runs 0-1, rank 1 runs 2-4)
    assert status(client, "manifest.rank-00001.json") == "running"
    assert status(client, "manifest.rank-00000.json") != "complete"

    env = {**s3_env(server), "HOOKRUN_TEST_KILL_AFTER": "0:1", "HOOKRUN_TEST_RUN_DIR": str(run),
           "HOOKRUN_TEST_RANK_1_MANIFEST": f"{URL}/manifest.rank-00001.json"}  # rank 0, its last batch
    killed = cli(*RUN, "resume=true", cwd=tmp_path, launcher=TORCHRUN, env=env)
    assert killed.returncode != 0
    assert "rank 1: probe: the rows of the 1 kept batch(es) recomputed" in killed.stdout + killed.stderr
    assert status(client, "manifest.rank-00001.json") == "complete"
    assert status(client, "manifest.rank-00000.json") != "complete"
    assert len(list(run.glob(".hookrun-probe-*.rank-00001"))) == 1  # handed over in the staging folder, never merged

    resumed = cli(*RUN, "resume=true", cwd=tmp_path, launcher=TORCHRUN, env=s3_env(server))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "rank 1: probe: the rows of the 3 kept batch(es) recomputed" in resumed.stdout + resumed.stderr  # rejoin
    assert [status(client, n) for n in ("manifest.json", "manifest.rank-00000.json", "manifest.rank-00001.json")] == \
        ["complete"] * 3
    assert_one_process_probes(tmp_path, one, sklearn=True)
    assert not list(run.glob(".hookrun-probe-*")) and not list(run.glob(".*probe_rows*"))  # merged and removed
    assert not (tmp_path / "s3:").exists() and not list(tmp_path.rglob(f"*{BUCKET}*"))  # no local path made of the URL


def test_an_object_store_runs_spilled_rows_go_to_its_staging_folder(s3, tmp_path, one, monkeypatch):
    """Rows beyond `memory` spill to a file in output.staging (the CLI's run folder), as a local run's
    go beside its file, never to the system's temporary folder; the probes equal the rows held."""
    from hookrun.runner.kinds.probe.rows import RowStore

    spills, real = [], RowStore._spill
    monkeypatch.setattr(RowStore, "_spill", lambda self: (spills.append(Path(self.spill_path)), real(self))[1])
    stage = tmp_path / "stage"
    stage.mkdir()
    one_process(URL, {"staging": str(stage)}, memory="10KB")
    assert spills and all(p.parent.parent == stage for p in spills), spills
    assert not list(stage.glob(".probe_rows_*"))  # removed at the end
    with hookrun.open_run(URL, cache_dir=tmp_path / "cache") as got, hookrun.open_run(one) as want:
        assert_same_probes(got, want, sklearn=False, exact=False)  # spilled blocks: the sums in another order


def test_inspect_of_the_url_prints_the_probes_as_scikit_learn_scores_them(s3, tmp_path, monkeypatch, capsys):
    """`python -m hookrun.inspect URL` of a probe run: its parts fetched, the probe lines of a local file's
    summary, the test scores scikit-learn's (was: 'captures (none)' and not a line of the probes); with
    --no-stats (the manifest alone), a line saying where they are."""
    from hookrun.cli.inspect_command import main

    monkeypatch.setenv("HOOKRUN_CACHE_DIR", str(tmp_path / "cache"))
    one_process(URL)
    assert main([URL]) in (0, None)
    out = capsys.readouterr().out
    for at in AT:
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(f"{at} "))
        assert f"test {reference(at)[2]:.3f}" in line, out
    assert main([URL, "--no-stats"]) in (0, None)
    out = capsys.readouterr().out
    assert "  probe     its results are in the parts: inspect without --no-stats fetches them" in out.splitlines()
