"""sae.evaluate in a run given its data set as an object (hookrun.run(cfg, dataset=...)): the evaluation
cannot rebuild that object from config, so it is refused in one line before any step unless
sae.evaluate.data names the held-out items' data set (a `_target_` node), which is then used as given (it
failed after the whole training: `data.dataset: expected a node with _target_ ..., got {'live': ...}`).
Reference: SAELens' own SAE (load_from_disk) spliced by a raw forward hook, the loss by torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import hookrun
from hookrun.data import RandomTensors
from hookrun.errors import ConfigError

sae_lens = pytest.importorskip("sae_lens")
from sae_items import HELD_OUT, Items, make_model  # noqa: E402


def test_evaluate_with_a_live_data_set(tmp_path):
    cache = hookrun.run({"hooks": {"h": {"at": "0", "type": "forward", "actions": [{"name": "record", "what": "output"}]}},
                         "device": "cpu", "progress": False, "data": {"batch_size": 16},
                         "output": {"path": str(tmp_path / "cache.h5")}}, model=make_model(), dataset=Items()).path

    def cfg(name: str, evaluate: dict) -> dict:
        return {"device": "cpu", "progress": False, "data": {"batch_size": 16},
                "loss": {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True},
                "output": {"path": str(tmp_path / name / "captures.h5")},
                "sae": {"from": str(cache), "capture": "h/0/output", "architecture": "topk", "k": 4, "d_sae": 32,
                        "batch_rows": 16, "rows": 128, "shuffle": False, "out": str(tmp_path / name / "sae"),
                        "evaluate": evaluate}}

    with pytest.raises(ConfigError) as info:
        hookrun.run(cfg("bad", {"data": {"batch_size": 8}}), model=make_model(), dataset=Items())
    assert str(info.value) == (
        "sae.evaluate: the run's data set is the object given to hookrun.run (dataset=...), which the evaluation "
        "cannot rebuild; give the held-out items' data set as sae.evaluate.data.dataset (a node with _target_)")
    assert not (tmp_path / "bad" / "captures.h5").exists()  # (before any step)

    model = make_model()
    run = hookrun.run(cfg("good", {"data": {"dataset": HELD_OUT}}), model=model, dataset=Items())
    assert run.status == "complete"
    with hookrun.open_run(run.path) as r:
        got = r.sae_evaluation
    assert got["items"] == 32
    sae = sae_lens.SAE.load_from_disk(str(tmp_path / "good" / "sae"))
    items = RandomTensors(n=32, shape=(8,), num_classes=16, seed=7)
    ce = {"clean": [], "spliced": []}
    for x, y in DataLoader(items, batch_size=16):
        with torch.no_grad():
            ce["clean"].append(F.cross_entropy(model(x), y, reduction="sum"))
            handle = model[0].register_forward_hook(lambda m, i, o: sae.decode(sae.encode(o)))
            ce["spliced"].append(F.cross_entropy(model(x), y, reduction="sum"))
            handle.remove()
    assert got["model"]["ce_clean"] == pytest.approx(float(sum(ce["clean"])) / 32, rel=1e-5)
    assert got["model"]["ce_intervened"] == pytest.approx(float(sum(ce["spliced"])) / 32, rel=1e-5)
