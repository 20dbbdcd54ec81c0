"""docs/architecture.md's example kind, copied verbatim from the page into a package outside hookrun/ and
found as the page says: a module named in `imports:`. The package (its `KIND = KindPlugin(...)` in its
__init__.py, no register_plugin call) was not found that way: "Key 'scaled' not in 'HookrunConfig'; did
you mean sae?". References: a raw PyTorch forward hook on the same model and inputs (the sums), h5py."""

from __future__ import annotations

import re
import sys

import h5py
import numpy as np
import pytest
import torch
from conftest import ROOT

from hookrun.errors import ConfigError

PAGE = ROOT / "docs" / "architecture.md"


def docs_package(root) -> None:
    """my_kinds/__init__.py and my_kinds/kind.py, as the page's one code block writes them."""
    block = re.search(r"```python\n(# my_kinds/__init__\.py.*?)```", PAGE.read_text(), re.S)
    assert block, "docs/architecture.md has no my_kinds example"
    init, kind = block.group(1).split("# my_kinds/kind.py\n")
    (root / "my_kinds").mkdir(parents=True)
    (root / "my_kinds/__init__.py").write_text(init)
    (root / "my_kinds/kind.py").write_text(kind)


@pytest.fixture
def my_kinds(tmp_path, monkeypatch):
    from hookrun.analysis.kind_readers import READERS
    from hookrun.config.schema import _PLUGINS

    docs_package(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield
    _PLUGINS.pop("scaled", None)
    READERS.pop("scaled", None)
    for name in [m for m in sys.modules if m == "my_kinds" or m.startswith("my_kinds.")]:
        del sys.modules[name]


def test_the_pages_kind_named_in_imports_runs_as_a_raw_forward_hook_says(my_kinds, tmp_path):
    import hookrun

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)).eval()
    x = torch.randn(10, 4)
    cfg = {"imports": ["my_kinds"], "scaled": {"factor": 2.5}, "device": "cpu", "progress": False,
           "data": {"batch_size": 4}, "output": {"path": str(tmp_path / "s.h5")}}
    path = hookrun.run(cfg, model=model, dataset=x).path
    seen = []
    handle = model.register_forward_hook(lambda module, args, out: seen.append(out))
    with torch.no_grad():
        model(x)
    handle.remove()
    with h5py.File(path) as f:
        assert f.attrs["kind"] == "scaled" and f.attrs["status"] == "complete"
        np.testing.assert_allclose(f["captures/scaled/__model__/sum"][:], (seen[0].sum(1) * 2.5).numpy(), rtol=1e-6)
    # the block's check(), as the page writes it: one line before any batch
    with pytest.raises(ConfigError, match=r"^scaled\.factor=-1\.0: must be above 0 \(e\.g\. 2\.0\)$"):
        hookrun.run({**cfg, "scaled": {"factor": -1}, "output": {"path": str(tmp_path / "never.h5")}},
                    model=model, dataset=x)
    assert not (tmp_path / "never.h5").exists()


def test_a_kind_in_imports_named_as_hookruns_own_is_one_line_naming_the_module(tmp_path, monkeypatch):
    import hookrun

    (tmp_path / "my_probe_kind.py").write_text("from hookrun.config.plugins import KindPlugin\n"
                                               "KIND = KindPlugin('probe', block='a.b:C', run='a.b:D')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        hookrun.run({"imports": ["my_probe_kind"], "device": "cpu", "output": {"path": str(tmp_path / "p.h5")}},
                    model=torch.nn.Linear(4, 3), dataset=torch.randn(4, 4))
    assert str(caught.value) == ("imports: my_probe_kind.KIND: register_plugin('probe'): 'probe' is one of hookrun's "
                                 "own kinds; give the kind another name")
    assert not (tmp_path / "p.h5").exists()


def test_the_pages_kind_not_found_says_where_a_kind_is_found(my_kinds, tmp_path):
    """(it said "Key 'scaled' not in 'HookrunConfig'; did you mean sae?", and nothing of how a kind is found)"""
    import hookrun

    with pytest.raises(ConfigError) as caught:  # my_kinds on the path, but neither an entry point nor in imports:
        hookrun.run({"scaled": {"factor": 2.5}, "device": "cpu", "output": {"path": str(tmp_path / "n.h5")}},
                    model=torch.nn.Linear(4, 3), dataset=torch.randn(4, 4))
    assert str(caught.value).endswith(
        " (no kind of run named 'scaled' here: a user's kind is found through its package's entry point in the group "
        "hookrun.kinds (is the package on this Python's path?) or a module named in imports:; docs/architecture.md)")
    assert not (tmp_path / "n.h5").exists()


