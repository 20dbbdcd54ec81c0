"""`import hookrun` loads no kind folder, and `hookrun.<notebook function>` imports only the kind that
owns it (found by the public name its KindPlugin gives as a string), in a fresh interpreter.

Reference: the interpreter's own sys.modules; the function found is the module attribute itself."""

from __future__ import annotations

import json
import os

import pytest
import warm_python
from conftest import ROOT

CODE = """
import json, sys, hookrun
def kinds():
    return sorted({m.split('.')[3] for m in sys.modules if m.startswith('hookrun.runner.kinds.') and m.count('.') >= 3
                   and m.split('.')[3] not in ('grad_kind', 'generate_kind')})
out = {"import": kinds()}
for name in NAMES:
    try:
        fn = getattr(hookrun, name)
        out[name] = [fn.__module__, fn.__name__, kinds()]
    except AttributeError as exc:
        out[name] = ["AttributeError", str(exc), kinds()]
print(json.dumps(out))
"""


def lookup(*names: str) -> dict:
    # (a warm_python child: hookrun is imported fresh in it, so its sys.modules says what hookrun imported)
    proc = warm_python.run_code(f"NAMES = {list(names)!r}\n" + CODE, [], cwd=ROOT, env=dict(os.environ), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("name", "kind", "module"), [
    ("attribute", "attribution", "hookrun.runner.kinds.attribution.notebook"),
    ("patch_grid", "patching", "hookrun.runner.kinds.patching.notebook"),
])
def test_a_notebook_function_imports_its_kind_alone(name, kind, module):
    out = lookup(name)
    assert out["import"] == []  # import hookrun: no kind folder
    got_module, got_name, loaded = out[name]
    assert (got_module, got_name) == (module, name)
    assert loaded == [kind], loaded  # no other kind's folder (evaluate, probe, sae, similarity, ...)


def test_a_name_no_kind_gives_is_an_attribute_error_that_imports_no_kind():
    out = lookup("attributes")
    assert out["attributes"][0] == "AttributeError" and "'attributes'" in out["attributes"][1]
    assert out["attributes"][2] == []
