"""The data loop: batches in, forward (and backward in grad mode), step records out.

    steps = run_batches(model, loader, session, writer, env, settings)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from hookrun.capture.actions import ActionEnv
from hookrun.capture.session import HookSession, StopForward
from hookrun.errors import RunError
from hookrun.runner.batches import make_loader, sample_paths, split_batch, to_device
from hookrun.runner.generate import Generated, Generation
from hookrun.store.records import StepRecord
from hookrun.store.transfer import HostTransfer
from hookrun.store.writer import BackgroundWriter


@dataclass
class LoopSettings:
    mode: str  # "eval" or "grad"
    device: torch.device
    loss: Callable | None = None
    batches: int | None = None  # how many batches to run (prepare() applies data.limit); None: all
    progress: bool = True
    should_stop: Callable[[], bool] = lambda: False  # checked after each batch (signals)
    generation: Generation | None = None  # mode=generate: the checked generate() settings


def run_batches(
    model: nn.Module, loader, session: HookSession, writer: BackgroundWriter, env: ActionEnv, s: LoopSettings,
    first: int = 0,
) -> int:
    """Run batches `first`, `first + 1`, ... (a resumed run starts past the batches it has)."""
    transfer = HostTransfer(s.device)
    total = len(loader) if s.batches is None else s.batches
    dataset = loader.dataset.dataset  # under the Indexed wrapper
    if first:
        loader = make_loader(dataset, loader.batch_size, loader.num_workers, start=first * loader.batch_size)
    steps = 0
    with tqdm(total=total, initial=first, disable=not s.progress, unit="batch", desc="hookrun", dynamic_ncols=True) as bar:
        for step, (indices, batch) in enumerate(loader, start=first):
            if step >= total:
                break
            inputs, target = split_batch(batch)
            inputs = to_device(inputs, s.device)
            session.begin_step(step, len(indices), indices)
            generated = run_step(model, inputs, target, s)
            session.end_step()
            captures = env.captures.take()
            if generated is not None:
                generated.sort_rows(captures)
            writer.put(StepRecord(
                step=step,
                sample_index=indices.numpy(),
                target=target.detach().cpu().numpy() if target is not None else None,
                path=sample_paths(dataset, indices.tolist()),
                captures=captures,
                ticket=transfer.submit(captures),
                columns=generated.columns if generated is not None else None,
                tokens=generated.tokens if generated is not None else None,
            ))
            steps += 1
            bar.update()
            if s.should_stop():
                break
    return steps


def run_step(model: nn.Module, inputs: torch.Tensor, target: torch.Tensor | None, s: LoopSettings) -> Generated | None:
    """One batch through the model: a forward under no_grad (which early_stop may cut short), in
    grad mode forward, loss and backward, in generate mode model.generate (hookrun.runner.generate)."""
    if s.mode == "generate":
        return s.generation.step(model, inputs)
    if s.mode == "grad":
        _grad_step(model, inputs, target, s)
        return
    try:
        with torch.no_grad():
            model(inputs)
    except StopForward:
        pass
    return None


def _grad_step(model: nn.Module, inputs: torch.Tensor, target: torch.Tensor | None, s: LoopSettings) -> None:
    if inputs.is_floating_point():
        inputs.requires_grad_(True)
    output = model(inputs)
    loss = s.loss(output, target.to(s.device) if target is not None else None)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise RunError(f"loss: expected a scalar tensor, got {type(loss).__name__} {getattr(loss, 'shape', '')}")
    try:
        loss.backward()
    except RuntimeError as exc:
        if "BackwardHookFunctionBackward" in str(exc):
            raise RunError(
                "a backward hook's module has its output modified in place later in the forward pass "
                "(e.g. `out += identity` in a ResNet block), which full backward hooks cannot follow; "
                "hook the enclosing block instead, or use type: tensor on the same module"
            ) from None
        raise
    finally:
        model.zero_grad(set_to_none=True)
