"""Shared fixtures: a small ResNet-18 saved as a checkpoint, the same data, a run helper, the
one-process reference of the multi-process tests, and hookrun's wheel unpacked as an install.

Tests build their reference model from the same checkpoint and data, so what hookrun recorded is
compared with raw PyTorch on the same weights and inputs, never with hookrun's own output.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import h5py
import pytest
import torch
import torchvision

import hookrun
from hookrun.data import RandomTensors

ROOT = Path(__file__).resolve().parents[1]
# the shared helper modules (toy_models, rank_runs, ...): importable by name here, and in a subprocess
# a test starts with this folder on its PYTHONPATH
HELPERS = ROOT / "tests" / "helpers"
if str(HELPERS) not in sys.path:
    sys.path.insert(0, str(HELPERS))
# the environment of a `python -m hookrun` a test starts: this checkout's hookrun, my_pkg (the example user
# package) and the helper modules, importable
ENV = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(HELPERS)])}
N, BATCH, SHAPE, CLASSES = 12, 4, (3, 32, 32), 10

# One intra-op thread, here and in every `python -m hookrun` a test starts (they inherit the
# environment): the tests' models are tiny, and on CI's 2 cores a second thread costs more in
# synchronisation than it gains (test_top_examples' runs took 3x the wall time and 1.2x the CPU
# with two). The benchmarks' smoke runs keep torch's default (tests/docs/test_benchmarks.py).
# setdefault: OMP_NUM_THREADS=2 python -m pytest still chooses.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def small_resnet() -> torch.nn.Module:
    return torchvision.models.resnet18(weights=None, num_classes=CLASSES)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    torch.manual_seed(1234)
    model = small_resnet()
    # non-trivial BatchNorm statistics, so eval-mode BN is not the identity
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp("ckpt") / "resnet18_small.pt"
    torch.save(model.state_dict(), path)
    return path


@pytest.fixture
def reference_model(checkpoint) -> torch.nn.Module:
    model = small_resnet()
    model.load_state_dict(torch.load(checkpoint, weights_only=True))
    return model.eval()


@pytest.fixture(scope="session")
def single(tmp_path_factory) -> Path:
    """The multi-process tests' reference: their command (rank_runs.ARGS) run by one process into a
    local file, which test_ranks.py and test_object_store_ranks.py read and never change."""
    from rank_runs import one_process_run  # here, not at the top: rank_runs imports conftest

    return one_process_run(tmp_path_factory.mktemp("single"))


@pytest.fixture(scope="session")
def wheel_site(tmp_path_factory) -> tuple[list[str], Path]:
    """hookrun's wheel built from this checkout and unpacked as an install lays it out: the wheel's
    file names, and the folder to put on PYTHONPATH (tests run from a folder outside the checkout)."""
    folder = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(folder / "dist"), str(ROOT)], check=True, capture_output=True)
    (wheel,) = (folder / "dist").glob("hookrun-*.whl")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(folder / "site")
        return z.namelist(), folder / "site"


@pytest.fixture(scope="session")
def dataset() -> RandomTensors:
    return RandomTensors(n=N, shape=SHAPE, num_classes=CLASSES, seed=7)


def batches(dataset, batch_size: int = BATCH):
    for start in range(0, len(dataset), batch_size):
        idx = range(start, min(start + batch_size, len(dataset)))
        yield torch.stack([dataset[i][0] for i in idx]), torch.stack([dataset[i][1] for i in idx])


def make_cfg(tmp_path: Path, checkpoint: Path, hooks=None, **over) -> dict:
    cfg = {
        "model": {"_target_": "torchvision.models.resnet18", "weights": None, "num_classes": CLASSES,
                  "checkpoint": str(checkpoint)},
        "data": {"dataset": {"_target_": "hookrun.data.RandomTensors", "n": N, "shape": list(SHAPE),
                             "num_classes": CLASSES, "seed": 7},
                 "batch_size": BATCH},
        "device": "cpu",
        "hooks": hooks,
        "output": {"path": str(tmp_path / "captures.h5")},
        "progress": False,
    }
    for key, value in over.items():
        node = cfg
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return cfg


@pytest.fixture
def run_hooks(tmp_path, checkpoint):
    """run_hooks(hooks, **overrides) -> an open h5py.File of the finished run."""
    opened = []

    def go(hooks, **over):
        result = hookrun.run(make_cfg(tmp_path, checkpoint, hooks, **over))
        f = h5py.File(result.path, "r")
        opened.append(f)
        return f

    yield go
    for f in opened:
        f.close()


def run_cli(*args: str, cwd: Path = ROOT, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m hookrun ARGS` in `cwd`, its output captured; its start-up's torch import is shared
    (tests/helpers/warm_python.py: hookrun itself is imported fresh by each command)."""
    import warm_python

    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("HYDRA_FULL_ERROR", None)
    return warm_python.run_module("hookrun", list(args), cwd=cwd, env=full_env, timeout=timeout)


# The longest test files first (measured: their tests' durations summed in a CI run), then every
# other file with a `slow` test (runs in a subprocess), then the rest (in-process, seconds each):
# `-n auto` hands whole files to workers in this order, so a long file started last would leave one
# worker running alone at the end. Within a file, and within each group, the order is pytest's.
LONGEST_FIRST = ("docs/test_benchmarks.py", "docs/test_docs.py", "cli/test_cli.py", "store/test_reliability.py",
                 "store/test_ranks.py", "cli/test_load.py", "store/test_object_store_seaweedfs.py")


def pytest_configure(config) -> None:
    # pytest-xdist's --loadscope-reorder (on by default in 3.8) hands out files by their number of
    # tests, fewest last, whatever the collection order: the one- and two-test files (test_load's
    # 80 s, test_bench_sae's 45 s) came last, and LONGEST_FIRST was not followed
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items) -> None:
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item) -> tuple[int, bool]:
        path = item.path.as_posix()
        first = next((i for i, name in enumerate(LONGEST_FIRST) if path.endswith("/tests/" + name)), len(LONGEST_FIRST))
        return first, item.path not in slow_files

    items.sort(key=rank)  # stable: the rest keep their order


@pytest.fixture
def sigint_default():
    """SIGINT as a foreground process has it (Python's KeyboardInterrupt), whatever this pytest
    inherited: a background job (`cmd &`, nohup) starts with SIGINT ignored, and a test of a Ctrl-C
    before hookrun installs its own handlers would then see nothing happen."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)
