"""`python -m hookrun.inspect --verify` on a run with top examples: its end-of-run top.* captures
carry checksums like every batch's rows; a value changed with plain h5py is found."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest
from warm_python import python as warm

import hookrun
from hookrun.cli.inspect_command import main

ROOT = Path(__file__).resolve().parents[2]
AT = "captures/act/transformer.h.1.mlp.act"


def verify(path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return warm(["-m", "hookrun.inspect", "--verify", str(path)], env=env, timeout=300)


@pytest.fixture(scope="module")
def top_run(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("top") / "t.h5"
    hookrun.run({"model": {"_target_": "hookrun.models.tiny_lm"},
                 "data": {"dataset": {"_target_": "hookrun.data.text", "files": "pydoc_topics", "max_length": 16, "limit": 6},
                          "batch_size": 3},
                 "hooks": {"act": {"at": "transformer.h.1.mlp.act", "type": "forward", "actions": [
                     {"name": "top_examples", "k": 3, "context": 2}]}},
                 "output": {"path": str(path)}, "device": "cpu", "progress": False})
    return path


def test_a_top_examples_run_verifies(top_run):
    with h5py.File(top_run, "r") as f:
        assert {"top.values", "top.samples", "top.positions"} <= set(f[AT])
    proc = verify(top_run)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "every checked row matches its checksum" in proc.stdout


def test_a_damaged_top_dataset_fails_verify(top_run, tmp_path, capsys):
    for role in ("top.values", "top.positions"):  # (inspect's main in this process: the command above is the same)
        damaged = tmp_path / f"{role}.h5"
        damaged.write_bytes(top_run.read_bytes())
        with h5py.File(damaged, "r+") as f:
            f[f"{AT}/{role}"][2] = f[f"{AT}/{role}"][2] + np.ones_like(f[f"{AT}/{role}"][2])
        assert main([str(damaged), "--verify"]) == 1
        out = capsys.readouterr()
        assert f"{AT}/{role}: rows 0.." in out.out + out.err and "do not match their checksum" in out.out + out.err
