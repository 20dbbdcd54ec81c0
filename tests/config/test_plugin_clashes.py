"""An op name or a notebook function's name declared by two kinds (two users' kinds, or a user's
kind and a shipped one) is one line naming both, whichever was loaded first, before any batch; a
block whose check() raises a plain ValueError or assert is one line too (the reference: the kinds'
own declarations and check() written here)."""

from __future__ import annotations

import textwrap

import pytest
from test_kind_plugins import make_package

import hookrun
from hookrun.config.schema import _PLUGINS
from hookrun.errors import ConfigError

EXTRA = '''
from dataclasses import dataclass

@dataclass
class Picky:
    need: float = 1.0

    def check(self):
        assert self.need != 5, "need must not be 5"
        if self.need > 10:
            raise ValueError("need too large")
        if self.need < 0:
            raise ValueError("need is negative;\\n  give 0 or more")

def probe(*args, **kwargs):
    return "the user's probe"
'''

REGISTER = '''
from hookrun.config.plugins import KindPlugin, register_plugin
for name, ops in (("twin_a", {"twin_shift": "userkind_twin.ops:shift"}),
                  ("twin_b", {"twin_shift": "userkind_twin.ops:shift", "probe_steer": "userkind_twin.ops:shift"})):
    register_plugin(KindPlugin(name, block="userkind_twin.block:Block", run="userkind_twin.kind:ScaledKind", ops=ops))
register_plugin(KindPlugin("twin_c", block="userkind_twin.extra:Picky", run="userkind_twin.kind:ScaledKind",
                           notebook="userkind_twin.extra:probe"))
'''


def test_an_op_or_notebook_name_two_kinds_declare_and_a_plain_check_error_are_one_line(tmp_path, monkeypatch):
    pkg_root = tmp_path / "site"
    make_package(pkg_root, "userkind_twin", "twin", entry_point=False)
    (pkg_root / "userkind_twin/register.py").write_text(textwrap.dedent(REGISTER))
    (pkg_root / "userkind_twin/extra.py").write_text(EXTRA)
    monkeypatch.syspath_prepend(str(pkg_root))
    from userkind_twin import models

    def refused(op: str | None = None, **block) -> str:
        hooks = {"s": {"at": "0", "type": "forward", "actions": [{"name": "modify_output", "op": op, "amount": 0.5}]}}
        cfg = {"imports": ["userkind_twin.register"], **({"hooks": hooks} if op else block), "device": "cpu", "progress": False,
               "data": {"batch_size": 4}, "output": {"path": str(tmp_path / "never.h5")}}
        with pytest.raises(ConfigError) as caught:
            hookrun.run(cfg, model=models.tiny(), dataset=models.data())
        assert not (tmp_path / "never.h5").exists()
        return str(caught.value)

    try:
        assert refused("twin_shift") == (
            "hooks.s.actions.0.op: op 'twin_shift' is declared by two kinds, the kind 'twin_a' (register_plugin) and "
            "the kind 'twin_b' (register_plugin); which one is meant cannot be told: rename one of them in its kind's "
            "`ops` (or uninstall one package)")
        assert refused("probe_steer") == (
            "hooks.s.actions.0.op: op 'probe_steer' is declared by two kinds, hookrun's own kind 'probe' and the kind "
            "'twin_b' (register_plugin); which one is meant cannot be told: rename one of them in its kind's `ops` "
            "(or uninstall one package)")
        assert refused(twin_c={"need": 20}) == ("twin_c: the kind plugin's check() refused the block: ValueError: need "
                                                "too large")
        assert refused(twin_c={"need": 5}) == ("twin_c: the kind plugin's check() refused the block: AssertionError: "
                                               "need must not be 5")
        assert refused(twin_c={"need": -1}) == ("twin_c: the kind plugin's check() refused the block: ValueError: "
                                                "need is negative; give 0 or more")  # (its lines joined: one line, all of it)
        with pytest.raises(ConfigError) as caught:
            _ = hookrun.probe
        assert str(caught.value) == (
            "the notebook function hookrun.probe is declared by two kinds, hookrun's own kind 'probe' and the kind "
            "'twin_c' (register_plugin); which one is meant cannot be told: rename one of them in its kind's "
            "`notebook` (or uninstall one package)")
    finally:
        for name in ("twin_a", "twin_b", "twin_c"):
            _PLUGINS.pop(name, None)
