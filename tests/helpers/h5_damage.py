"""Damage on disk, made with plain h5py and file bytes (no hookrun code), for the tests of damaged files.

    damage_object_header(path, "captures/l/layer2/output")   # h5py itself can no longer open that object
"""

from __future__ import annotations

from pathlib import Path

import h5py
import pytest


def damage_object_header(path: Path, name: str) -> None:
    """Overwrite the first 16 bytes of an object's header (its version byte first) with 0xff, as a bad
    disk block would; checks that plain h5py cannot open it, so the damage is real."""
    with h5py.File(path, "r") as f:
        addr = h5py.h5o.get_info(f[name].id).addr
    with open(path, "r+b") as raw:
        raw.seek(addr)
        raw.write(b"\xff" * 16)
    with h5py.File(path, "r") as f, pytest.raises(KeyError, match="bad object header"):
        f[name]
