"""The sae kind's prefetch (runner/kinds/sae/prefetch.py): the cache's next batches read by a thread
while the step runs. The reference is the source itself, iterated directly: the same batches in
the same order, exact; the read-ahead bounded; errors raised where the batch was due. The CUDA
lines run only where a GPU is (never in CI): the batches on the device equal the source's."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from hookrun.errors import ConfigError
from hookrun.runner.kinds.sae.prefetch import Prefetch


class Source:
    """Batch i is a (4, 3) tensor of i's; records how many it made, on which thread, and skip/close."""

    def __init__(self, n: int | None = None, fail_at: int | None = None) -> None:
        self.n, self.fail_at = n, fail_at
        self.made, self.threads, self.closed, self.start = 0, set(), False, 0

    def __iter__(self):
        i = self.start
        while self.n is None or i < self.n:
            if i == self.fail_at:
                raise ConfigError("damaged chunk")
            self.made += 1
            self.threads.add(threading.current_thread().name)
            yield torch.full((4, 3), float(i)) + torch.arange(3)
            i += 1

    def skip(self, n: int) -> None:
        self.start += n

    def close(self) -> None:
        self.closed = True


def wait_for(cond, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def test_the_batches_are_the_sources_in_order_then_it_ends():
    source = Source(n=7)
    got = list(Prefetch(source, "cpu", depth=2))
    want = list(Source(n=7))
    assert len(got) == 7
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    assert source.threads == {"hookrun-sae-prefetch"}  # read on the prefetch thread, not the step's


def test_the_read_ahead_is_bounded_by_depth():
    source = Source()  # endless, as the cache's rows are
    batches = Prefetch(source, "cpu", depth=2)
    first = next(batches)
    assert torch.equal(first, torch.full((4, 3), 0.0) + torch.arange(3))
    # the queue holds `depth` batches and the thread one more, waiting to put it
    assert wait_for(lambda: source.made == 4)
    time.sleep(0.2)
    assert source.made == 4
    assert torch.equal(next(batches), torch.full((4, 3), 1.0) + torch.arange(3))
    batches.close()
    assert batches._thread is None and source.closed


def test_skip_before_the_first_batch_skips_the_sources_own():
    source = Source(n=10)
    batches = Prefetch(source, "cpu")
    batches.skip(3)  # a resumed run: the steps already trained
    assert [int(b[0, 0]) for b in batches] == list(range(3, 10))


def test_an_error_in_the_thread_is_raised_where_its_batch_was_due():
    batches = Prefetch(Source(fail_at=2), "cpu")
    assert [int(next(batches)[0, 0]) for _ in range(2)] == [0, 1]
    with pytest.raises(ConfigError, match="damaged chunk"):
        next(batches)
    batches.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (CI has none)")
def test_on_cuda_the_batches_come_through_pinned_memory_equal():
    source = Source(n=12)
    got = [b for b in Prefetch(source, "cuda", depth=2)]
    assert all(b.is_cuda for b in got)
    for a, b in zip(got, Source(n=12), strict=True):
        assert torch.equal(a.cpu(), b)
