"""Train the small CNN shipped as model=tiny_cnn, on generated shapes every install can make.

    python examples/train_tiny_cnn.py                           # the shipped run: hookrun/models/tiny_cnn/
    python examples/train_tiny_cnn.py --epochs 1 --out /tmp/cnn # a quick check that it runs

The images are hookrun.data.shapes (a circle, square, triangle or cross at a random place, drawn
with numpy from seed and index); samples 0..N-1 of seed 1 train it, seed 2's are held out (the
experiments read seed 0). Reproducible: one seed, CPU only, one thread, deterministic algorithms;
two runs with the same arguments on the same torch give the same weights. Writes model.safetensors
and training.json (arguments, held-out accuracy per epoch, versions). Under a minute on one core.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hookrun.data.shapes import shapes
from hookrun.models.tiny_cnn import FOLDER, TinyCNN


def tensors(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    ds = shapes(size=size, seed=seed)
    items = [ds[i] for i in range(size)]
    return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", type=int, default=3000)
    p.add_argument("--held-out", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=FOLDER)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    start = time.time()
    x, y = tensors(a.train, seed=1)
    hx, hy = tensors(a.held_out, seed=2)
    model = TinyCNN()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=1e-4)
    g = torch.Generator().manual_seed(a.seed)
    log = [{"epoch": 0, "held_out_accuracy": round(accuracy(model, hx, hy), 4)}]
    for epoch in range(1, a.epochs + 1):
        model.train()
        for batch in torch.randperm(len(x), generator=g).split(a.batch_size):
            loss = F.cross_entropy(model(x[batch]), y[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        log.append({"epoch": epoch, "loss": round(loss.item(), 4), "held_out_accuracy": round(accuracy(model, hx, hy), 4)})
        print(log[-1], flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(a.out / "model.safetensors"))
    record = {"command": "python examples/train_tiny_cnn.py", "arguments": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items() if k != "out"},
              "data": "hookrun.data.shapes: train seed 1, held out seed 2 (32 x 32 grey images, 4 classes)",
              "held_out_accuracy": log[-1]["held_out_accuracy"], "log": log, "seconds": round(time.time() - start, 1),
              "torch": torch.__version__, "python": platform.python_version()}
    (a.out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"held-out accuracy {record['held_out_accuracy']:.3f}; wrote {a.out} in {record['seconds']} s")


if __name__ == "__main__":
    main()
