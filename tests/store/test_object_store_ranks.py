"""A cache in an object store written by many ranks (issue 22: "the merged view of many ranks covers
every rank's parts"), against moto's S3 server on 127.0.0.1. The reference is independent: the same
command run by one process into a local file, read with h5py; the bucket is read with boto3 and
h5py (the top manifest, each rank's manifest, each listed part), never through hookrun."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from moto_s3 import BUCKET, moto_bucket, s3_env
from rank_runs import ARGS, ENV, TORCHRUN, captures, cli

import hookrun
from hookrun.errors import ConfigError

PREFIX = "cache/captures.h5"
URL = f"s3://{BUCKET}/{PREFIX}"
PART = ["output.part_bytes=60000"]  # a part per batch (a batch of 4 holds 65 kB of features.0): several per rank


s3 = pytest.fixture(moto_bucket)  # moto's S3 server on 127.0.0.1 with an empty bucket, for this test only


def read_bucket(client) -> tuple[dict, list[dict], list[h5py.File]]:
    """The top manifest, each rank's manifest and every part they list, with boto3 and h5py only."""
    def get(key: str) -> bytes:
        return client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/{key}")["Body"].read()

    top = json.loads(get("manifest.json"))
    ranks = [json.loads(get(name)) for name in top["ranks"]]
    parts = [h5py.File(io.BytesIO(get(p["name"])), "r") for m in ranks for p in m["parts"]]
    return top, ranks, parts


