"""The names a user's kind cannot take (hookrun/config/kind_names.py): Hydra's own keys (`hydra`,
`defaults`, `_self_`), the config groups of conf/ (`experiment`, ...), and hookrun's own kinds that are
modules, not folders (`record`, `grad`, `generate`). A package declaring `hydra` or `defaults` broke
every run on the machine ("hydra.mode: the config has no key" / a ValueError); one declaring `record`
ran and wrote files claiming to be hookrun's record kind.

References: the folders of conf/ and Hydra's reserved keys listed here by hand; a raw PyTorch forward of
the package's model (the rows of a run that goes on beside the refused entry points); h5py (the file)."""

from __future__ import annotations

import re
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import ROOT
from test_kind_plugins import cli, make_package, user_models

from hookrun.errors import ConfigError

REFUSED = {  # name -> why, as --help says it
    "hydra": "'hydra' is a key Hydra keeps for itself (hydra, defaults, _self_); give the kind another name",
    "defaults": "'defaults' is a key Hydra keeps for itself (hydra, defaults, _self_); give the kind another name",
    "experiment": "'experiment' is a config group (experiment=NAME picks conf/experiment/NAME.yaml); give the kind "
                  "another name",
    "record": "'record' is one of hookrun's own kinds; give the kind another name",
    "grad": "'grad' is one of hookrun's own kinds; give the kind another name",
}


def test_hydras_keys_the_config_groups_and_the_modes_kinds_are_refused_in_python():
    from hookrun.config.kind_names import refused_name
    from hookrun.config.plugins import KindPlugin, register_plugin

    groups = sorted(p.name for p in Path(ROOT, "conf").iterdir() if p.is_dir() and any(p.glob("*.yaml")))
    assert "experiment" in groups
    for name in ("hydra", "defaults", "_self_", *groups, "record", "grad", "generate"):
        assert refused_name(name), name
        with pytest.raises(ConfigError, match=rf"^register_plugin\({name!r}\): '{name}' is "):
            register_plugin(KindPlugin(name, block="a.b:C", run="a.b:D"))
    assert refused_name("scaled") is None and refused_name("records") is None


@pytest.mark.parametrize("name, why", [
    ("probe", "'probe' is one of hookrun's own kinds; give the kind another name"),
    ("class", "a kind's name is its config block's key, a Python identifier (e.g. 'class_kind')"),
    ("3d", "a kind's name is its config block's key, a Python identifier (e.g. 'kind_3d')"),
    ("my-kind", "a kind's name is its config block's key, a Python identifier (e.g. 'my_kind')"),
])
def test_a_shipped_folder_kinds_name_and_a_keyword_are_refused_saying_why(name, why):
    """register_plugin('probe') said 'a kind of that name is there already (registered before)' (the check's
    `and ... or ...` let that override the reason); 'class' was told to take 'class', '3d' to take '3d'; and
    a user's kind named 'name' was refused as one of hookrun's own (a docstring's `@register_kind("name")`).
    Reference: str.isidentifier and keyword.iskeyword on the name offered."""
    import keyword

    from hookrun.config.kind_names import refused_name
    from hookrun.config.plugins import KindPlugin, register_plugin

    with pytest.raises(ConfigError) as caught:
        register_plugin(KindPlugin(name, block="a.b:C", run="a.b:D"))
    assert str(caught.value) == f"register_plugin({name!r}): {why}"
    offered = re.findall(r"e\.g\. '(\w+)'", why)
    assert all(o.isidentifier() and not keyword.iskeyword(o) for o in offered)
    assert refused_name("name") is None


