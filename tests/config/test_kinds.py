"""Run kinds (hookrun.runner.kinds) and the config's one source of defaults and checks.

References: raw PyTorch forward hooks and the model's own forward (values), the schema's dataclasses
(defaults), a fresh interpreter's sys.modules (what `import hookrun` loads)."""

from __future__ import annotations

import logging
import os

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
import warm_python
import yaml
from conftest import ROOT, run_cli
from omegaconf import OmegaConf
from torch import nn

import hookrun
from hookrun.config import TOGETHER, load
from hookrun.config.schema import HookrunConfig, Mode
from hookrun.errors import ConfigError, RunError
from hookrun.hooks import Phase
from hookrun.runner.kinds import KINDS, RunKind, StepAdds, check_config, kind_for


def tiny() -> tuple[nn.Module, torch.utils.data.TensorDataset]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval()
    return model, torch.utils.data.TensorDataset(torch.randn(6, 4), torch.zeros(6, dtype=torch.long))


RECORD = {"h": {"at": "0", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}


def test_the_kind_follows_the_mode_or_the_block_on():
    base = {"model": {"_target_": "x"}, "data": {"dataset": {"_target_": "y"}}}
    assert kind_for(load(base)).name == "record"
    assert kind_for(load({**base, "mode": "grad"})).name == "grad"
    assert kind_for(load({**base, "mode": "generate"})).name == "generate"
    assert kind_for(load({**base, "evaluate": {}})).name == "evaluate"  # a Python block turns it on
    assert kind_for(load({**base, "evaluate": {"ablation": "zero", "enabled": None}})).name == "evaluate"
    assert kind_for(load({**base, "evaluate": {"enabled": False}})).name == "record"
    assert kind_for(load({**base, "evaluate": None})).name == "record"


QUIET = Phase("intervened")  # INTERVENED's name with CLEAN's flags: the firing closure must read the flags


class TwoForwards(RunKind):
    """A kind written as a user would: a forward in a phase where no action runs, then the
    configured one, and a per-sample column of its own."""

    mode = Mode.eval
    forwards = 2

    def step(self, model, call, session):
        with session.phase(QUIET):
            with torch.no_grad():
                clean = call.run(model)
        with torch.no_grad():
            call.run(model)
        return StepAdds(samples={"clean_sum": clean.sum(1).numpy()})


def test_a_new_kind_is_one_class_and_one_registration(tmp_path, monkeypatch):
    monkeypatch.setitem(KINDS._items, "record", TwoForwards)  # in place of the record kind
    model, ds = tiny()
    cfg = {"hooks": RECORD, "device": "cpu", "progress": False, "data": {"batch_size": 4},
           "output": {"path": str(tmp_path / "k.h5")}}
    path = hookrun.run(cfg, model=model, dataset=ds).path
    x = ds.tensors[0]
    seen = []
    handle = model[0].register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    with torch.no_grad():
        out = torch.cat([model(x[:4]), model(x[4:])])
    handle.remove()
    with h5py.File(path) as f:
        # one row per sample: the quiet forward fired the hook but recorded nothing
        np.testing.assert_array_equal(f["captures/h/0/output"][:], torch.cat(seen).numpy())
        np.testing.assert_allclose(f["samples/clean_sum"][:], out.sum(1).numpy(), rtol=1e-6)


RECORD_H0 = ("+hooks.r.type=forward", "+hooks.r.actions=[{name: record, what: output}]")


@pytest.mark.parametrize("block, over", [
    # a raw StopForward (an empty message) out of the similarity kind's forward
    ("similarity", ("experiment=cka_resnet", "+hooks.r.at=layer1", *RECORD_H0)),
    # the cut after h.0 kept probe.at's h.1..h.3 from running: "did not run in the model's forward"
    ("probe", ("experiment=probe_tokens", "+hooks.r.at=transformer.h.0", *RECORD_H0)),
    ("patching", ("experiment=patching_grid",)),  # (run in full, early_stop silently ignored)
])
def test_early_stop_with_a_block_kind_is_one_line_before_any_batch(tmp_path, block, over):
    cfg = hookrun.compose(*over, "early_stop=true", "data.limit=1", "progress=false",
                          f"output.path={tmp_path / 'e.h5'}")
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg)
    assert str(err.value) == (f"early_stop=true cuts each forward after the last hook, but the {block} block runs "
                              f"forwards of its own that read modules or outputs past it; drop early_stop")
    assert not (tmp_path / "e.h5").exists()


def test_a_user_exception_called_stopforward_is_a_model_error(tmp_path):
    class StopForward(Exception):  # noqa: N818  (the name early_stop's own class has)
        pass

    class Raises(nn.Module):
        def forward(self, x):
            raise StopForward("boom")

    _, ds = tiny()
    cfg = {"hooks": None, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "s.h5")}}
    with pytest.raises(RunError, match="the model's forward failed: .* raised StopForward: boom"):
        hookrun.run(cfg, model=Raises(), dataset=ds)


