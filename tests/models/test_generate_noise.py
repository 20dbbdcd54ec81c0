"""op noise inside mode=generate: every token's draw, against the seeding rule of docs/config.md
computed here on its own (blake2b, crc32, torch.Generator), not by hookrun's op."""

from __future__ import annotations

import hashlib
import zlib

import h5py
import numpy as np
import pytest
import torch
from toy_lm import WIDTH

import hookrun

pytest.importorskip("transformers")

SEED, STD = 7, 1.0
AT = "transformer.h.0"
TOKEN_ROWS = {"name": "record", "what": "output", "rows": "token"}


def reference_noise(sample: int, position: int) -> np.ndarray:
    """docs/config.md: randn(x.shape[2:]) from a generator seeded by the blake2b of (seed, crc32 of
    'hook/module/role/call', the sample's dataset index, the token's position among its real tokens)."""
    salt = zlib.crc32(f"n/{AT}/output/0".encode())
    parts = ",".join(map(str, (SEED, salt, sample, position))).encode()
    g = torch.Generator().manual_seed(int.from_bytes(hashlib.blake2b(parts, digest_size=8).digest(), "little") >> 1)
    return torch.randn(WIDTH, generator=g).numpy()


def noise_rows(tmp_path, name: str, side: str = "left", batch_size: int = 4, generate: bool = True) -> dict:
    """{(sample, position): (noise added to that token's row, generated?)}: the row after the noise
    minus the row before it."""
    hooks = {"pre": {"at": AT, "type": "forward", "actions": [TOKEN_ROWS]},
             "n": {"at": AT, "type": "forward", "actions": [
                 {"name": "modify_output", "op": "noise", "std": STD, "seed": SEED}]},
             "post": {"at": AT, "type": "forward", "actions": [TOKEN_ROWS]}}
    cfg = {"model": {"_target_": "toy_lm.tiny_gpt2"},
           "data": {"dataset": {"_target_": "toy_lm.Prompts", "side": side}, "batch_size": batch_size},
           "device": "cpu", "hooks": hooks, "progress": False, "output": {"path": str(tmp_path / name)}}
    if generate:
        cfg.update(mode="generate", generate={"max_new_tokens": 4, "do_sample": False})
    with h5py.File(hookrun.run(cfg).path, "r") as f:
        d = f[f"captures/post/{AT}/output"][:] - f[f"captures/pre/{AT}/output"][:]
        s, p = f["samples/token_sample"][:], f["samples/token_position"][:]
        g = f["samples/token_generated"][:] if generate else np.zeros(len(s))
    return {(int(a), int(b)): (row, bool(c)) for a, b, row, c in zip(s, p, d, g, strict=True)}


def test_every_generated_token_gets_its_own_draw_of_the_documented_rule(tmp_path):
    rows = noise_rows(tmp_path, "g4.h5")
    assert sum(gen for _, gen in rows.values()) >= 6  # generated rows are there to check
    for (sample, position), (noise, _) in rows.items():
        np.testing.assert_allclose(noise, STD * reference_noise(sample, position), atol=1e-5, rtol=0)
    for sample in {s for s, _ in rows}:  # no two tokens of a sample share a draw
        drawn = np.stack([noise for (s, _), (noise, _) in rows.items() if s == sample])
        assert len(np.unique(drawn.round(4), axis=0)) == len(drawn)
    # another batch size: the same noise at each (sample, position)
    alone = noise_rows(tmp_path, "g1.h5", batch_size=1)
    assert alone.keys() == rows.keys()
    for key, (noise, _) in rows.items():
        np.testing.assert_allclose(alone[key][0], noise, atol=1e-6, rtol=0)


def test_a_tokens_noise_does_not_depend_on_the_padding_side(tmp_path):
    left, right = noise_rows(tmp_path, "l.h5", generate=False), noise_rows(tmp_path, "r.h5", "right", 3, generate=False)
    assert left.keys() == right.keys()
    for (sample, position), (noise, _) in left.items():
        np.testing.assert_allclose(right[sample, position][0], noise, atol=1e-6, rtol=0)
        np.testing.assert_allclose(noise, STD * reference_noise(sample, position), atol=1e-5, rtol=0)
