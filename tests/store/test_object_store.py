"""Caches in an object store (issue 22), against a real S3 API: moto's server on 127.0.0.1, started
by each test and stopped after it. The references are independent: the same run written to a local
file and read with h5py, and the bucket's objects read with boto3 and h5py."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import yaml
from conftest import ROOT
from moto_s3 import (
    BATCH,
    BUCKET,
    KEY_ID,
    RUNNER,
    SECRET,
    URL,
    N,
    Server,
    StopsTheStore,
    assert_same_as_local,
    bucket_parts,
    cfg,
    local_run,
    moto_bucket,
)

import hookrun
from hookrun.errors import ConfigError, HookrunError, NotFoundError
from hookrun.output.process import Interrupted

s3 = pytest.fixture(moto_bucket)  # moto's server, a clean bucket


def test_a_cache_in_the_bucket_equals_the_same_run_written_locally(s3, tmp_path):
    server, client = s3
    result = hookrun.run(cfg(URL, tmp_path))
    assert result.status == "complete" and result.steps == N // BATCH and str(result.path) == URL
    manifest = assert_same_as_local(client, local_run(tmp_path))
    assert manifest["status"] == "complete" and len(manifest["parts"]) >= 3  # tiny parts: several
    steps = [p["steps"] for p in manifest["parts"]]
    assert steps[0][0] == 0 and steps[-1][1] == N // BATCH and all(a[1] == b[0] for a, b in zip(steps, steps[1:], strict=False))
    assert sum(p["samples"] for p in manifest["parts"]) == N
    assert not list((tmp_path / "stage" / "captures.h5.parts").glob("part-*"))  # every part uploaded, removed locally
    # each object is what the manifest says: size and MD5 of the bytes in the bucket
    import hashlib
    for p in manifest["parts"]:
        body = client.get_object(Bucket=BUCKET, Key=f"cache/captures.h5/{p['name']}")["Body"].read()
        assert len(body) == p["bytes"] and hashlib.md5(body).hexdigest() == p["md5"]


def test_open_run_inspect_and_xarray_over_the_bucket(s3, tmp_path, capsys):
    hookrun.run(cfg(URL, tmp_path))
    local = local_run(tmp_path)
    with hookrun.open_run(URL, cache_dir=tmp_path / "cache") as run, h5py.File(local) as f:
        assert run.status == "complete"
        assert {c.label: c.shape for c in run.captures} == {"h/0/output": (N, 16), "h/2/output": (N, 4)}
        # each capture's axis names, as the local file's `dims` attributes say (they were () from the manifest)
        assert {c.label: c.dims for c in run.captures} == {c: tuple(f[f"captures/{c}"].attrs["dims"]) for c in ("h/0/output", "h/2/output")}
        np.testing.assert_array_equal(run["0", "output"][:], f["captures/h/0/output"][:])
        xr = run.to_xarray()
        np.testing.assert_array_equal(xr["h/2/output"].values, f["captures/h/2/output"][:])
        np.testing.assert_array_equal(xr["sample"].values, f["samples/index"][:])
    from hookrun.cli.inspect_command import main
    assert main([URL, "--no-stats"]) == 0
    out = capsys.readouterr().out
    assert "status    complete   (16 batches, 64 samples)" in out and "h/2/output" in out and "part file(s)" in out


def test_a_one_part_run_lists_the_runs_attributes_in_its_manifest(s3, tmp_path, capsys):
    """With one part the end-of-run attributes are set before the part is finished; the manifest
    still carries the run's own (config, model class, ...): inspect --no-stats reads them there."""
    hookrun.run(cfg(URL, tmp_path, part_bytes=1 << 30))
    local = local_run(tmp_path)
    manifest, _ = bucket_parts(s3[1])
    assert len(manifest["parts"]) == 1
    with h5py.File(local) as f:
        for key in ("model_class", "device", "mode", "hookrun_version"):
            assert manifest["attrs"][key] == f.attrs[key], key
        ours, theirs = yaml.safe_load(manifest["attrs"]["config"]), yaml.safe_load(f.attrs["config"])
        assert ours.pop("output")["path"] == URL and theirs.pop("output")["path"] == str(local)
        assert ours == theirs  # the same config but for where it went
    assert "hooks_not_fired" in manifest["attrs"]
    from hookrun.cli.inspect_command import main
    assert main([URL, "--no-stats"]) == 0
    out = capsys.readouterr().out
    assert "missing" not in out and "status    complete   (16 batches, 64 samples)" in out


