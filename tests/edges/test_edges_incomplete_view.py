"""An edges run on two processes whose rank 1 failed: rank 0 writes its cells and a view marked incomplete
(captures.rank-00001.h5 missing), which holds half the [writer, reader] grid. Reading its edges, exporting them
or ranking a circuit by them is refused in one line that says how many cells the file holds; before, the edges
read back as NaN where rank 1's cells were, and `circuits export` wrote an EAP-IG JSON with only rank 0's edges
(about half), which EAP-IG's Graph.from_json and MIB's evaluation take with a score of 0 for each missing
edge. The tasks are started by hand with submitit's variables, as tests/store/test_ranks.py does (no launcher
stops rank 0 when rank 1 fails)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import HELPERS, ROOT
from warm_python import python as warm

import hookrun
from hookrun.errors import HookrunError

pytestmark = pytest.mark.slow
ENV = {"PYTHONPATH": f"{ROOT}{os.pathsep}{HELPERS}", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
       "HOOKRUN_RANK_TIMEOUT": "5"}
ARGS = ["experiment=edges", "hydra.run.dir=run", "model._target_=toy_lm.tiny_gpt2_failing_on_rank", "+model.vocab_size=256",
        "patching.method=eap", "patching.ig_steps=1", "device=cpu", "progress=false", "data.dataset.n=2",
        "data.dataset.length=8"]


def test_an_incomplete_views_edges_are_refused_not_read_as_a_smaller_grid(tmp_path):
    procs = []
    for rank in range(2):
        env = {**os.environ, **ENV, "SUBMITIT_LOCAL_JOB_ID": f"e{os.getpid()}", "SUBMITIT_LOCAL_NTASKS": "2",
               "SUBMITIT_LOCAL_GLOBALID": str(rank), "SUBMITIT_LOCAL_LOCALID": str(rank)}
        procs.append(subprocess.Popen([sys.executable, "-m", "hookrun", *ARGS], cwd=tmp_path, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [1, 1], outs[0][1][-2000:] + outs[1][1][-2000:]
    view = tmp_path / "run" / "captures.h5"
    assert "captures.rank-00001.h5 (missing)" in outs[0][1]
    with hookrun.open_run(view) as run:
        assert run.status == "incomplete"
        with pytest.raises(HookrunError, match=r"holds 53 of 105 cells of its edge grid .*captures.rank-00001.h5 "
                                               r"\(missing\).*resume=true") as caught:
            run.edges()
        assert "\n" not in str(caught.value)
    out = tmp_path / "g.json"
    proc = warm(["-m", "hookrun.circuits", "export", str(view), "--format", "eap-ig", str(out)], env={**os.environ, **ENV}, cwd=tmp_path, timeout=120)
    assert proc.returncode != 0 and not out.exists(), proc.stdout + proc.stderr
    assert "holds 53 of 105 cells" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
