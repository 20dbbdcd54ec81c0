"""A command whose reader closes the pipe early (`python -m hookrun.inspect RUN | head`) ends
quietly, as Unix tools do (issue 41 item 9): exit 0 or 141 (128 + SIGPIPE), nothing on stderr;
it was a BrokenPipeError traceback, or Python's "Exception ignored ... BrokenPipeError" at exit.
The pipe's read end is closed before the command writes, so every write to stdout fails: the
same as `| head` that has read its lines, without a race."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT, make_cfg

import hookrun

RECORD = {"l": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}


@pytest.fixture(scope="module")
def run_file(tmp_path_factory, checkpoint):
    return hookrun.run(make_cfg(tmp_path_factory.mktemp("run"), checkpoint, RECORD)).path


def into_closed_pipe(*args: str, cwd) -> subprocess.CompletedProcess:
    read, write = os.pipe()
    os.close(read)  # the reader is gone: a write to stdout is EPIPE
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        return subprocess.run([sys.executable, "-m", *args], stdout=write, stderr=subprocess.PIPE, text=True,
                              cwd=cwd, env=env, timeout=300)
    finally:
        os.close(write)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["inspect", "modules", "hookrun-help"])
def test_a_closed_pipe_ends_a_command_quietly(run_file, tmp_path, command):
    args = {"inspect": ["hookrun.inspect", str(run_file)],
            "modules": ["hookrun.modules", "model=resnet18", "device=cpu"],
            "hookrun-help": ["hookrun", "--help"]}[command]
    done = into_closed_pipe(*args, cwd=tmp_path)
    assert done.returncode in (0, 141), done.stderr[-2000:]
    assert "BrokenPipe" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip() == ""
