"""The writer thread and the host-transfer pool: bounded memory, values intact, errors surface."""

from __future__ import annotations

import threading
import time

import h5py
import numpy as np
import pytest
import torch

from hookrun.errors import RunError
from hookrun.store.h5store import H5Store
from hookrun.store.records import Capture, CaptureKey, StepRecord
from hookrun.store.writer import BackgroundWriter, HostTransfer


def record(step, value, per_step=False):
    n = value.shape[0]
    caps = [Capture(CaptureKey("h", "m", "forward", "output"), value, per_step)]
    return StepRecord(step, np.arange(step * n, (step + 1) * n), None, None, caps)


class SlowStore:
    """A store whose writes wait for a signal: to see the queue's bound."""

    def __init__(self):
        self.go = threading.Event()
        self.written = []

    def write(self, rec):
        self.go.wait()
        self.written.append(rec.step)


def wait_until(condition, timeout: float = 30.0) -> None:
    """Poll rather than sleep a fixed time: a loaded CI machine may schedule the other thread late."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the writer thread"
        time.sleep(0.01)


def test_put_blocks_when_the_queue_is_full():
    store = SlowStore()
    writer = BackgroundWriter(store, max_pending=2)
    done = []

    def producer():
        for step in range(6):
            writer.put(record(step, torch.zeros(2, 3)))
            done.append(step)

    t = threading.Thread(target=producer)
    t.start()
    wait_until(lambda: len(done) >= 3)
    time.sleep(0.3)
    # one record is inside write(), two wait in the queue, the producer is blocked on the fourth
    assert len(done) == 3
    store.go.set()
    t.join(5)
    writer.drain()
    assert store.written == list(range(6))


def test_writer_error_surfaces_on_the_next_put(tmp_path):
    class Broken:
        path, steps = tmp_path / "x.h5", 0

        def write(self, rec):
            raise OSError(28, "No space left on device")

    writer = BackgroundWriter(Broken())
    writer.put(record(0, torch.zeros(2, 3)))
    wait_until(lambda: writer._error is not None)
    with pytest.raises(RunError, match=r"writing .*x.h5 failed at batch 0: no space left on the device") as info:
        writer.put(record(1, torch.zeros(2, 3)))
    assert isinstance(info.value.__cause__, OSError)


def test_pooled_transfer_keeps_values_and_reuses_buffers(tmp_path):
    transfer = HostTransfer(torch.device("cpu"), always_pool=True)
    store = H5Store(tmp_path / "t.h5", {})
    rng = np.random.default_rng(0)
    sent = []
    with BackgroundWriter(store, max_pending=2) as writer:
        for step in range(30):
            value = torch.from_numpy(rng.standard_normal((4, 5), dtype=np.float32))
            sent.append(value.clone())
            rec = record(step, value)
            rec.ticket = transfer.submit(rec.captures)
            assert rec.captures[0].value is not value  # now a pooled host buffer
            writer.put(rec)
    store.close("complete")
    # at most: one being written, two queued, one being filled
    assert transfer.allocated <= 4
    with h5py.File(tmp_path / "t.h5") as f:
        np.testing.assert_array_equal(f["captures/h/m/output"][:], torch.cat(sent).numpy())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_transfer_uses_pinned_buffers_and_an_event(tmp_path):
    transfer = HostTransfer(torch.device("cuda"))
    value = torch.randn(8, 16, device="cuda")
    rec = record(0, value.clone())
    ticket = transfer.submit(rec.captures)
    ticket.wait()
    host = rec.captures[0].value
    assert host.device.type == "cpu" and host.is_pinned()
    torch.testing.assert_close(host, value.cpu())
    ticket.release()
    assert transfer.allocated == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_transfer_leaves_values_already_on_the_host():
    """A kind that computes its rows on the host (attribution) hands the writer CPU tensors on a CUDA
    run: they are written as they are (record_stream exists for CUDA tensors only)."""
    transfer = HostTransfer(torch.device("cuda"))
    on_gpu, on_host = torch.randn(4, 3, device="cuda"), torch.randn(4, 5)
    rec = record(0, on_gpu.clone())
    rec.captures.append(Capture(CaptureKey("h2", "m", "forward", "output"), on_host, False))
    ticket = transfer.submit(rec.captures)
    ticket.wait()
    torch.testing.assert_close(rec.captures[0].value, on_gpu.cpu())
    assert rec.captures[1].value is on_host
    ticket.release()
    assert transfer.allocated == 1


def test_many_captures_share_a_bounded_chunk_cache_and_keep_every_row(tmp_path, monkeypatch):
    """100 captures, with an 8 MiB budget: chunks shrink to 8 MiB / 100 (not 1 MiB each), each
    capture caches one chunk, and rows that cross chunk boundaries come back exactly (numpy reference)."""
    from hookrun.store import columns as store_module

    budget = 8 << 20
    monkeypatch.setattr(store_module, "CACHE_BUDGET", budget)
    n_caps, batch, steps, row = 100, 3, 40, 256  # 1 KiB rows: 81 to a chunk, 120 in all
    rng = np.random.default_rng(1)
    data = rng.standard_normal((n_caps, batch * steps, row), dtype=np.float32)
    store = H5Store(tmp_path / "many.h5", {})
    for step in range(steps):
        rows = slice(step * batch, (step + 1) * batch)
        caps = [Capture(CaptureKey(f"h{i}", "m", "forward", "output"), torch.from_numpy(data[i, rows]), False)
                for i in range(n_caps)]
        store.write(StepRecord(step, np.arange(rows.start, rows.stop), None, None, caps))
    caches = [store.file[f"captures/h{i}/m/output"].id.get_access_plist().get_chunk_cache()[1] for i in range(n_caps)]
    store.close("complete")
    with h5py.File(tmp_path / "many.h5") as f:
        for i in range(n_caps):
            ds = f[f"captures/h{i}/m/output"]
            chunk_bytes = ds.chunks[0] * row * 4
            assert ds.chunks[0] == budget // n_caps // (row * 4) < batch * steps
            assert chunk_bytes <= caches[i] < 2 * chunk_bytes  # the chunk being filled, not two
            np.testing.assert_array_equal(ds[:], data[i])
    assert sum(caches) <= 1.02 * budget
