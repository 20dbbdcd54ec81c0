"""The memory budget, spent on the first batch's measured bytes (never guessed).

    budget = Budget(model, block, forward, targets, forward_bytes)
    budget.internal_batch_size(n)      # integrated gradients: rows (samples x steps) per forward + backward
    budget.perturbations_per_eval      # occlusion: occluded copies of the batch per forward
    budget.rows_per_forward            # deletion / insertion: masked inputs per forward

The bytes of one row are measured as every budgeted kind's forwards are (runner/memory.py):
on CUDA the peak allocated during the first batch's forward, elsewhere the bytes of every tensor a
module returned in it; a forward that keeps its graph for a backward counts twice (its gradients).
Occlusion and the deletion / insertion curves also build their perturbed inputs before the forward
(captum's `expanded * (1 - mask) + baseline * mask`: three input-sized tensors per row at once), so
their row is the measured forward plus three input rows: on CUDA, a 224 px ResNet-18 with 2 GB
spent 2.33 GB on occlusion without them (benchmarks/attribution.py, docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hookrun.runner.kinds.attribution.block import Block
from hookrun.runner.memory import measure_bytes


class Budget:
    def __init__(self, model: nn.Module, block: Block, f: Any, targets: torch.Tensor, forward: int) -> None:
        """`forward`: the bytes the first batch's forward (no graph) took, measured by the engine."""
        self.block = block
        x = f.input.detach()
        n = max(1, x.shape[0])
        self.forward_row = max(1, forward // n)  # one row's forward, no graph
        self.grad_row = self.forward_row
        perturbed_row = self.forward_row + 3 * x[0].numel() * x.element_size()
        if block.method == "integrated_gradients":
            with torch.enable_grad():
                xg = x.clone().requires_grad_(x.is_floating_point())
                _, kept = measure_bytes(model, lambda: f(xg, *f.extras).gather(1, targets[:, None]).sum())
            self.grad_row = max(1, 2 * kept // n)
        self.rows_per_forward = max(1, block.memory // perturbed_row)
        self.perturbations_per_eval = max(1, block.memory // (perturbed_row * n))
        self.perturbed_row = perturbed_row

    def internal_batch_size(self, n: int) -> int:
        """Integrated gradients' rows per forward: at least the batch (captum's floor), at most every step's."""
        return int(min(n * self.block.steps, max(n, self.block.memory // self.grad_row)))

    def describe(self) -> dict[str, int]:
        """What the file's `attribution` attribute says of the budget."""
        ig = self.block.method == "integrated_gradients"
        out = {"bytes_per_row": int(self.grad_row if ig else self.perturbed_row)}
        if ig:
            out["rows_per_forward"] = int(max(1, self.block.memory // self.grad_row))
        if self.block.method == "occlusion":
            out["perturbations_per_eval"] = int(self.perturbations_per_eval)
        if self.block.measure:
            out["curve_rows_per_forward"] = int(self.rows_per_forward)
        return out
