"""Configs of the small runs many reliability tests share: a toy model of tests/helpers/toy_models.py over
its signed rows, and a model of one `lin` layer over data the test hands in.

    cfg = toy_cfg(tmp_path, "toy_models.WithSpare", hooks, seed=1)   # make_cfg's overrides, dotted
    hookrun.run(lin_cfg(tmp_path, data={"dataset": ...}), model=m)
"""

from __future__ import annotations

from pathlib import Path

from conftest import make_cfg

RECORD_BODY = {"b": {"at": "body", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}


def toy_cfg(tmp_path: Path, model: str = "toy_models.CountingNet", hooks=None, **over) -> dict:
    cfg = make_cfg(tmp_path, "", hooks or RECORD_BODY, **over)
    cfg["model"] = {"_target_": model}
    cfg["data"]["dataset"] = {"_target_": "toy_models.SignedRows"}
    return cfg


def lin_cfg(tmp_path: Path, **over) -> dict:
    hooks = {"r": {"at": "lin", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    return {"data": {"batch_size": 2}, "device": "cpu", "progress": False, "hooks": hooks,
            "output": {"path": str(tmp_path / "c.h5")}, **over}
