"""A second SIGINT while the writer drains, and Ctrl-C or SIGTERM while the model is built: counts and
rows stay equal, and the line says what was written. Reference: plain h5py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import h5py
import pytest
from conftest import ROOT
from toy_runs import RECORD_BODY, toy_cfg

import hookrun
from hookrun.output.process import Interrupted
from hookrun.store.h5store import H5Store


def test_a_second_sigint_while_the_writer_drains_keeps_counts_and_rows_equal(tmp_path, monkeypatch):
    original = H5Store.write

    def slow(self, rec):
        import time

        time.sleep(0.25)
        return original(self, rec)

    monkeypatch.setattr(H5Store, "write", slow)
    hooks = {**RECORD_BODY, "stop": {"at": "body", "type": "forward",
                                     "actions": [{"_target_": "toy_models.interrupt_twice", "_partial_": True, "step": 2, "after": 0.1}]}}
    cfg = toy_cfg(tmp_path, hooks=hooks, **{"data.batch_size": 1})
    with pytest.raises(Interrupted, match="interrupted by SIGINT after") as info:
        hookrun.run(cfg)
    assert info.value.exit_code == 130
    with h5py.File(tmp_path / "captures.h5") as f:
        n = f["samples/index"].shape[0]
        assert f.attrs["status"] == "interrupted"
        assert f.attrs["samples_complete"] == f.attrs["steps_complete"] == n == f["captures/b/body/output"].shape[0]
        assert 1 <= n <= 3


def test_ctrl_c_while_the_model_is_built_says_nothing_was_written(tmp_path, sigint_default):
    with pytest.raises(Interrupted, match="before the output file was created; nothing was written") as info:
        hookrun.run(toy_cfg(tmp_path, "toy_models.InterruptedWhileBuilt"))
    assert info.value.exit_code == 130
    assert list(tmp_path.iterdir()) == []


def test_sigterm_while_the_model_is_built_says_so_and_leaves_no_lock(tmp_path):
    """Python's default SIGTERM ends the process at once: no word, exit -15, the lock left behind."""
    import os
    import subprocess
    import sys

    from conftest import HELPERS, ROOT

    script = ("import sys, pathlib, hookrun\nfrom toy_runs import toy_cfg\nfrom hookrun.output.process import Interrupted\n"
              "try:\n    hookrun.run(toy_cfg(pathlib.Path(sys.argv[1]), 'toy_models.TerminatedWhileBuilt'))\n"
              "except Interrupted as e:\n    print(e, file=sys.stderr)\n    sys.exit(e.exit_code)\n")
    out = tmp_path / "run"
    out.mkdir()
    done = subprocess.run([sys.executable, "-c", script, str(out)], env={"PYTHONPATH": os.pathsep.join(map(str, (ROOT, ROOT / "tests", HELPERS))), "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 143, done.stderr[-2000:]
    assert "interrupted by SIGTERM before the output file was created; nothing was written" in done.stderr
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("status", ["complete", "interrupted"])
def test_a_signal_after_the_file_is_closed_names_the_file_as_it_is(tmp_path, monkeypatch, status):
    """Ctrl-C in the clean-up after the file was closed (the kind's and the actions' close): the file
    stays as it was closed, and the run says so, never "nothing was written". Reference: plain h5py."""
    from hookrun.hooks.actions import ActionEnv

    def ctrl_c(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(ActionEnv, "close", ctrl_c)
    hooks = RECORD_BODY
    if status == "interrupted":  # a first SIGINT at step 1 stops the run; the second comes in the clean-up
        hooks = {**RECORD_BODY, "stop": {"at": "body", "type": "forward",
                                         "actions": [{"_target_": "toy_models.signal_at", "_partial_": True, "step": 1}]}}
    cfg = toy_cfg(tmp_path, hooks=hooks, **{"data.batch_size": 1})
    if status == "complete":
        result = hookrun.run(cfg)
        assert (result.status, result.signum) == ("complete", 2)
    else:
        with pytest.raises(Interrupted) as info:
            hookrun.run(cfg)
        assert "is marked 'interrupted'" in str(info.value) and "nothing was written" not in str(info.value)
    with h5py.File(tmp_path / "captures.h5") as f:
        assert f.attrs["status"] == status
        n = f["samples/index"].shape[0]
        assert f.attrs["steps_complete"] == n == f["captures/b/body/output"].shape[0]
        if status == "complete":
            assert n == result.samples


def ctrl_c_reaches() -> None:
    """In the child: SIGINT as a terminal delivers it. A shell's background job (`cmd &` without job
    control, as a CI script may start pytest) inherits SIGINT ignored, and Python then never raises
    KeyboardInterrupt: these tests would see a Ctrl-C that no user's terminal sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.skipif(os.name != "posix", reason="SIGINT from outside")
@pytest.mark.parametrize("module", ["hydra", "torch.nn"])
def test_ctrl_c_while_python_imports_the_app_is_one_line_and_exit_130(tmp_path, module):
    """Ctrl-C in the first second or two, while Python imports hookrun, Hydra and torch, printed an
    import's KeyboardInterrupt traceback (exit 130 by accident). Sent once `-X importtime` shows
    `module` being imported: one line, no traceback, exit 130, no output folder."""
    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "hookrun", "experiment=resnet_layer1",
                             f"hydra.run.dir={tmp_path / 'run'}"], stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            preexec_fn=ctrl_c_reaches)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.split("|")[-1].strip() == module:
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stderr.read()
    assert proc.wait(60) == 130, "".join(lines[-5:]) + rest[-2000:]
    said = [x for x in rest.splitlines() if not x.startswith("import time:")]
    assert said == ["hookrun: interrupted by SIGINT while starting; nothing was written"], rest[-2000:]
    assert not (tmp_path / "run").exists()


LATE_SIGNAL = """
import gc, os, signal
from hookrun.cli import exit_process

gc.freeze = lambda: os.kill(os.getpid(), signal.{sig})  # after main returned: the run's file is closed
exit_process(lambda: 0)
"""


@pytest.mark.skipif(os.name != "posix", reason="signals")
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_after_main_returned_keeps_its_exit_code(tmp_path, sig):
    """A Ctrl-C or SIGTERM in the ~0.2 s after the run returned (its file complete) made the process
    exit 130 ('interrupted by SIGINT') or 143 (no word): a complete run looked interrupted to Slurm.
    Reference: the exit code main returned, 0, and one line naming the signal."""
    proc = subprocess.run([sys.executable, "-c", LATE_SIGNAL.format(sig=sig)], capture_output=True, preexec_fn=ctrl_c_reaches,
                          text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [f"hookrun: {sig} after the run ended; its exit code 0 is kept"]


@pytest.mark.skipif(os.name != "posix", reason="signals")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_once_the_run_logged_its_file_keeps_exit_0(tmp_path, sig):
    """`python -m hookrun`, signalled once it logged `file: ...` (the run returned, Hydra tearing down):
    exit 143 with no word, or 130 'interrupted by SIGINT', for a file plain h5py reads as complete."""
    proc = subprocess.Popen([sys.executable, "-m", "hookrun", "experiment=probe_shapes", "data.limit=2",
                             "progress=false", f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, text=True, preexec_fn=ctrl_c_reaches,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "] - file: " in line:
            proc.send_signal(sig)
    assert proc.wait(120) == 0, "".join(lines[-5:])
    assert lines[-1].strip() == f"hookrun: {sig.name} after the run ended; its exit code 0 is kept"
    with h5py.File(tmp_path / "run" / "captures.h5", "r") as f:
        assert f.attrs["status"] == "complete"


TWO_LATE = """
import gc, os, signal, time
from hookrun.cli import exit_process

def freeze():  # after main returned: a clean-up that hangs, stopped by a second signal
    os.kill(os.getpid(), signal.{sig})
    os.kill(os.getpid(), signal.{sig})
    time.sleep(60)
    print("not stopped", flush=True)

gc.freeze = freeze
exit_process(lambda: 0)
"""


@pytest.mark.skipif(os.name != "posix", reason="signals")
@pytest.mark.parametrize(("sig", "code", "said"), [("SIGINT", 130, ["hookrun: interrupted by SIGINT"]), ("SIGTERM", -15, [])])
def test_a_second_late_signal_still_stops_the_process(tmp_path, sig, code, said):
    """The first late signal is noted; a second is acted on as before (Ctrl-C: 130 and its line; SIGTERM: the
    default action), so a clean-up that hangs after the run is never left unstoppable."""
    proc = subprocess.run([sys.executable, "-c", TWO_LATE.format(sig=sig)], capture_output=True, preexec_fn=ctrl_c_reaches,
                          text=True, cwd=tmp_path, timeout=50)
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "not stopped" not in proc.stdout and proc.stderr.strip().splitlines() == said, proc.stderr[-2000:]
