"""The SAE tests' reference: SAELens 6's own SAETrainer on given rows in order, and SAELens' own folder.

    torch.manual_seed(5)
    ref = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=16, d_sae=64, k=8))   # built here, as SAELens builds it
    logs = saelens_fit(ref, rows, total=640, batch=32, lr_warm_up_steps=2, lr_decay_steps=4)
    loaded = assert_same_latents(run_dir / "sae", ref, rows, tmp_path / "ref")   # hookrun's folder, by SAELens
"""

from __future__ import annotations

from pathlib import Path

import torch


def saelens_fit(sae, rows: torch.Tensor, total: int, batch: int, lr: float = 1e-3, lr_end: float = 1e-4,
                fired: list | None = None, **trainer) -> list[dict]:
    """Train `sae` with SAETrainer on `rows` in order, again from the first row past the end, in
    ceil(total / batch) batches of `batch` rows; the per-step figures of its build_train_step_log_dict
    (`fired`: each step's latents that fired on some row of its batch, appended, from the step's activations)."""
    from sae_lens import SAETrainer
    from sae_lens.config import SAETrainerConfig

    steps = -(-total // batch)
    stream = torch.cat([rows] * -(-steps * batch // len(rows)))
    logs: list[dict] = []

    class Logged(SAETrainer):
        def step(self, batch_rows):
            out = super().step(batch_rows)
            logs.append(self.build_train_step_log_dict(out, self.n_training_samples))
            if fired is not None:
                fired.append((out.feature_acts.detach().to_dense() != 0).any(0).cpu())
            return out

    config = SAETrainerConfig(total_training_samples=total, train_batch_size_samples=batch, lr=lr, lr_end=lr_end,
                              **trainer)
    Logged(config, sae, iter([stream[i * batch:(i + 1) * batch] for i in range(steps)])).fit()
    return logs


def assert_same_latents(folder: Path, ref, rows: torch.Tensor, ref_folder: Path, tol: float = 1e-5):
    """The SAE folder hookrun wrote and `ref`'s save_inference_model folder, both read by SAELens'
    SAE.load_from_disk, encode `rows` alike; the first, loaded."""
    from sae_lens import SAE

    loaded = SAE.load_from_disk(str(folder))
    ref.save_inference_model(str(ref_folder))
    with torch.no_grad():
        torch.testing.assert_close(loaded.encode(rows), SAE.load_from_disk(str(ref_folder)).encode(rows),
                                   rtol=tol, atol=tol)
    return loaded
