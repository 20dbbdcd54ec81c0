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


def damage_link_table(path: Path, group: str) -> None:
    """Shrink the data segment of `group`'s local heap (the names of its links) to 8 bytes, as a bad
    disk block would; checks that plain h5py can no longer list the group, so the damage is real."""
    import re
    import struct

    with h5py.File(path, "r") as f:
        names = list(f[group])
    raw = bytearray(path.read_bytes())
    for m in re.finditer(b"HEAP", raw):
        size, _, addr = struct.unpack_from("<QQQ", raw, m.start() + 8)
        if all(n.encode() + b"\0" in raw[addr : addr + size] for n in names):
            struct.pack_into("<Q", raw, m.start() + 8, 8)
            break
    path.write_bytes(bytes(raw))
    with h5py.File(path, "r") as f, pytest.raises(RuntimeError, match="Link iteration failed"):
        list(f[group])


def damage_string_attribute(path: Path, name: str) -> None:
    """Overwrite the heap object index of root attribute `name`'s string (in the file's global heap)
    with 0xffff: h5py opens the file and reads every other attribute, but not that one."""
    with h5py.File(path, "r") as f:
        text = f.attrs[name]
    raw = bytearray(path.read_bytes())
    at = raw.find(text[:60].encode())
    raw[at - 16 : at - 14] = b"\xff\xff"
    path.write_bytes(bytes(raw))
    with h5py.File(path, "r") as f, pytest.raises(OSError, match="bad heap pointer"):
        f.attrs[name]
