"""Items longer than the model's learned positions, past the first: a list held in memory is checked
item by item before any batch, any other data set batch by batch before the forward, each in one line
naming the item(s). Before, only the first item was checked: a later, longer one failed mid-run in the
embedding ('IndexError: index out of range in self'), after the batches before it ran. The reference is
the model's own forward: 8 tokens run, 10 fail."""

from __future__ import annotations

import pytest
import torch
from toy_lm import tiny_gpt2

import hookrun
from hookrun.errors import ConfigError

pytest.importorskip("transformers")
TAIL = ("more than the 8 positions of GPT2LMHeadModel (transformer.wpe); set data.dataset.max_length=8 or less "
        "(data=text cuts each text to it), or give shorter items")


class Items(torch.utils.data.Dataset):  # (not a list: read only when loaded)
    def __init__(self, items: list[dict]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


@pytest.mark.parametrize("held", [True, False])
def test_a_later_item_past_the_positions_is_one_line_naming_it(tmp_path, held):
    model = tiny_gpt2(0, n_positions=8)
    with torch.no_grad():
        model(input_ids=torch.full((1, 8), 3))
        with pytest.raises(IndexError):
            model(input_ids=torch.full((1, 10), 3))
    items = [{"input_ids": torch.full((6 if i != 5 else 10,), 3), "attention_mask": torch.ones(6 if i != 5 else 10, dtype=torch.long)}
             for i in range(8)]
    hooks = {"r": {"at": "transformer.h.0", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    cfg = {"data": {"batch_size": 1}, "device": "cpu", "progress": False, "hooks": hooks,
           "output": {"path": str(tmp_path / "p.h5")}}
    seen = []
    h = model.transformer.wpe.register_forward_hook(lambda *a: seen.append(1))
    with pytest.raises(ConfigError) as got:
        hookrun.run(cfg, model=model, dataset=items if held else Items(items))
    h.remove()
    if held:
        assert str(got.value) == f"data: item 5 holds 10 tokens (input_ids), {TAIL}"
        assert not seen and not (tmp_path / "p.h5").exists()  # before any batch
    else:
        assert str(got.value) == f"data: batch 5 (items 5..5) holds 10 tokens (input_ids), {TAIL}"
        assert len(seen) == 5  # batches 0..4 ran, batch 5's forward never started