@pytest.mark.slow
def test_entry_points_named_as_hydras_keys_a_group_or_a_mode_kind_are_listed_and_runs_go_on(tmp_path):
    pkg_root = tmp_path / "site"
    for name in REFUSED:  # each a working kind plugin of its own package, declared as an entry point
        make_package(pkg_root, f"userkind_{name}", name, entry_point=True)
    base = ["model=custom", "model._target_=userkind_record.models.tiny", "data=custom",
            "data.dataset._target_=userkind_record.models.data", "data.batch_size=4", "device=cpu", "progress=false"]
    helped = cli("--help", cwd=tmp_path, pythonpath=pkg_root)
    assert helped.returncode == 0, helped.stderr
    kinds = " ".join(helped.stdout.split("Kinds of run:")[1].split("A block the config has")[0].split())
    for name, why in REFUSED.items():
        assert f"{name} (entry point '{name}' of hookrun.kinds (userkind_{name}:KIND) is not used: {why})" in kinds, kinds
    assert not re.search(r"\bhydra\b[^(]*\(experiment=", kinds), kinds  # (its experiments were those with a hydra: key)
    # an ordinary run beside them: it ran into "hydra.mode: the config has no key 'hydra.mode'" (exit 2)
    hooks = "hooks={out: {at: '2', type: forward, actions: [record]}}"
    done = cli(*base, hooks, "hydra.run.dir=plain", cwd=tmp_path, pythonpath=pkg_root)
    assert done.returncode == 0, done.stderr
    models = user_models(pkg_root, "userkind_record")
    with torch.no_grad():
        expected = models.tiny().eval()(models.data().tensors[0]).numpy()
    with h5py.File(tmp_path / "plain/captures.h5") as f:
        assert f.attrs["kind"] == "record"
        np.testing.assert_allclose(f["captures/out/2/output"][:], expected, rtol=1e-6, atol=1e-7)
    # the refused kind's block is no block: one line, nothing written (it ran and wrote kind=record)
    added = cli(*base, "+record={factor: 2}", "hydra.run.dir=rec", cwd=tmp_path, pythonpath=pkg_root)
    assert added.returncode == 2 and added.stderr.count("\n") == 1 and "Traceback" not in added.stderr, added.stderr
    assert "record: one of hookrun's own run kinds, chosen by mode= (eval, grad, generate" in added.stderr  # (not
    assert not (tmp_path / "rec/captures.h5").exists()  # Hydra's "Key 'record' not in 'HookrunConfig'")


@pytest.mark.slow
def test_a_block_named_as_a_refused_entry_point_says_it_is_hookruns_own_kind(tmp_path):
    """A user's package declaring its own `probe` (refused: hookrun's own kind's name) and a config giving
    `+probe={...}`: hookrun's probe ran (or refused the package's keys) and nothing but --help said the
    package's kind was not used. Now a warning names the entry point (the reference: the entry point written
    here), and the block of `record` says it beside the refusal."""
    pkg_root = tmp_path / "site"
    make_package(pkg_root, "userkind_shadow", "probe", entry_point=True)
    with open(pkg_root / "userkind_shadow-0.1.dist-info/entry_points.txt", "a") as f:
        f.write("record = userkind_shadow:KIND\n")
    base = ["model=custom", "model._target_=userkind_shadow.models.tiny", "data=custom",
            "data.dataset._target_=userkind_shadow.models.data", "data.batch_size=4", "device=cpu", "progress=false"]
    why = "'{0}' is one of hookrun's own kinds; give the kind another name"
    probe = cli(*base, "+probe={factor: 2}", "hydra.run.dir=p", cwd=tmp_path, pythonpath=pkg_root)
    assert probe.returncode == 2 and "Traceback" not in probe.stderr, probe.stderr
    assert ("probe: this block runs hookrun's own probe kind, not the package's: the entry point 'probe' of "
            f"hookrun.kinds (userkind_shadow:KIND) is not used: {why.format('probe')}") in probe.stdout + probe.stderr
    assert "hookrun: error: probe.factor: not a key of the probe block" in probe.stderr
    record = cli(*base, "+record={factor: 2}", "hydra.run.dir=r", cwd=tmp_path, pythonpath=pkg_root)
    assert record.returncode == 2 and record.stderr.count("\n") == 1, record.stderr
    assert record.stderr.endswith("set mode, and its settings as top-level keys (the entry point 'record' of "
                                  f"hookrun.kinds (userkind_shadow:KIND) is not used: {why.format('record')})\n")
    assert not (tmp_path / "p/captures.h5").exists() and not (tmp_path / "r/captures.h5").exists()
