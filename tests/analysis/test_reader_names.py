"""A user's kind whose reader names a method or property like an attribute of open_run's Run
(`methods={"config": ...}`): Python found Run's own first, so `run.config` gave the run's config and
the reader's function was never called, without a word. Now loading that reader (inspect, plot, report,
any of its kind's methods or properties) is one line naming the name (inspect: the reader's failure line, exit 1, the run's other parts shown), and a reader whose names
are free still reads. Reference: the package's model called directly, times the factor (h5py's rows)."""

from __future__ import annotations

import pytest
import torch
from site_package import imported, install, scaled_kind, site_env
from warm_python import python as warm

KIND = scaled_kind("NAME", rest="""from hookrun.analysis.kind_readers import KindReader, Table

    def sums(f):
        return [float(v) for v in f["captures/NAME/__model__/sum"][:]]

    READER = KindReader("NAME", present=lambda f: "captures/NAME" in f, methods={"METHOD": sums, "NAME_total": lambda f: sum(sums(f))})
    KIND = KindPlugin("NAME", block=Block, run=Scaled, reader="NAME:READER")""")


def make(tmp_path, name: str, method: str):
    site = install(tmp_path / name, name, KIND.replace("NAME", name).replace("METHOD", method),
                   f"[hookrun.kinds]\n{name} = {name}:KIND\n")
    done = warm(["-m", "hookrun", "model=custom", f"model._target_={name}.tiny", "data=custom",
                 f"data.dataset._target_={name}.data", "data.batch_size=4", "device=cpu", "progress=false",
                 f"+{name}={{factor: 2.5}}", f"hydra.run.dir={name}_run"], cwd=tmp_path, timeout=300, env=site_env(site))
    assert done.returncode == 0, done.stderr
    return site, tmp_path / f"{name}_run" / "captures.h5"


def ask(site, path, code: str):
    return warm(["-c", f"import hookrun\nrun = hookrun.open_run({str(path)!r})\n{code}"], timeout=300, env=site_env(site))


@pytest.mark.slow
def test_a_reader_method_named_like_runs_own_is_one_line(tmp_path):
    site, path = make(tmp_path, "cfgkind", "config")
    got = ask(site, path, "print(run.cfgkind_total())")  # (the reader is loaded where the run's kind is asked)
    assert got.returncode == 1 and "Traceback" in got.stderr  # (a notebook's exception)
    assert ("ConfigError: the cfgkind kind's reader: its method 'config' (run.config is open_run's own), so run.NAME "
            "would never reach the reader's; name it otherwise in the KindReader's methods= / properties=") in got.stderr
    shown = warm(["-m", "hookrun.inspect", str(path)],
                 timeout=300, env=site_env(site))
    assert shown.returncode == 1 and "its method 'config' (run.config is open_run's own)" in shown.stderr, shown.stderr
    assert "status    complete" in shown.stdout  # (the run's other parts are shown)

    site, path = make(tmp_path, "freekind", "freekind_sums")
    got = ask(site, path, "print(run.freekind_sums())")
    assert got.returncode == 0, got.stderr
    with imported(site, "freekind") as pkg, torch.no_grad():
        want = (pkg.tiny().eval()(pkg.data().tensors[0]).sum(1) * 2.5).tolist()
    assert [round(v, 4) for v in eval(got.stdout)] == [round(v, 4) for v in want]
