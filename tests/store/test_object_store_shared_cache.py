"""Two object-store caches read through one `cache_dir` (docs/caches.md shows `cache_dir="/scratch/hookrun"`):
each reads its own rows. Before, both fetched into `cache_dir/all/part-00000.h5` and one `view.h5`,
and the loaders of one process into one `stream-PID-r0-w0` folder: run A's reads after run B was
opened gave B's rows, with no error. The reference: the same runs written to local files, read with h5py."""

from __future__ import annotations

import uuid

import h5py
import numpy as np
import torch
from moto_s3 import cfg

import hookrun

CAPTURE = "h/2/output"


def _two_runs(tmp_path):
    """Runs A and B (other model seeds) in the memory store and on disk: their URLs and local rows."""
    bucket = f"hookrun-shared-{uuid.uuid4().hex[:8]}"
    urls, want = [], []
    for name, seed in (("a", 3), ("b", 4)):
        url = f"memory://{bucket}/{name}/captures.h5"
        for path in (url, str(tmp_path / name / "captures.h5")):
            c = cfg(path, tmp_path / name)
            c["seed"] = seed
            hookrun.run(c)
        with h5py.File(tmp_path / name / "captures.h5", "r") as f:
            want.append(f[f"captures/{CAPTURE}"][:])
        urls.append(url)
    assert not np.allclose(want[0], want[1])
    return urls, want


def test_two_caches_through_one_cache_dir_each_read_their_own_rows(tmp_path):
    (url_a, url_b), (want_a, want_b) = _two_runs(tmp_path)
    shared = tmp_path / "shared"
    with hookrun.open_run(url_a, cache_dir=shared) as a, hookrun.open_run(url_b, cache_dir=shared) as b:
        np.testing.assert_array_equal(a[CAPTURE][:], want_a)
        np.testing.assert_array_equal(b[CAPTURE][:], want_b)
        np.testing.assert_array_equal(a[CAPTURE][:], want_a)  # A again, after B fetched its parts
        # two loaders at once in one process (windows of 2 rows: they fetch and evict in turn)
        la = a.loader(CAPTURE, batch_size=4, shuffle=False, buffer_bytes=32)
        lb = b.loader(CAPTURE, batch_size=4, shuffle=False, buffer_bytes=32)
        got_a, got_b = zip(*zip(la, lb, strict=True), strict=True)
        np.testing.assert_array_equal(torch.cat(got_a).numpy(), want_a)
        np.testing.assert_array_equal(torch.cat(got_b).numpy(), want_b)
    assert not list(shared.glob("stream-*/*")) and not list(shared.glob("all-*/view-*"))  # nothing left behind


def test_a_cache_written_again_at_its_url_leaves_an_open_reader_its_own_rows(tmp_path):
    (url_a, _), (want_a, _) = _two_runs(tmp_path)
    shared = tmp_path / "shared"
    with hookrun.open_run(url_a, cache_dir=shared) as old:
        np.testing.assert_array_equal(old[CAPTURE][:], want_a)
        for path in (url_a, str(tmp_path / "c" / "captures.h5")):  # A written again, by another model
            c = cfg(path, tmp_path / "c", overwrite=True)
            c["seed"] = 5
            hookrun.run(c)
        with h5py.File(tmp_path / "c" / "captures.h5", "r") as f:
            want_c = f[f"captures/{CAPTURE}"][:]
        with hookrun.open_run(url_a, cache_dir=shared) as new:
            np.testing.assert_array_equal(new[CAPTURE][:], want_c)
            np.testing.assert_array_equal(old[CAPTURE][:], want_a)
