"""The plan's estimate: one sample through the hooks, to learn each capture's shape and size.

    report = estimate(model, loader, points, env, settings, n_samples)   # settings.batches: the run's batches
    print(report.text())        # what `dry_run=true` prints
    report.total_bytes          # what `output.max_bytes` is checked against

It runs a batch of one (the dataset's first item) with a fresh hook session, so the real run
starts from a clean state; nothing is written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from hookrun.hooks.actions import ActionEnv
from hookrun.hooks.plan import HookPoint
from hookrun.hooks.session import HookSession
from hookrun.labels import capture_label, module_label
from hookrun.runner.batches import first_batch
from hookrun.store.records import Capture


@dataclass
class Line:
    capture: Capture
    row_bytes: int
    rows: int

    @property
    def total(self) -> int:
        return self.row_bytes * self.rows


@dataclass
class Estimate:
    points: list[HookPoint]
    lines: list[Line] = field(default_factory=list)
    n_samples: int = 0
    n_batches: int = 0
    header: list[str] = field(default_factory=list)
    extra_bytes: int = 0  # mode=generate: generated ids and the token-row map

    @property
    def total_bytes(self) -> int:
        return sum(line.total for line in self.lines) + self.n_samples * 16 + self.extra_bytes  # + /samples/index, /samples/step

    def text(self) -> str:
        # (dry_run's printout only: analysis/ is not on a run's route)
        from hookrun.analysis.stats import human_bytes

        out = list(self.header)
        by_hook: dict[str, list[HookPoint]] = {}
        for p in self.points:
            by_hook.setdefault(p.hook, []).append(p)
        for hook, points in by_hook.items():
            names = ", ".join(module_label(p.module) for p in points)
            out.append(f"  hook {hook}: {points[0].type} -> {len(points)} {'target' if len(points) == 1 else 'targets'}: {names}")
            for line in (ln for ln in self.lines if ln.capture.key.hook == hook):
                c = line.capture
                shape = ("n",) if c.ragged else tuple(c.value.shape) if c.per_step else tuple(c.value.shape[1:])
                unit = "step" if c.per_step else "token" if c.tokens else "sample"
                label = capture_label(c.key.module, c.key.role, c.key.call)
                dtype = c.value[0].dtype if c.ragged else c.value.dtype
                out.append(f"    {label:34s} {str(dtype).replace('torch.', ''):8s} {str(shape):20s} "
                           f"{human_bytes(line.row_bytes):>10s}/{unit} x {line.rows} = {human_bytes(line.total)}")
            if not any(ln.capture.key.hook == hook for ln in self.lines):
                out.append("    (records nothing)")
        out.append(f"  estimated file size: {human_bytes(self.total_bytes)} for {self.n_samples} samples in {self.n_batches} batches (uncompressed)")
        return "\n".join(out)


def estimate(model: torch.nn.Module, loader, points: list[HookPoint], env: ActionEnv, settings, n_samples: int,
             checksum: bool = False) -> Estimate:
    n_batches = len(settings.batches)
    kind = settings.kind
    indices, call = first_batch(loader, settings.spec)
    call = call.to(settings.device)
    with HookSession(points, env) as session:
        session.begin_step(0, 1, indices, call.attention_mask)
        kind.sample_step(model, call, session)
        captures = env.captures.take()
    tokens = kind.token_rows(call)  # mode=generate: token rows per sample, at most (more than the prompt's)
    for p in points:
        for action in p.actions:
            action.reset()
    report = Estimate(points, n_samples=n_samples, n_batches=n_batches)
    target = call.target if isinstance(call.target, torch.Tensor) and call.target.dim() else None  # /samples/target
    per_target = target[0].numel() * target.element_size() if target is not None else 0
    report.extra_bytes = kind.file_bytes(n_samples) + n_samples * (tokens * 17 + per_target)  # 17: a token row's map
    if checksum:  # output.checksum: a (batch, capture) row of 3 uint64 in /checksums, 1,024 rows a chunk
        report.extra_bytes += math.ceil(n_batches * max(len(captures), 1) / 1024) * 1024 * 24
    for cap in captures:
        every = int(cap.attrs.get("every", 1))
        limit = cap.attrs.get("limit")
        if cap.ragged:  # variable-length rows: the first sample's size stands for all
            row_bytes = sum(v.numel() * v.element_size() for v in cap.value)
            rows = n_batches if cap.per_step else n_samples
        elif cap.tokens:  # the first sample's tokens stand for every sample's
            row_bytes = cap.value[0].numel() * cap.value.element_size()
            rows = n_samples * (tokens or len(cap.value))
        elif cap.per_step:
            row_bytes = cap.value.numel() * cap.value.element_size()
            rows = math.ceil(n_batches / every)
        else:
            row_bytes = cap.value[0].numel() * cap.value.element_size()
            rows = n_samples if every == 1 else math.ceil(n_batches / every) * max(1, n_samples // max(n_batches, 1))
        if limit:
            rows = min(rows, int(limit))
        report.lines.append(Line(cap, row_bytes, rows))
    return report
