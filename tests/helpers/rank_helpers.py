"""Helpers for the multi-process and resume tests: a rank (or a lone run) that kills itself when told,
wrapped models."""

from __future__ import annotations

import os
import signal
import time

import torch

import my_pkg


def kill_when_told(ev) -> None:
    """A user action: SIGKILL this process at batch STEP on rank RANK, where the environment has
    HOOKRUN_TEST_KILL=RANK:STEP (outside the config, which resume compares)."""
    told = os.environ.get("HOOKRUN_TEST_KILL")
    if told and ev.call == 0:
        rank, step = map(int, told.split(":"))
        if int(os.environ.get("RANK", os.environ.get("SUBMITIT_LOCAL_GLOBALID", "0"))) == rank and ev.step == step:
            time.sleep(1.5)  # the writer thread flushes the batches before this one
            os.kill(os.getpid(), signal.SIGKILL)


def compiled_net(width: int = 4) -> torch.nn.Module:
    """my_pkg.Net under torch.compile (the eager backend: no compiler needed)."""
    return torch.compile(my_pkg.Net(width=width), backend="eager")


def data_parallel_net(width: int = 4) -> torch.nn.Module:
    """my_pkg.Net under nn.DataParallel (its names start with `module.`)."""
    return torch.nn.DataParallel(my_pkg.Net(width=width))
