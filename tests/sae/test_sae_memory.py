"""An SAE too large for memory is one RunError line naming d_in x d_sae and the bytes the allocator was asked
for (reference: 16 x 2**33 float32 weights, 4 bytes each), and the run's file is marked failed. The address
space is capped here (RLIMIT_AS) so the allocation fails at once whatever the machine's overcommit policy."""

from __future__ import annotations

import resource

import h5py
import pytest
from test_sae_kind import config
from test_sae_train import make_cache

import hookrun
from hookrun.errors import RunError

pytest.importorskip("sae_lens")
D_SAE = 2 ** 33


def vm_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_AS"), reason="no RLIMIT_AS")
def test_an_sae_too_large_for_memory_is_one_line(tmp_path):
    cache = make_cache(tmp_path / "cache")
    cfg = config(cache, tmp_path / "run", rows=64, lr_schedule={"warmup": 0}, d_sae=D_SAE)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = vm_bytes() + 8 * 2 ** 30
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        with pytest.raises(RunError) as info:
            hookrun.run(cfg)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    msg = str(info.value)
    assert "\n" not in msg and f"d_in 16 x d_sae {D_SAE}" in msg and f"{16 * D_SAE * 4} bytes" in msg, msg
    with h5py.File(tmp_path / "run" / "captures.h5") as f:
        assert f.attrs["status"] == "failed"
