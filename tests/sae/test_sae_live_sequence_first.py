"""The `sae:` kind on the fly at a sequence-first module (nn.TransformerEncoderLayer(batch_first=False),
output (tokens, batch, features)) with padding: each row is one real token of one item. The batch's
(batch, tokens) attention mask was applied to the (tokens, batch, features) output as it was; where
tokens == batch the shapes agree and the SAE trained on other items' tokens, padding among them, without
a word. Reference: the rows picked by hand (numpy) from a raw forward hook's output, SAELens' trainer on them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import hookrun

sae_lens = pytest.importorskip("sae_lens")
from sae_lens import TopKTrainingSAE, TopKTrainingSAEConfig  # noqa: E402
from saelens_reference import saelens_fit  # noqa: E402

B = T = 4


class SequenceFirst(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(11, 8)
        self.enc = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.enc(self.emb(input_ids).transpose(0, 1), src_key_padding_mask=~attention_mask.bool())
        return h.mean(0)


def test_on_the_fly_rows_at_a_sequence_first_module_are_each_items_real_tokens(tmp_path):
    torch.set_num_threads(1)
    model = SequenceFirst().eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 11, (2 * B, T), generator=g)
    lengths = [4, 1, 2, 3, 2, 4, 1, 3]
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    data = [{"input_ids": ids[i], "attention_mask": mask[i]} for i in range(2 * B)]
    seen = []
    h = model.enc.register_forward_hook(lambda m, a, o: seen.append(o.detach().numpy()))
    with torch.no_grad():
        for lo in (0, B):
            model(ids[lo:lo + B], mask[lo:lo + B])
    h.remove()
    m = mask.numpy().astype(bool)
    rows = np.concatenate([np.stack([out[t, i] for i in range(B) for t in range(T) if m[lo + i, t]])
                           for lo, out in zip((0, B), seen, strict=True)])  # by hand: item i's real token t
    assert len(rows) == sum(lengths) == 20
    cfg = {"data": {"batch_size": B}, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "s.h5")},
           "sae": {"at": "enc", "architecture": "topk", "d_sae": 16, "k": 4, "batch_rows": 5, "rows": 40,
                   "shuffle": False, "checkpoints": 0, "out": None, "lr_schedule": {"warmup": 2}}}
    result = hookrun.run(cfg, model=model, dataset=data)
    torch.manual_seed(0)
    ref = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=8, d_sae=16, k=4))
    logs = saelens_fit(ref, torch.from_numpy(rows), 40, 5, lr=3e-4, lr_end=3e-5, lr_warm_up_steps=2)
    with hookrun.open_run(result.path) as run:
        got = [r["mse_loss"] for r in run.sae_curves().rows]
    assert len(got) == len(logs) == 8
    assert got == pytest.approx([w["losses/mse_loss"] for w in logs], rel=1e-5)