def test_inspect_reads_the_manifest_alone_and_statistics_one_part_at_a_time(s3, tmp_path, capsys, monkeypatch):
    from hookrun.cli.inspect_command import main
    from hookrun.output.objects.object_folder import RemoteFolder

    hookrun.run(cfg(URL, tmp_path, checksum=True))
    cache = tmp_path / "cache"
    monkeypatch.setenv("HOOKRUN_CACHE_DIR", str(cache))
    fetched, on_disk = [], []
    real_get = RemoteFolder.get

    def get(self, name, local):  # what is downloaded, and how many parts are on disk as each one comes
        fetched.append(name)
        on_disk.append(len(list(cache.rglob("part-*.h5"))))
        return real_get(self, name, local)

    monkeypatch.setattr(RemoteFolder, "get", get)
    assert main([URL, "--no-stats"]) == 0
    assert fetched == [] and "status    complete   (16 batches, 64 samples)" in capsys.readouterr().out
    n_parts = len(hookrun.open_run(URL).parts.entries)
    assert main([URL]) == 0  # statistics: every part once, one on disk at a time, none left
    out = capsys.readouterr().out
    assert sorted(fetched) == sorted(set(fetched)) and len(fetched) == n_parts and max(on_disk) == 0
    assert not list(cache.rglob("part-*.h5"))
    with h5py.File(local_run(tmp_path)) as f:
        for name in ("h/0/output", "h/2/output"):
            x = f[f"captures/{name}"][:].astype(np.float64)
            line = next(ln for ln in out.splitlines() if ln.strip().startswith(name))
            assert f"mean {x.mean():.4g} std {x.std():.4g} min {x.min():.4g} max {x.max():.4g} zeros {(x == 0).mean():.1%}" in line
    fetched.clear()
    on_disk.clear()
    assert main([URL, "--verify"]) == 0 and len(fetched) == n_parts and max(on_disk) == 0
    assert "every checked row matches its checksum" in capsys.readouterr().out


def test_the_loader_over_the_bucket_yields_every_row_once_with_local_values(s3, tmp_path):
    hookrun.run(cfg(URL, tmp_path))
    with h5py.File(local_run(tmp_path)) as f:
        want = np.concatenate([f["captures/h/0/output"][:], f["captures/h/2/output"][:]], axis=1)
    run = hookrun.open_run(URL, cache_dir=tmp_path / "cache")
    orders = []
    for epoch in range(2):
        rows = run.loader(["h/0/output", "h/2/output"], batch_size=5, seed=7, with_rows=True, buffer_bytes=20 * 80)
        rows.set_epoch(epoch)
        batches = list(rows)
        assert [len(x) for x, _ in batches[:-1]] == [5] * (len(batches) - 1) and len(batches) == len(rows)
        x = torch.cat([b[0] for b in batches]).numpy()
        r = torch.cat([b[1] for b in batches]).numpy()
        assert sorted(r.tolist()) == list(range(N))  # every row exactly once
        np.testing.assert_array_equal(x, want[r])
        orders.append(r)
    assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[0], np.arange(N))
    again = run.loader(["h/0/output", "h/2/output"], batch_size=5, seed=7, with_rows=True, buffer_bytes=20 * 80)
    np.testing.assert_array_equal(torch.cat([r for _, r in again]).numpy(), orders[0])  # seeded
    # two ranks: disjoint halves; DataLoader workers: the same rows
    halves = [torch.cat([r for _, r in run.loader("h/2/output", batch_size=4, with_rows=True, rank=k, world_size=2)])
              for k in range(2)]
    assert len(halves[0]) == len(halves[1]) == N // 2
    assert sorted(torch.cat(halves).tolist()) == list(range(N))
    dl = torch.utils.data.DataLoader(run.loader("h/2/output", batch_size=4, with_rows=True, buffer_bytes=4 * 16),
                                     batch_size=None, num_workers=2)
    got = [(x, r) for x, r in dl]
    r = torch.cat([g[1] for g in got]).numpy()
    assert sorted(r.tolist()) == list(range(N))
    np.testing.assert_array_equal(torch.cat([g[0] for g in got]).numpy(), want[r][:, 16:])
    in_order = torch.cat([r for _, r in run.loader("h/2/output", batch_size=8, shuffle=False, with_rows=True)])
    np.testing.assert_array_equal(in_order.numpy(), np.arange(N))
    assert not list((tmp_path / "cache").glob("stream-*/*"))  # parts are removed once read
    run.close()


def test_a_missing_or_damaged_part_is_named_never_read_as_zeros(s3, tmp_path):
    server, client = s3
    hookrun.run(cfg(URL, tmp_path))
    manifest, _ = bucket_parts(client)
    second = manifest["parts"][1]["name"]
    client.put_object(Bucket=BUCKET, Key=f"cache/captures.h5/{second}", Body=b"\0" * manifest["parts"][1]["bytes"])
    run = hookrun.open_run(URL, cache_dir=tmp_path / "cache")
    with pytest.raises(HookrunError, match=f"{second} is damaged"):
        list(run.loader("h/2/output", batch_size=4, shuffle=False))
    client.delete_object(Bucket=BUCKET, Key=f"cache/captures.h5/{second}")
    with pytest.raises(NotFoundError, match=f"{second}: the manifest lists this part but the store does not have it"):
        list(run.loader("h/2/output", batch_size=4, shuffle=False))
    with pytest.raises(NotFoundError, match=second):
        run["2", "output"]