def test_every_together_row_is_one_line_naming_its_option():
    base = {"model": {"_target_": "x"}, "data": {"dataset": {"_target_": "y"}}}
    cases = {"mode=grad": {"mode": "grad"}, "early_stop": {"mode": "grad", "early_stop": True, "loss": {"_target_": "l"}},
             "evaluate": {"mode": "grad", "evaluate": {}, "loss": {"_target_": "l"}},
             "mode=generate": {"mode": "generate", "loss": {"_target_": "l"}},
             "evaluate.mean": {"evaluate": {"ablation": "zero", "mean": "x.h5"}, "loss": {"_target_": "l"}},
             "patching": {"mode": "grad", "loss": {"_target_": "l"}, "patching": {"sites": {"r": {"at": "x"}}}},
             "resume": {"resume": True, "output": {"overwrite": True}}}
    for option, over in cases.items():
        with pytest.raises(ConfigError) as err:
            check_config(load({**base, **over}))
        assert "\n" not in str(err.value) and str(err.value).startswith(option.split("=")[0]), (option, err.value)
    assert {row.option.split("=")[0].split(".")[0] for row in TOGETHER} <= {"mode", "evaluate", "early_stop", "patching", "resume"}


def test_every_key_the_yaml_restates_has_the_schemas_default():
    conf = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text())
    schema = OmegaConf.to_container(OmegaConf.structured(HookrunConfig))
    checked = []

    def walk(node: dict, default: dict, prefix: str) -> None:
        for key, value in node.items():
            if key in ("defaults", "hydra") and not prefix:
                continue
            if prefix == "generate." and key not in default and value is None:
                continue  # generate's nulls are dropped (null: generate()'s own default): the same as absent
            assert key in default, f"conf/config.yaml restates {prefix}{key}, which the schema does not have"
            if isinstance(value, dict) and isinstance(default[key], dict) and value:
                walk(value, default[key], f"{prefix}{key}.")
                continue
            want = default[key]
            want = want.value if hasattr(want, "value") else want  # enums: their YAML spelling
            assert value == want, f"conf/config.yaml: {prefix}{key}: {value!r}, the schema's default is {want!r}"
            checked.append(prefix + key)

    walk(conf, schema, "")
    assert {"output.part_bytes", "mode", "generate.max_new_tokens"} <= set(checked)


def test_import_hookrun_builds_no_hydra_app():
    code = ("import sys, hookrun\n"
            "assert 'hookrun.cli.app' not in sys.modules and 'hookrun.cli.compose' not in sys.modules\n"
            "from hydra.core.config_store import ConfigStore\n"
            "assert 'hookrun_schema.yaml' not in ConfigStore.instance().repo\n"
            "cfg = hookrun.compose('device=cpu')\n"
            "assert cfg['device'] == 'cpu' and 'hookrun.cli.app' in sys.modules\n"
            "print('ok')\n")
    # (a warm_python child: hookrun is imported fresh in it; Hydra is imported but nothing of hookrun's is in its store)
    proc = warm_python.run_code(code, [], cwd=ROOT, env=dict(os.environ), timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_an_evaluate_run_does_not_warn_that_nothing_is_recorded(tmp_path, caplog):
    model, ds = tiny()
    scale = {"s": {"at": "0", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": 0.5}]}}
    cfg = {"hooks": scale, "device": "cpu", "progress": False, "evaluate": {}, "data": {"batch_size": 3},
           "loss": {"_target_": "torch.nn.functional.cross_entropy", "_partial_": True},
           "output": {"path": str(tmp_path / "e.h5")}}
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        path = hookrun.run(cfg, model=model, dataset=ds).path
    assert "no hook records anything" not in caplog.text
    x, y = ds.tensors
    with torch.no_grad():  # ce_clean per batch against the model's own forward
        want = [float(F.cross_entropy(model(x[i:i + 3]), y[i:i + 3])) for i in (0, 3)]
    with h5py.File(path) as f:
        np.testing.assert_allclose(f["evaluation/model/ce_clean"][:], want, rtol=1e-6)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        hookrun.run({**cfg, "evaluate": None, "loss": None, "output": {"path": str(tmp_path / "p.h5")}},
                    model=model, dataset=ds)
    assert "no hook records anything" in caplog.text  # a plain run that records nothing still says so


@pytest.mark.slow
def test_evaluate_ablation_on_the_command_line_evaluates(tmp_path):
    from hookrun.models import tiny_lm

    out = tmp_path / "e.h5"
    proc = run_cli("model=tiny_lm", "data=text", "loss=lm", "data.dataset.files=pydoc_topics", "data.dataset.limit=4",
                   "data.batch_size=4", "device=cpu", "progress=false", "evaluate.ablation=zero",
                   "+hooks.s={at: transformer.h.0, type: forward, actions: [{name: modify_output, op: scale, factor: 0.5}]}",
                   f"output.path={out}", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    model = tiny_lm().eval()
    with h5py.File(out) as f:
        ids = torch.from_numpy(f["samples/input_ids"][:])
        mask = torch.from_numpy(f["samples/attention_mask"][:])
        got = {k: float(f[f"evaluation/model/{k}"][0]) for k in ("ce_clean", "ce_ablated")}
    keep = mask[:, 1:].bool()

    def ce() -> float:
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits
        return float(F.cross_entropy(logits[:, :-1][keep], ids[:, 1:][keep]))

    clean = ce()
    handle = model.transformer.h[0].register_forward_hook(
        lambda m, i, o: (torch.zeros_like(o[0]), *o[1:]) if isinstance(o, tuple) else torch.zeros_like(o))
    ablated = ce()
    handle.remove()
    assert got["ce_clean"] == pytest.approx(clean, rel=1e-5)
    assert got["ce_ablated"] == pytest.approx(ablated, rel=1e-5) and ablated > clean


def test_kinds_register_themselves():
    assert set(KINDS) >= {"record", "grad", "generate"}
    assert all(KINDS.get(n).name == n for n in KINDS)
