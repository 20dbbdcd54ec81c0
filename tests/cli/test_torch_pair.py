"""torch and torchvision that do not belong together are one line at every command's start, with both
versions and the command that reinstalls both (issue 47 item 1); a good pair costs no torchvision
import. References: PyTorch's published pairs (torchvision 0.N <-> torch 2.(N-15)), the installed
packages' own __version__, and a stand-in torchvision whose import fails as a CUDA build does
beside a CPU-only torch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

from hookrun.cli import installed_version, mismatch, pair_problem


@pytest.mark.parametrize("torch_v, vision_v, bad", [
    ("2.14.1+cu130", "0.29.1+cu130", False),
    ("2.14.1", "0.29.1", False),
    ("2.13.0+cpu", "0.28.0+cpu", False),
    ("2.14.1", "0.29.1+cpu", False),  # a CPU torchvision beside a CUDA torch loads
    ("2.13.0+cpu", "0.28.0+cu128", True),  # the pair
    ("2.14.1+cpu", "0.28.0+cpu", True),
    ("2.14.1+cu130", "0.29.1+cu128", True),
    ("2.14.1+cu128", "0.29.1+cu126", False),
])
def test_the_pairs(torch_v, vision_v, bad):
    assert (pair_problem(torch_v, vision_v) is not None) == bad


def test_the_installed_pair_passes_without_importing_torchvision():
    assert installed_version("torch") == torch.__version__
    code = ("import sys, time; from hookrun.cli import mismatch; t = time.perf_counter(); "
            "line = mismatch(); print(line, 'torchvision' in sys.modules, time.perf_counter() - t)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    line, imported, seconds = done.stdout.split()
    assert (line, imported) == ("None", "False") and float(seconds) < 0.1, done.stderr[-2000:]
    assert mismatch() is None


@pytest.mark.slow
@pytest.mark.parametrize("command", [["hookrun", "model=tiny_lm", "data=text"], ["hookrun.inspect", "x.h5"],
                                     ["hookrun.modules", "model=tiny_lm"]])
def test_a_broken_pair_is_one_line_at_every_commands_start(tmp_path, command):
    fake = tmp_path / "site" / "torchvision"
    fake.mkdir(parents=True)
    (fake / "version.py").write_text("__version__ = '0.28.0+cu128'\n")
    (fake / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{ROOT}"}
    done = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(f"hookrun: error: torch {torch.__version__} and torchvision 0.28.0+cu128 do not belong")
    assert "torchvision::nms does not exist" in lines[0] and "pip install --force-reinstall torch torchvision" in lines[0]
