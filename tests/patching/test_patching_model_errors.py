"""A patching run whose model raises in its forward (the model's own error, mid-run) stops in one
RunError line naming the model, its inputs and the model's message, as a record run does
(runner/calls.py: model_forward), with the model's exception as its __cause__ and the file marked
failed; it was the model's raw exception, an 85-line traceback on the command line, for exact
grids, attribution patching and edges."""

from __future__ import annotations

import h5py
import pytest
from op_models import gpt2
from patch_tasks import token_task
from toy_models import raising_at

import hookrun
from hookrun.errors import RunError

SITES = {"resid": {"at": "transformer.h.*", "over": ["position"]}}
METRIC = {"name": "logit_diff", "answer": "answer", "wrong": "wrong", "position": -1}


@pytest.mark.parametrize("method,fail_at", [("exact", 1), ("exact", 3), ("atp", 3), ("eap", 3), ("eap_ig", 4)])
def test_the_models_own_error_is_one_line_and_the_file_failed(tmp_path, method, fail_at):
    _, _, _, _, items = token_task(50, n=4, length=6, at=2)
    model = gpt2(2)
    calls = raising_at(model, fail_at, ValueError("boom: the model's own error"))
    block = {"input": "input_ids", "clean": "clean", "corrupt": "corrupt", "method": method, "metric": METRIC,
             **({"graph": "auto"} if method.startswith("eap") else {"sites": SITES})}
    cfg = {"patching": block, "data": {"batch_size": 4, "target": None}, "progress": False,
           "output": {"path": str(tmp_path / "run.h5")}}
    with pytest.raises(RunError) as info:
        hookrun.run(cfg, model=model, dataset=items)
    assert str(info.value).startswith("the model's forward failed: GPT2LMHeadModel(input_ids=[")
    assert "raised ValueError: boom: the model's own error (the traceback: HYDRA_FULL_ERROR=1 or --verbose)" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError) and calls[0] == fail_at
    if (tmp_path / "run.h5").exists():  # (a run stopped before its file opened leaves none)
        with h5py.File(tmp_path / "run.h5", "r") as f:
            assert f.attrs["status"] == "failed"
