"""A tokenizer's batch given as the data set (a dict or transformers' BatchEncoding of columns:
input_ids, attention_mask, each (items, tokens)) is refused in one line naming its columns and what
to give, before any forward; it failed reading item 0 with 'data: loading the first 1 item(s) before
the run failed: KeyError: 0'. The items the line says to give run: their CKA equals numpy's linear CKA
of each text's mean token row, each text run alone through a raw forward hook, padding left out."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gpt2_rows import VOCAB, rows_alone, tiny_gpt2_model

import hookrun
from hookrun.errors import ConfigError

transformers = pytest.importorskip("transformers")


def _columns(n: int = 12, width: int = 7) -> tuple[dict, list[np.ndarray]]:
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(2, width + 1, (n,), generator=g)
    ids, mask = torch.zeros(n, width, dtype=torch.long), torch.zeros(n, width, dtype=torch.long)
    texts = []
    for i, k in enumerate(lengths.tolist()):
        text = torch.randint(1, VOCAB, (k,), generator=g)
        ids[i, :k], mask[i, :k] = text, 1  # right padding
        texts.append(text.numpy())
    return {"input_ids": ids, "attention_mask": mask}, texts


def _cka(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(0), b - b.mean(0)
    return float(np.linalg.norm(a.T @ b) ** 2 / (np.linalg.norm(a.T @ a) * np.linalg.norm(b.T @ b)))


@pytest.mark.parametrize("wrap", [dict, transformers.BatchEncoding])
def test_a_batch_of_columns_is_one_line_before_any_forward_and_its_items_run(wrap):
    model, (batch, texts) = tiny_gpt2_model(), _columns()
    seen = []
    h = model.register_forward_hook(lambda *a: seen.append(1))
    with pytest.raises(ConfigError) as info:
        hookrun.similarity(model, wrap(batch), at=["h.0", "h.1"], pool="mean", batch_size=4)
    h.remove()
    assert str(info.value) == (f"run(dataset=...): got a {wrap.__name__} of columns (input_ids, attention_mask: 12 rows "
                               "each), which has no item 0; give one item per row: [{k: v[i] for k, v in d.items()} "
                               "for i in range(n)]")
    assert not seen

    items = [{k: v[i] for k, v in batch.items()} for i in range(12)]  # what the line says to give
    m = hookrun.similarity(model, items, at=["h.0", "h.1"], pool="mean", batch_size=4)
    means = [np.stack([r.mean(0) for r in rows_alone(model, texts, block)]) for block in (0, 1)]
    assert m.values[0, 1] == pytest.approx(_cka(means[0], means[1]), rel=1e-6)
