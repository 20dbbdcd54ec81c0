"""hookrun.patch_grid given its items as columns (a dict of clean, corrupt, answer, wrong tensors of n
rows each) or as a DataLoader is one line naming what to give, before any forward; they raised
Python's 'KeyError: 0' and "TypeError: 'DataLoader' object is not subscriptable". The items the
column line names give TransformerLens 3.9's get_act_patch_resid_pre grid."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hookrun
from hookrun.errors import ConfigError

pytest.importorskip("transformer_lens")
from patch_tasks import token_task  # noqa: E402
from test_patching import RESID, V, tl_metric  # noqa: E402
from tl_models import hooked_transformer  # noqa: E402
from transformer_lens import patching  # noqa: E402


def test_columns_and_a_dataloader_are_one_line_and_the_items_named_give_transformer_lens_grid():
    model = hooked_transformer(V, d_model=32, n_ctx=16, d_head=8, act_fn="gelu")
    clean, corrupt, ans, wrong, items = token_task(V, 3, 6, at=2)
    columns = {k: torch.stack([torch.as_tensor(it[k]) for it in items]) for k in items[0]}
    seen = []
    h = model.register_forward_hook(lambda *a: seen.append(1))
    with pytest.raises(ConfigError, match=r"^patch_grid: got a dict of columns \(.*: 3 rows each\), which has no item 0; "
                                          r"give one item per row: \[\{k: v\[i\] for k, v in d\.items\(\)\} for i in range\(n\)\]$"):
        hookrun.patch_grid(model, columns, input="input", sites={"resid": RESID})
    with pytest.raises(ConfigError, match=r"^patch_grid: got a DataLoader, whose items are batches; give the data set it "
                                          r"reads, loader\.dataset"):
        hookrun.patch_grid(model, torch.utils.data.DataLoader(items), input="input", sites={"resid": RESID})
    h.remove()
    assert not seen

    named = [{k: v[i] for k, v in columns.items()} for i in range(3)]  # what the line says to give
    g = hookrun.patch_grid(model, named, input="input", sites={"resid": RESID})["resid"]
    _, cache = model.run_with_cache(clean)
    ref = patching.get_act_patch_resid_pre(model, corrupt, cache, tl_metric(ans, wrong)).numpy()
    np.testing.assert_allclose(g.values, ref, atol=1e-4)