def test_local_disk_never_holds_more_than_two_parts(s3, tmp_path, monkeypatch):
    from hookrun.output.objects import upload

    stage = tmp_path / "stage" / "captures.h5.parts"
    seen: list[int] = []
    real = upload.Uploader.upload

    def slow_upload(self, part):  # sampled from the upload worker, made slow so the writer catches up
        seen.append(len([p for p in os.listdir(stage) if p.endswith(".h5") or p.endswith(".creating")]))
        time.sleep(0.15)
        seen.append(len([p for p in os.listdir(stage) if p.endswith(".h5") or p.endswith(".creating")]))
        return real(self, part)

    monkeypatch.setattr(upload.Uploader, "upload", slow_upload)
    hookrun.run(cfg(URL, tmp_path, part_bytes=300))
    assert len(seen) >= 10 and max(seen) == 2  # the writer waited for the upload before a third part


def test_credentials_are_never_written_to_files_manifest_or_log(s3, tmp_path, caplog):
    server, client = s3
    caplog.set_level(logging.DEBUG, logger="hookrun")
    hookrun.run(cfg(URL, tmp_path))
    blobs = [client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
             for o in client.list_objects_v2(Bucket=BUCKET)["Contents"]]
    blobs += [p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()]
    blobs.append(caplog.text.encode())
    assert len(blobs) > 4
    for secret in (SECRET, KEY_ID):
        assert not any(secret.encode() in b for b in blobs)


def test_an_unreachable_endpoint_or_missing_bucket_is_one_line_before_any_batch(s3, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="bucket 'no-such-bucket' does not exist") as e:
        hookrun.run(cfg("s3://no-such-bucket/x/captures.h5", tmp_path))
    assert "\n" not in str(e.value) and SECRET not in str(e.value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(ConfigError, match="the object store cannot be used") as e:
        hookrun.run(cfg(URL, tmp_path))
    assert "\n" not in str(e.value) and "AWS_ENDPOINT_URL" in str(e.value)
    assert not (tmp_path / "stage" / "captures.h5.parts").exists() or not any((tmp_path / "stage").rglob("part-*"))
    with pytest.raises(ConfigError, match="names a bucket only"):
        hookrun.run(cfg(f"s3://{BUCKET}", tmp_path))
    with pytest.raises(ConfigError, match=r"^output.path: s3:///captures.h5 names no bucket \(nothing between s3:// and "
                                          r"the next /\); give s3://BUCKET/NAME"):  # (was "names a bucket only", s3:///...)
        hookrun.run(cfg("s3:///captures.h5", tmp_path))


def test_a_staging_folder_that_cannot_be_made_or_written_is_one_line_before_any_batch(tmp_path, monkeypatch):
    url = "memory://hookrun-test-staging/run/captures.h5"
    (tmp_path / "a-file").write_text("")
    bad = cfg(url, tmp_path)
    bad["output"]["staging"] = str(tmp_path / "a-file" / "stage")  # mkdir fails with ENOTDIR, even for root
    with pytest.raises(ConfigError, match=r"^output.staging: cannot create the folder '.*a-file/stage/captures.h5.parts': "
                                          r"Not a directory$"):
        hookrun.run(bad)
    stage = tmp_path / "stage" / "captures.h5.parts"
    real_access = os.access  # root may write anywhere: the test says which folder the user may not write
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != stage and real_access(p, mode, **kw))
    with pytest.raises(ConfigError, match=rf"^output.staging: the folder '{stage}' is not writable$"):
        hookrun.run(cfg(url, tmp_path))
    assert not any(stage.iterdir())  # no part begun


def test_a_store_that_goes_away_interrupts_and_resume_completes_the_cache(s3, tmp_path, monkeypatch):
    from hookrun.output.objects import upload

    server, client = s3
    monkeypatch.setattr(upload, "RETRY_SECONDS", 1.5)
    c = cfg(URL, tmp_path)
    with pytest.raises(Interrupted, match="resume=true") as e:
        hookrun.run(c, dataset=StopsTheStore(server.stop, at=30))
    assert e.value.exit_code == 143
    stage = tmp_path / "stage" / "captures.h5.parts"
    kept = sorted(stage.glob("part-*.h5"))
    assert kept and str(stage) in str(e.value)  # the parts not uploaded stay locally, and it says where
    restarted = Server(server.port)  # the same port; moto keeps its bucket and objects in this process
    try:
        result = hookrun.run({**c, "resume": True}, dataset=StopsTheStore(None, at=-1))
        assert result.status == "complete"
        assert_same_as_local(client, local_run(tmp_path))
        assert not list(stage.glob("part-*"))
    finally:
        restarted.stop()