def rows_of(f: h5py.File, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A capture's rows and the sample (or batch) number of each, from the attributes docs/format.md
    describes: its own `index` dataset where it has one, else the file's batches or samples in order."""
    ds = f[name]
    index = ds.attrs.get("index", "")
    if index:
        numbers = ds.parent[index][()]
    elif ds.attrs["rows"] == "steps":
        numbers = np.unique(f["samples/step"][()])[: ds.shape[0]]
    else:
        numbers = f["samples/index"][: ds.shape[0]]
    return ds[()], numbers


def assert_bucket_equals(client, single: Path) -> tuple[dict, list[dict]]:
    """Every capture and /samples dataset of the parts, one after the other in rank order, equals
    the one-process file row by row (values, dtypes, shapes, and each row's sample or batch). A
    capture recorded with `limit: N` holds each rank's first N rows; the run's are the first N."""
    top, ranks, parts = read_bucket(client)
    with h5py.File(single) as f:
        for name in captures(single):
            if name.startswith("samples/"):
                got, want = np.concatenate([p[name][()] for p in parts]), f[name][()]
            else:
                held = [rows_of(p, name) for p in parts if name in p]
                got, numbers = np.concatenate([h[0] for h in held]), np.concatenate([h[1] for h in held])
                want, want_numbers = rows_of(f, name)
                if "limit" in f[name].attrs:
                    got, numbers = got[: f[name].attrs["limit"]], numbers[: f[name].attrs["limit"]]
                np.testing.assert_array_equal(numbers, want_numbers, err_msg=name)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            np.testing.assert_array_equal(got, want, err_msg=name)
    for p in parts:
        p.close()
    return top, ranks


@pytest.mark.slow
def test_torchrun_two_ranks_to_the_bucket_equal_one_process_row_by_row(s3, tmp_path, single, monkeypatch, capsys):
    server, client = s3
    proc = cli(*ARGS, *PART, f"output.path={URL}", "hydra.run.dir=run", cwd=tmp_path, launcher=TORCHRUN,
               env=s3_env(server))
    assert proc.returncode == 0, proc.stderr[-3000:]
    top, ranks = assert_bucket_equals(client, single)
    assert top["status"] == "complete" and top["ranks"] == ["manifest.rank-00000.json", "manifest.rank-00001.json"]
    assert top["attrs"]["world_size"] == 2 and top["attrs"]["incomplete_ranks"] == ""
    assert [m["status"] for m in ranks] == ["complete", "complete"]
    # each rank a contiguous block of whole batches (22 samples in 6 batches: 0-2 and 3-5), several parts each
    assert [[m["parts"][0]["steps"][0], m["parts"][-1]["steps"][1]] for m in ranks] == [[0, 3], [3, 6]]
    assert all(len(m["parts"]) >= 2 and all(p["name"].startswith(f"rank-{r:05d}/") for p in m["parts"])
               for r, m in enumerate(ranks))
    assert not list((tmp_path / "run").glob("*.parts/part-*"))  # every part uploaded and removed locally
    # hookrun's reader takes the URL as one run: the loader, split by rank, and inspect
    with hookrun.open_run(URL, cache_dir=tmp_path / "cache") as run, h5py.File(single) as f:
        assert run.status == "complete" and run.attrs["samples_complete"] == 22 and run.attrs["steps_complete"] == 6
        want = f["captures/fmap/features.0/output"][()].reshape(22, -1)
        for epoch in range(2):
            rows, xs = [], []
            for rank in range(2):
                loader = run.loader("fmap/features.0/output", batch_size=3, seed=5, rank=rank, world_size=2,
                                    with_rows=True, buffer_bytes=6 * want.shape[1] * 4)
                loader.set_epoch(epoch)
                for x, r in loader:
                    xs.append(x.reshape(len(x), -1))
                    rows.append(r)
            r = torch.cat(rows).numpy()
            assert sorted(r.tolist()) == list(range(22))  # every row exactly once per epoch, over both ranks
            np.testing.assert_array_equal(torch.cat(xs).numpy(), want[r])
        first = torch.cat([x for x in run.loader("first/head/output", batch_size=4, shuffle=False)]).numpy()
        np.testing.assert_array_equal(first, f["captures/first/head/output"][()])  # limit 6: the run's first 6
        assert run.stats("first/head/output")["max"] == f["captures/first/head/output"][()].max()
        np.testing.assert_array_equal(run["pg", "head.weight", "grad"][:], f["captures/pg/head.weight/grad"][()])
        np.testing.assert_array_equal(run["first", "head", "output"][:], f["captures/first/head/output"][()])
    from hookrun.cli.inspect_command import main as inspect_main

    monkeypatch.setenv("HOOKRUN_CACHE_DIR", str(tmp_path / "cache2"))
    capsys.readouterr()  # `python -m hookrun.inspect URL --no-stats`'s main, in this process
    code, out = inspect_main([URL, "--no-stats"]), capsys.readouterr()
    assert code in (0, None), out.err[-2000:]
    assert "status    complete   (6 batches, 22 samples)" in out.out
    assert "ranks     2" in out.out and "fmap/features.0/output" in out.out
    assert not (tmp_path / "cache2").exists() or not list((tmp_path / "cache2").rglob("*.h5"))  # nothing downloaded


@pytest.mark.slow
def test_a_killed_rank_leaves_an_incomplete_cache_that_resume_completes(s3, tmp_path, single):
    server, client = s3
    args = [*ARGS, *PART, f"output.path={URL}", "hydra.run.dir=run"]
    proc = cli(*args, cwd=tmp_path, launcher=TORCHRUN, env={**s3_env(server), "HOOKRUN_TEST_KILL": "1:4"})
    assert proc.returncode != 0
    top, ranks, parts = read_bucket(client)
    for p in parts:
        p.close()
    assert top["status"] in ("incomplete", "running") and ranks[1]["status"] == "running"
    if top["status"] == "incomplete":  # rank 0 was stopped by torchrun and wrote the top manifest
        assert "rank 1 (running" in top["attrs"]["incomplete_ranks"]
    with hookrun.open_run(URL, cache_dir=tmp_path / "cache") as run:  # what is there reads, and says what is not
        assert run.status != "complete" and "rank 1" in run.summary(stats=False)
    with pytest.raises(ConfigError, match=r"resume: .* holds the parts of a 2-process run; resume it with"):
        hookrun.run({"model": {"_target_": "my_pkg.Net", "width": 4}, "data": {"dataset": {"_target_": "my_pkg.MyData"}},
                     "output": {"path": URL, "staging": str(tmp_path / "one")}, "resume": True, "device": "cpu"})
    proc = cli(*args, "resume=true", cwd=tmp_path, launcher=TORCHRUN, env=s3_env(server))
    assert proc.returncode == 0, proc.stderr[-3000:]
    top, ranks = assert_bucket_equals(client, single)
    assert top["status"] == "complete" and [m["status"] for m in ranks] == ["complete", "complete"]


@pytest.mark.slow
def test_submitit_style_tasks_to_the_bucket_equal_one_process(s3, tmp_path, single):
    """Two tasks started by hand with submitit's variables (the rendezvous is a FileStore in the
    staging folder, as under Hydra's submitit launchers and srun)."""
    server, client = s3
    procs = []
    for rank in range(2):
        env = {**os.environ, **ENV, **s3_env(server), "SUBMITIT_LOCAL_JOB_ID": f"s{os.getpid()}",
               "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_GLOBALID": str(rank), "SUBMITIT_LOCAL_LOCALID": str(rank)}
        procs.append(subprocess.Popen([sys.executable, "-m", "hookrun", *ARGS, *PART, f"output.path={URL}",
                                       "hydra.run.dir=run"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    top, ranks = assert_bucket_equals(client, single)
    assert top["status"] == "complete" and top["attrs"]["launcher"] == "submitit"


@pytest.mark.slow
def test_a_taken_url_is_refused_on_every_rank_in_one_line(s3, tmp_path):
    server, client = s3
    client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/manifest.json", Body=b"{}")  # an earlier run's
    again = cli(*ARGS, *PART, f"output.path={URL}", "hydra.run.dir=run", cwd=tmp_path, launcher=TORCHRUN, env=s3_env(server))
    lines = [ln for ln in again.stderr.splitlines() if ln.startswith("hookrun:")]
    assert again.returncode != 0 and len(lines) == 1 and "exists (it has a manifest.json)" in lines[0], again.stderr[-2000:]
    assert [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET)["Contents"]] == [f"{PREFIX}/manifest.json"]


def test_rank_outputs_own_only_their_objects_and_a_reader_derives_the_status(tmp_path):
    """Units over memory://: which objects a rank replaces, and the run's status from its ranks'."""
    from hookrun.output.objects.manifest import Manifest
    from hookrun.output.objects.object_folder import RemoteFolder
    from hookrun.output.objects.parts import ObjectStoreOutput
    from hookrun.output.objects.ranked import begin_ranks, check_ranked_output, combined_status

    url = "memory://ranks-unit/run/captures.h5"
    folder = RemoteFolder.open(url, check=False)
    for name in ("manifest.json", "part-00000.h5", "manifest.rank-00000.json", "rank-00000/part-00000.h5",
                 "manifest.rank-00001.json", "rank-00001/part-00003.h5", "manifest.rank-00002.json",
                 "rank-00002/part-00000.h5", "notes.txt"):
        folder.write_text(name, "x")
    one = ObjectStoreOutput.of(url, str(tmp_path))
    r1 = ObjectStoreOutput(one.url, one.staging, rank=1)
    assert r1.owns("rank-00001/part-00003.h5") and r1.owns("manifest.rank-00001.json")
    assert not r1.owns("rank-00000/part-00000.h5") and not r1.owns("manifest.json") and one.owns("manifest.json")
    assert r1.parts_dir == tmp_path / "captures.h5.rank-00001.parts" and r1.part(3) == "rank-00001/part-00003.h5"
    with pytest.raises(ConfigError, match="exists"):
        check_ranked_output(url, 2, overwrite=False, resume=False)
    with pytest.raises(ConfigError, match=r"resume: .* is not a hookrun manifest"):
        check_ranked_output(url, 2, overwrite=False, resume=True)
    begin_ranks(url, 2, {"config": "{}"}, resume=False)  # rank 0: a one-process run's parts and rank 2 go
    left = {p.split("captures.h5/", 1)[1] for p in folder.fs.find(folder.root)}
    assert left == {"manifest.json", "manifest.rank-00000.json", "rank-00000/part-00000.h5", "manifest.rank-00001.json",
                    "rank-00001/part-00003.h5", "notes.txt"}  # each rank clears its own; not hookrun's: kept
    top = Manifest.from_json(folder.read_text("manifest.json"))
    assert top.status == "running" and top.ranks == ["manifest.rank-00000.json", "manifest.rank-00001.json"]
    check_ranked_output(url, 2, overwrite=False, resume=True)  # the same number of processes
    for world in (1, 3):
        with pytest.raises(ConfigError, match=rf"written by 2 process\(es\) and this run has {world}; resume with 2"):
            check_ranked_output(url, world, overwrite=False, resume=True)
    done, running = Manifest(url, "complete"), Manifest(url, "running")
    assert combined_status(top, [done, done]).status == "complete"  # whatever the top says
    assert combined_status(top, [done, running]).status == "running"
    top.status = "incomplete"
    state = combined_status(top, [done, None])
    assert state.status == "incomplete" and state.incomplete == ["rank 1 (missing)"]
