"""Train a tiny sparse autoencoder on a hookrun activation cache, reading it with the shuffled loader.

    python -m hookrun experiment=sae_cache                  # writes outputs/.../captures.h5
    python examples/train_sae.py outputs/.../captures.h5 --capture res/transformer.h.3/output --out saes/h3

The reader is the whole data pipeline: open_run(path).loader(capture) yields shuffled float
batches of token rows, each row once per epoch, with only a bounded window of the file in memory.
`--out DIR` saves the SAE as an SAELens folder (cfg.json + sae_weights.safetensors): SAELens'
`SAE.load_from_disk(DIR)` and hookrun's `load_sae(DIR)` (op splice) both read it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from hookrun import open_run


class SparseAutoencoder(nn.Module):
    """x -> relu((x - b_dec) W_enc + b_enc) = f -> f W_dec + b_dec; decoder rows of unit norm."""

    def __init__(self, d: int, features: int) -> None:
        super().__init__()
        self.W_enc = nn.Parameter(torch.randn(d, features) / d**0.5)
        self.W_dec = nn.Parameter(self.W_enc.detach().T.clone())
        self.b_enc = nn.Parameter(torch.zeros(features))
        self.b_dec = nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = torch.relu((x - self.b_dec) @ self.W_enc + self.b_enc)
        return f @ self.W_dec + self.b_dec, f


def train(path: str, capture: str, features: int = 4, epochs: int = 2, batch_size: int = 4096,
          l1: float = 1e-3, lr: float = 1e-3, seed: int = 0) -> tuple[SparseAutoencoder, list[float]]:
    """The SAE (features = `features` x the row width) and the mean loss of each epoch."""
    torch.manual_seed(seed)
    with open_run(path) as run:
        rows = run.loader(capture, batch_size=batch_size, seed=seed, dtype=torch.float32)
        info = run.find(*capture.split("/"))
        d = info.shape[1]
        sae = SparseAutoencoder(d, features * d)
        sae.hook_name = info.module  # the module path the rows came from
        opt = torch.optim.Adam(sae.parameters(), lr=lr)
        losses = []
        for epoch in range(epochs):
            rows.set_epoch(epoch)  # a new order each epoch
            total, n = 0.0, 0
            for x in rows:
                x_hat, f = sae(x)
                loss = (x_hat - x).pow(2).sum(-1).mean() + l1 * f.abs().sum(-1).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                with torch.no_grad():
                    sae.W_dec /= sae.W_dec.norm(dim=1, keepdim=True)
                total, n = total + loss.item() * len(x), n + len(x)
            losses.append(total / n)
            print(f"epoch {epoch}: loss {losses[-1]:.4f} over {n} rows")
    return sae, losses


def save_saelens(sae: SparseAutoencoder, out: str) -> Path:
    """Write `sae` as an SAELens 6 folder: cfg.json (architecture standard) + sae_weights.safetensors.
    The forward above is SAELens' standard SAE with apply_b_dec_to_input and no normalization."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    d_sae, d_in = sae.W_dec.shape
    cfg = {"architecture": "standard", "d_in": d_in, "d_sae": d_sae, "dtype": "float32", "device": "cpu",
           "apply_b_dec_to_input": True, "normalize_activations": "none", "reshape_activations": "none",
           # SAELens reads a cfg without sae_lens_version as a pre-6.0 one, whose `metadata` it drops
           "metadata": {"hook_name": getattr(sae, "hook_name", None), "sae_lens_version": "6.0.0",
                        "sae_lens_training_version": None}}
    (folder / "cfg.json").write_text(json.dumps(cfg, indent=2))
    save_file({k: v.detach().contiguous().cpu() for k, v in sae.state_dict().items()},
              str(folder / "sae_weights.safetensors"))
    return folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cache", help="a hookrun file (or run folder) with token rows")
    p.add_argument("--capture", required=True, help="hook/module/role, e.g. res/transformer.h.3/output")
    p.add_argument("--features", type=int, default=4, help="SAE width as a multiple of the row width")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--l1", type=float, default=1e-3)
    p.add_argument("--out", help="save the trained SAE here as an SAELens folder (read by hookrun's load_sae and by SAELens)")
    a = p.parse_args()
    sae, _ = train(a.cache, a.capture, a.features, a.epochs, a.batch_size, a.l1)
    if a.out:
        print(f"saved {save_saelens(sae, a.out)}")


if __name__ == "__main__":
    main()
