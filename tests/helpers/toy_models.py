"""Small models and datasets for tests that need odd shapes or control flow."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

from hookrun.data import RandomTensors


class EveryOtherBatch(nn.Module):
    """Calls `extra` only when the batch's first value is positive: a module that skips batches."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.extra = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return self.extra(y) if x[0, 0] > 0 else y


class SignedRows(Dataset):
    """Rows whose first value is +1 for indices 0-3, -1 for 4-7, +1 for 8-11 (batch 4)."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        sign = -1.0 if 4 <= i < 8 else 1.0
        return torch.tensor([sign, i / 10, 0.5, -0.5]), i % 4


class Strings(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> str:
        return f"sample {i}"


class NotAModel:
    pass


class Join(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + 10 * b


class TwoInputs(nn.Module):
    """A module (`join`) that takes two positional inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.join = Join()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return self.join(h, h * 2)


def shift_by_sample_index(x: torch.Tensor, ctx) -> torch.Tensor:
    """A user op that uses ctx: adds each sample's dataset index to its values."""
    assert ctx.hook == "shift" and ctx.module_name == "layer2" and ctx.role == "output" and ctx.call == 0
    return x + ctx.sample_index.to(x.dtype).view(-1, *([1] * (x.dim() - 1)))


def wrong_shape(x: torch.Tensor) -> torch.Tensor:
    return x[:, :1]


def forgets_return(x: torch.Tensor) -> None:  # an op that changes nothing and returns None
    x.mul(0.5)


class CountingNet(nn.Module):
    """Counts how often its head runs (to see early_stop skip the rest of the forward)."""

    head_calls = 0

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, 2)
        self.head.register_forward_pre_hook(self._count)

    @classmethod
    def _count(cls, module, args) -> None:
        cls.head_calls += 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


def make_inf(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y.view(-1)[0] = float("inf")
    return y


LAST_MODEL: list[nn.Module] = []


class RememberedNet(CountingNet):
    """CountingNet that leaves a reference to itself, so a test can check for leftover hooks."""

    def __init__(self) -> None:
        super().__init__()
        LAST_MODEL[:] = [self]


def signal_at(ev, step: int = 1, signum: int = 2) -> None:
    """A user action: send this process `signum` (SIGINT) when batch `step` runs."""
    import os

    if ev.step == step and ev.call == 0:
        os.kill(os.getpid(), signum)


def sleep_action(ev, seconds: float = 0.05) -> None:
    import time

    time.sleep(seconds)


STOP_AT: list[int] = []  # set by a test: the batch at which `signal_when_told` sends SIGINT


def signal_when_told(ev) -> None:
    """Like signal_at, but the batch comes from STOP_AT, outside the config (which resume compares)."""
    import os

    if STOP_AT and ev.step == STOP_AT[0] and ev.call == 0:
        STOP_AT.clear()
        os.kill(os.getpid(), 2)


class SlowToBuild(CountingNet):
    """CountingNet that takes `seconds` to build (a big model's start-up), signalling when it starts."""

    def __init__(self, seconds: float = 1.0) -> None:
        import time

        super().__init__()
        BUILDING.set()
        time.sleep(seconds)


import threading  # noqa: E402

BUILDING = threading.Event()  # set while SlowToBuild is being built


class InterruptedWhileBuilt(CountingNet):
    """A model whose construction is cut by Ctrl-C (SIGINT to this process)."""

    def __init__(self) -> None:
        import os
        import signal
        import time

        super().__init__()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)


class TerminatedWhileBuilt(CountingNet):
    """A model whose construction is cut by SIGTERM (what Slurm and `kill` send) to this process."""

    def __init__(self) -> None:
        import os
        import signal
        import time

        super().__init__()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)


class Amplify(nn.Module):
    """body, then `big` multiplies by 1e5: outputs beyond float16's range (65504)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.big = Scale(1e5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.big(self.body(x))


class Scale(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class RepeatWhenNegative(nn.Module):
    """Calls `m` once, and a second time when the batch's first value is negative (batch 1 of SignedRows)."""

    def __init__(self) -> None:
        super().__init__()
        self.m = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.m(x)
        if x[0, 0] < 0:
            y = self.m(y)
        return self.head(y)


class WithSpare(CountingNet):
    """CountingNet with a module that never runs, and one whose name has a '/' in it."""

    def __init__(self) -> None:
        super().__init__()
        self.spare = nn.Linear(4, 4)
        self.parts = nn.ModuleDict({"a/b": nn.Linear(4, 8)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.parts["a/b"](x) + self.body(x)))


def interrupt_twice(ev, step: int = 2, after: float = 0.3) -> None:
    """SIGINT at batch `step`, and again `after` seconds later (while the writer drains)."""
    import os
    import signal

    if ev.step == step and ev.call == 0:
        os.kill(os.getpid(), signal.SIGINT)
        threading.Timer(after, os.kill, (os.getpid(), signal.SIGINT)).start()


class SlowTensors(RandomTensors):
    """RandomTensors' samples, slowly enough for a run in a child process to be killed part-way."""

    def __getitem__(self, i: int):
        import time

        time.sleep(0.05)
        return super().__getitem__(i)


class Id(nn.Module):
    """The input as it comes, through a module named `lin` (an nn.Identity): a hook point whose output is the
    batch itself, for tests that hand a kind their own features."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Identity()

    def forward(self, x):  # noqa: ANN001, ANN201
        return self.lin(x)


class Normalise(nn.Module):
    """(x - 0.5) * 2, in place (x.sub_(0.5).mul_(2): a model that changes its input) or not."""

    def __init__(self, in_place: bool) -> None:
        super().__init__()
        self.in_place = in_place

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sub_(0.5).mul_(2.0) if self.in_place else (x - 0.5) * 2.0


def in_place_net(in_place: bool) -> nn.Module:
    """A 3 x 2 x 2 image classifier (4 classes) whose first module changes its input in place, or its
    out-of-place twin with the same weights: the reference whose forwards cannot disturb each other."""
    torch.manual_seed(0)
    return nn.Sequential(Normalise(in_place), nn.Flatten(), nn.Linear(12, 8), nn.Tanh(), nn.Linear(8, 4)).eval()


def standard_sae(folder, d_in: int, d_sae: int, hook_name: str, seed: int = 1, **metadata) -> dict:
    """An SAELens folder of a standard (ReLU) SAE with random weights in `folder` (cfg.json and
    sae_weights.safetensors); its weights, for the reference computed by hand."""
    import json

    import safetensors.torch as safetensors

    g = torch.Generator().manual_seed(seed)
    w = {"W_enc": torch.randn(d_in, d_sae, generator=g) * 0.3, "W_dec": torch.randn(d_sae, d_in, generator=g) * 0.3,
         "b_enc": torch.randn(d_sae, generator=g) * 0.1, "b_dec": torch.randn(d_in, generator=g) * 0.1}
    safetensors.save_file(w, str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps({
        "architecture": "standard", "d_in": d_in, "d_sae": d_sae, "dtype": "float32", "apply_b_dec_to_input": True,
        "normalize_activations": "none", "metadata": {"hook_name": hook_name, **metadata}}))
    return w


def raising_at(model: nn.Module, call: int, exc: Exception) -> list[int]:
    """`model`, whose forward raises `exc` (the model's own error) at its `call`-th forward (1-based), from a
    forward pre-hook; returns the counter of its forwards so far ([n])."""
    calls = [0]

    def boom(module, args):
        calls[0] += 1
        if calls[0] == call:
            raise exc

    model.register_forward_pre_hook(boom)
    return calls