def test_the_pages_kind_dry_run_lists_its_captures_as_the_run_writes_them(my_kinds, tmp_path, capsys):
    """dry_run counted the kind's captures in its file size but listed none of them, nor the kind (the plan of
    +scaled={factor: 2.5} read as an ordinary run's with 0 hook points). Reference: the model's own output
    (its sum per sample: a float32 scalar) and the written dataset's bytes (h5py)."""
    import hookrun

    model, x = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)).eval(), torch.randn(10, 4)
    cfg = {"imports": ["my_kinds"], "scaled": {"factor": 2.5}, "device": "cpu", "progress": False,
           "data": {"batch_size": 4}, "output": {"path": str(tmp_path / "d.h5")}}
    capsys.readouterr()
    hookrun.run({**cfg, "dry_run": True}, model=model, dataset=x)
    plan = capsys.readouterr().out
    with torch.no_grad():
        per_sample = model(x).sum(1)[0]
    row = f"{per_sample.element_size()} B/sample x {len(x)} = {per_sample.element_size() * len(x)} B"
    assert re.search(rf"^  the scaled kind's own captures:\n    scaled/\(model\) sum +float32 +\(\) +{row}$", plan, re.M), plan
    path = hookrun.run(cfg, model=model, dataset=x).path
    with h5py.File(path) as f:
        written = f["captures/scaled/__model__/sum"]
        assert written.dtype == np.float32 and written.shape == (len(x),) and written.nbytes == per_sample.element_size() * len(x)


def test_the_pages_kind_with_mode_grad_is_one_line_before_the_model_is_built(my_kinds, tmp_path):
    """The page's kind makes plain forwards (no_grad): with mode=grad its backward hook never fired, and a
    warning said so after every batch had run. Refused before the model is built, unless the kind's class
    has a check_mode of its own (then it runs: its rows against the model called directly)."""
    from my_kinds.kind import Block, ScaledKind

    import hookrun
    from hookrun.config.plugins import KindPlugin, register_plugin
    from hookrun.config.schema import _PLUGINS

    model, x = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)).eval(), torch.randn(8, 4)
    built = []
    cfg = {"imports": ["my_kinds"], "scaled": {"factor": 2.5}, "mode": "grad", "loss": {"_target_": "torch.nn.MSELoss"},
           "device": "cpu", "progress": False, "data": {"batch_size": 4}, "output": {"path": str(tmp_path / "g.h5")},
           "hooks": {"g": {"at": "0", "type": "backward", "actions": ["record"]}}}
    with pytest.raises(ConfigError) as caught:
        hookrun.run({**cfg, "model": {"_target_": f"{__name__}.counted", "built": built}}, dataset=x)
    assert str(caught.value) == ("scaled with mode=grad: the scaled kind (my_kinds.kind.ScaledKind) makes its own "
                                 "forwards, and hookrun runs no backward for it (its class has no check_mode that takes "
                                 "mode=grad); drop mode or set mode=eval")
    assert not built and not (tmp_path / "g.h5").exists()

    class TakesGrad(ScaledKind):
        @classmethod
        def check_mode(cls, cfg):  # (the kind's own word on the mode: it reads the forward alone)
            pass

    _PLUGINS.pop("scaled")  # (the page's, registered by imports: above; the fixture drops this one)
    register_plugin(KindPlugin("scaled", block=Block, run=TakesGrad))
    done = {**cfg, "scaled": {"factor": 2.0}, "hooks": None, "imports": []}
    with h5py.File(hookrun.run(done, model=model, dataset=x).path) as f:
        with torch.no_grad():
            np.testing.assert_allclose(f["captures/scaled/__model__/sum"][:], (model(x).sum(1) * 2.0).numpy(), rtol=1e-6)


def counted(built):
    built.append(1)
    return torch.nn.Linear(4, 3)


def test_two_packages_of_imports_whose_kinds_share_a_name_are_one_line_naming_both(tmp_path, monkeypatch):
    """(it said '(registered before)', naming neither the module nor the first package; the reference: the two
    packages written here, each the page's example under its own name)"""
    import hookrun
    from hookrun.config.schema import _PLUGINS

    (tmp_path / "site").mkdir()
    for pkg in ("kinds_one", "kinds_two"):
        docs_package(tmp_path / pkg)
        (tmp_path / pkg / "my_kinds").rename(tmp_path / "site" / pkg)
        for file in ("__init__.py", "kind.py"):
            path = tmp_path / "site" / pkg / file
            path.write_text(path.read_text().replace("my_kinds", pkg))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    try:
        with pytest.raises(ConfigError) as caught:
            hookrun.run({"imports": ["kinds_one", "kinds_two"], "scaled": {"factor": 2.0}, "device": "cpu",
                         "output": {"path": str(tmp_path / "t.h5")}}, model=torch.nn.Linear(4, 3), dataset=torch.randn(4, 4))
        assert str(caught.value) == ("imports: kinds_two.KIND: register_plugin('scaled'): a kind of that name is there "
                                     "already (kinds_one.KIND, named in imports: before it); give it another name")
        assert not (tmp_path / "t.h5").exists()
    finally:
        _PLUGINS.pop("scaled", None)