@pytest.mark.slow
def test_kill_9_at_any_moment_resumes_to_the_rows_of_an_uninterrupted_run(s3, tmp_path):
    server, client = s3
    c = cfg(URL, tmp_path, part_bytes=300)
    c["data"]["dataset"]["n"] = 64 * 6
    c["data"]["batch_size"] = 2
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for delay in (0.0, 1.5):  # before anything is uploaded, and after some parts are listed
        proc = subprocess.Popen([sys.executable, "-c", RUNNER, json.dumps(c)], cwd=tmp_path, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while delay and time.monotonic() < deadline:
            objects = client.list_objects_v2(Bucket=BUCKET).get("Contents", [])
            if sum("part-" in o["Key"] for o in objects) >= 2:
                break
            time.sleep(0.05)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        c = {**c, "resume": True}
    result = hookrun.run(c)
    assert result.status == "complete"
    local = tmp_path / "local" / "captures.h5"
    hookrun.run({**cfg(str(local), tmp_path), "data": c["data"]})
    assert_same_as_local(client, local)


@pytest.mark.slow
def test_the_cli_writes_to_the_bucket_and_says_unreachable_in_one_line(s3, tmp_path):
    from conftest import run_cli

    server, client = s3
    common = ["model=resnet18", "model.num_classes=4", "data=synthetic", "data.dataset.size=8", "data.batch_size=4",
              "data.dataset.image_size=[3,32,32]", "device=cpu", "progress=false",
              "hooks={f: {at: layer1.0, type: forward}}", "output.part_bytes=10000"]
    done = run_cli(*common, f"output.path={URL}", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "file: " + URL in done.stderr + done.stdout
    log = (tmp_path / "run" / "hookrun.log").read_text()
    assert SECRET not in log + done.stderr + done.stdout
    assert "botocore" not in log + done.stderr, "the S3 client's INFO lines crowd the run's log"
    inspect = subprocess.run([sys.executable, "-m", "hookrun.inspect", URL, "--no-stats"], capture_output=True,
                             text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                           "HOOKRUN_CACHE_DIR": str(tmp_path / "cache")})
    assert inspect.returncode == 0 and "f/layer1.0/output" in inspect.stdout
    bad = run_cli(*common, "output.path=s3://missing-bucket/c/captures.h5", f"hydra.run.dir={tmp_path / 'run2'}")
    lines = [ln for ln in bad.stderr.splitlines() if ln.startswith("hookrun:")]
    assert bad.returncode == 2 and len(lines) == 1 and "missing-bucket" in lines[0], bad.stderr[-2000:]


def test_any_fsspec_url_memory(tmp_path):
    url = "memory://hookrun-test-bucket/run/captures.h5"
    hookrun.run(cfg(url, tmp_path))
    with h5py.File(local_run(tmp_path)) as f, hookrun.open_run(url, cache_dir=tmp_path / "cache") as run:
        r = torch.cat([r for _, r in run.loader("h/0/output", batch_size=8, with_rows=True)]).numpy()
        x = torch.cat([x for x in run.loader("h/0/output", batch_size=8, seed=1)]).numpy()
        assert sorted(r.tolist()) == list(range(N))
        np.testing.assert_array_equal(np.sort(x, axis=0), np.sort(f["captures/h/0/output"][:], axis=0))
    with pytest.raises(ConfigError, match="exists"):
        hookrun.run(cfg(url, tmp_path))
    hookrun.run(cfg(url, tmp_path, overwrite=True))


def test_resume_of_a_cache_written_by_other_weights_is_refused(tmp_path):
    """Resume compared only the manifest's config: a run whose weights changed (a replaced checkpoint) went on
    into the same cache. The manifest's model_fingerprint, changed by hand: the reference is the digest written."""
    import fsspec

    url = "memory://hookrun-test-bucket/weights/captures.h5"
    hookrun.run(cfg(url, tmp_path))
    fs, name = fsspec.filesystem("memory"), "/hookrun-test-bucket/weights/captures.h5/manifest.json"
    manifest = json.loads(fs.cat(name))
    assert len(manifest["attrs"]["model_fingerprint"]) == 32
    manifest.update(status="interrupted")
    manifest["attrs"]["model_fingerprint"] = "0" * 32
    fs.pipe(name, json.dumps(manifest).encode())
    with pytest.raises(ConfigError, match=rf"^resume: the model's weights differ from those '{url}' was written with "
                                          r"\(model_fingerprint 0{32}, now [0-9a-f]{32}\)"):
        hookrun.run({**cfg(url, tmp_path), "resume": True})
