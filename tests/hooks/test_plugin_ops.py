"""Ops that kind plugins declare (KindPlugin.ops): the op registry asks the plugin registry for a name
it does not know. The probe kind's probe_steer / probe_ablate are listed and offered for a misspelt
name without importing any kind folder, and naming one imports the probe folder alone.

References: a fresh interpreter's sys.modules (what got imported), the probe folder's __init__.py
(the factory it declares), and a plain dict for the registry's own rules."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT

from hookrun.errors import NotFoundError, Registry

CODE = """
import sys
from hookrun.config.schema import plugin_names
from hookrun.errors import ConfigError
from hookrun.hooks.ops import OPS, build_op

def kinds():
    return sorted(m for m in sys.modules if m.startswith('hookrun.runner.kinds.') and m.count('.') == 3
                  and m.rsplit('.', 1)[1] in plugin_names())

print('NAMES', 'probe_steer' in OPS.names(), 'probe_ablate' in OPS.names(), 'probe_steer' in OPS)
try:
    build_op('probe_stear', {}, 'hooks.z.actions.0')
except ConfigError as exc:
    print('ERROR', exc)
print('BEFORE', kinds())
steer = OPS.get('probe_steer')
print('AFTER', kinds(), steer.__module__, steer.__name__)
"""


def test_probe_ops_are_found_by_name_and_import_only_the_probe_folder():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert out["NAMES"] == "True True True", proc.stdout
    assert out["ERROR"].startswith("hooks.z.actions.0.op: unknown op 'probe_stear'; did you mean: probe_steer"), out
    assert "\n" not in out["ERROR"] and "probe_ablate" in out["ERROR"].split("known ops:")[1], out
    assert out["BEFORE"] == "[]", out  # listing and a misspelt name import no kind folder
    declared = (ROOT / "hookrun/runner/kinds/probe/__init__.py").read_text()
    module, _, name = declared.split('"probe_steer": "', 1)[1].split('"', 1)[0].partition(":")
    assert out["AFTER"] == f"['hookrun.runner.kinds.probe'] {module} {name}", out


def test_a_registry_asks_its_finder_only_for_names_it_does_not_know():
    elsewhere = {"far": "found", "twice": "from the plugin"}
    asked = []

    def find(name: str) -> str | None:
        asked.append(name)
        return elsewhere.get(name)

    reg: Registry[str] = Registry("thing", find=find, found_names=lambda: list(elsewhere))
    reg.register("twice")("built in")
    assert reg.get("twice") == "built in" and asked == []  # a registered name wins, the finder is not asked
    assert reg.get("far") == "found" and asked == ["far"]
    assert reg.names() == sorted({"twice", *elsewhere}) and "far" in reg and "near" not in reg
    with pytest.raises(NotFoundError, match=r"^unknown thing 'fra'; did you mean: far\? known things: far, twice"):
        reg.get("fra")
