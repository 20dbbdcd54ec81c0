"""The main job's route, measured: the hookrun files whose code runs for
`python -m hookrun experiment=resnet_layer1`, from the command to the file (module bodies included),
counted by a profiler over the run (tests/helpers/route_tracer.py), not listed by hand; and what
`import hookrun` leaves unloaded (no kind folder, no report, no drawing action).

    python -m pytest tests/cli/test_route.py -q -s      # prints the route (docs/architecture.md lists it)
"""

from __future__ import annotations

import os
import subprocess
import sys

import h5py
import pytest
from conftest import HELPERS, ROOT

ROUTE_BOUND = 30  # the files the main job runs today, and issue 46's bar (at most 30)
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.mark.slow
def test_main_job_route(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(HELPERS / "route_tracer.py"), "hookrun", "experiment=resnet_layer1",
                           "data.limit=1", "progress=false", f"hydra.run.dir={out}"],
                          capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with h5py.File(out / "captures.h5", "r") as f:  # the route is the real run's: the file is written
        assert f["captures/blocks/layer1.0/output"].shape == (16, 64, 56, 56)
    files = [line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("ROUTE-FILE ")]
    count = [int(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("ROUTE ")]
    assert count == [len(files)] and "hookrun/__main__.py" in files and "hookrun/store/writer.py" in files, proc.stdout
    print(f"\nthe main job's route: {len(files)} files\n" + "\n".join(files))
    assert not [f for f in files if f.startswith(("hookrun/analysis/report/", "hookrun/runner/kinds/patching/",
                                                  "hookrun/runner/kinds/evaluate/"))], files
    assert len(files) <= ROUTE_BOUND, "\n".join(files)
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert f"ran: **{ROUTE_BOUND}**" in doc  # the page's count is the test's bound (lower both together)


def test_import_hookrun_loads_no_kind_report_or_drawing_action():
    code = ("import sys, hookrun; hookrun.__version__\n"
            "print('\\n'.join(m.__file__ for m in list(sys.modules.values()) if getattr(m, '__file__', None)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    root = str(ROOT / "hookrun") + os.sep
    loaded = [os.path.relpath(p, ROOT).replace(os.sep, "/") for p in proc.stdout.splitlines() if p.startswith(root)]
    assert "hookrun/__init__.py" in loaded, loaded
    kinds = [p for p in loaded if p.startswith("hookrun/runner/kinds/") and p.count("/") > 3]  # a kind's folder
    unwanted = kinds + [p for p in loaded if p.startswith("hookrun/analysis/report/")
                        or p in ("hookrun/hooks/actions/lens.py", "hookrun/hooks/actions/top_examples.py")]
    assert not unwanted, unwanted


def test_cli_and_the_reports_face_name_no_kind_or_drawing_action_and_only_the_scheme_registry_asks_for_a_url():
    """Issue 46's done-when, as its greps: the commands reach every kind through the plugin registry
    and the readers, so no kind's or drawing action's name is written in cli/ or in the report's
    package face; and "is it a URL" is asked by the scheme registry (store/paths.py, output/) alone."""
    import re

    from hookrun.config.schema import plugin_names

    names = [*plugin_names(), "logit_lens", "lens", "top_examples", "grad_cam", "gradcam", "latents", "edges"]
    assert {"attribution", "evaluate", "patching", "probe", "sae", "similarity"} <= set(names)
    word = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b", re.IGNORECASE)
    files = [*sorted((ROOT / "hookrun/cli").glob("*.py")), ROOT / "hookrun/analysis/report/__init__.py"]
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in files
             for n, line in enumerate(p.read_text().splitlines(), 1) if word.search(line)]
    assert not found, "\n".join(found)
    url = re.compile(r"is_url|startswith\(\s*[\"']s3://|[\"']://[\"'] in |re\.match\(.*://")
    asked = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "hookrun").rglob("*.py")) if url.search(p.read_text())]
    assert all(p.startswith(("hookrun/output/", "hookrun/store/paths.py")) for p in asked), asked


def test_the_face_still_binds_its_names():
    import hookrun
    from hookrun import (
        Action,
        capture,
        modules,
        open_run,
        open_sweep,
        patch_grid,
        register_action,
        run,
    )
    from hookrun.notebook.lister import list_modules
    from hookrun.runner import run as run_function

    assert hookrun.run is run is run_function and modules is list_modules and callable(capture)
    assert callable(open_run) and callable(open_sweep) and callable(patch_grid) and callable(register_action)
    assert isinstance(Action, type) and hookrun.attribute.__name__ == "attribute"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        hookrun.nope  # noqa: B018
