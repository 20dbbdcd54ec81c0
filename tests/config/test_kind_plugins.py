"""A kind of run added from outside hookrun/: a user's package with its own block, run, file table,
inspect lines, plot picture, report section, notebook function and named op (`ops`: `op: NAME` of
a modify action on an ordinary record run), found through the entry-point group `hookrun.kinds` (a
dist-info folder on sys.path, as pip leaves it) or through `imports:`.

References: the model's own forward (the rows the kind writes), a raw PyTorch forward hook applying
the op's function by hand (the modified run's captures), the block's own keys (the errors), h5py
(the file); no file of hookrun/ is edited."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import warm_python
from conftest import ROOT

from hookrun.errors import ConfigError

PACKAGE = {
    "__init__.py": '''
        from hookrun.config.plugins import KindPlugin
        KIND = KindPlugin("{name}", block="{pkg}.block:Block", run="{pkg}.kind:ScaledKind",
                          reader="{pkg}.reader:READER", notebook="{pkg}.notebook:{name}_sums",
                          ops={{"{name}_shift": "{pkg}.ops:shift"}}, summary="the outputs summed, times a factor")
        ''',
    "block.py": '''
        from dataclasses import dataclass
        from hookrun.errors import ConfigError

        @dataclass
        class Block:
            factor: float = 1.0
            label: str = "sum"

            def check(self):
                COUNT.append(1)
                if self.factor <= 0:
                    raise ConfigError(f"{name}.factor={{self.factor}}: must be above 0 (e.g. 2.0)")

        COUNT = []  # how often a block was checked (the test counts it)
        ''',
    "models.py": '''
        import torch
        from torch import nn

        def tiny():
            torch.manual_seed(0)
            return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))

        def data():
            g = torch.Generator().manual_seed(1)
            return torch.utils.data.TensorDataset(torch.randn(6, 4, generator=g), torch.zeros(6, dtype=torch.long))
        ''',
    "kind.py": '''
        import json
        from hookrun.runner.kinds import NOTHING, RunKind, plain_forward
        from hookrun.store.records import Capture, CaptureKey

        class ScaledKind(RunKind):
            def step(self, model, call, session):
                out = plain_forward(model, call)
                value = out.sum(1) * self.ctx.cfg.{name}.factor
                self.ctx.env.captures.add(Capture(CaptureKey("{name}", "", "{name}", self.ctx.cfg.{name}.label),
                                                  value.detach(), False, dims=("sample",)))
                return NOTHING

            def prepare_run(self, p):
                p.attrs["{name}"] = json.dumps({{"factor": self.ctx.cfg.{name}.factor}})
        ''',
    "reader.py": '''
        import json
        import numpy as np
        from hookrun.analysis.kind_readers import KindReader, Table
        from hookrun.analysis.report.figure_specs import Lines
        from hookrun.analysis.report.run_sections import section, table_item

        def sums(f):
            ds = f["captures/{name}/__model__/sum"]
            return Table(["sample", "sum"], [{{"sample": i, "sum": float(v)}} for i, v in enumerate(ds[:])])

        def lines(f):
            return [f"  {name}     factor {{json.loads(f.attrs['{name}'])['factor']}}, {{len(sums(f))}} sums"]

        def figures(run):
            t = sums(run.file)
            return [("{name}_sums", Lines(x=t.column("sample"), series={{"sum": t.column("sum")}}, xlabel="sample",
                                          ylabel="scaled sum", title="{name}: scaled sums"))]

        def sections(run):
            t = sums(run.file)
            return [section("{name}", "Scaled sums", [table_item(t.columns, t.rows)])]

        READER = KindReader("{name}", present=lambda f: "captures/{name}" in f, lines=lines, figures=figures,
                            sections=sections, methods={{"{name}_sums": sums}})
        ''',
    "ops.py": '''
        import torch

        def shift(amount: float, *, build):  # op: {name}_shift: tanh, then amount x the feature's index
            offset = amount * torch.arange(build.point.target.out_features, dtype=torch.float32)
            return lambda x, ctx: torch.tanh(x) + offset
        ''',
    "notebook.py": '''
        import torch

        def {name}_sums(model, x, factor=1.0):
            with torch.no_grad():
                return model(x).sum(1) * factor
        ''',
}


def make_package(root: Path, pkg: str, name: str, entry_point: bool) -> None:
    (root / pkg).mkdir(parents=True)
    for file, text in PACKAGE.items():
        (root / pkg / file).write_text(textwrap.dedent(text.format(pkg=pkg, name=name)))
    if entry_point:  # what `pip install` of a package declaring [project.entry-points."hookrun.kinds"] leaves
        info = root / f"{pkg}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {pkg}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[hookrun.kinds]\n{name} = {pkg}:KIND\n")


def cli(*args: str, cwd: Path, pythonpath: Path, module: str = "hookrun") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return warm_python.run_module(module, list(args), cwd=cwd, env=env, timeout=600)  # (hookrun imported fresh)


def user_models(pkg_root: Path, pkg: str):
    sys.path.insert(0, str(pkg_root))
    try:
        return __import__(f"{pkg}.models", fromlist=["tiny"])
    finally:
        sys.path.remove(str(pkg_root))


def expected_sums(pkg_root: Path, pkg: str, factor: float) -> np.ndarray:
    models = user_models(pkg_root, pkg)
    model, data = models.tiny().eval(), models.data()
    with torch.no_grad():
        return (model(data.tensors[0]).sum(1) * factor).numpy()


def expected_shifted(pkg_root: Path, pkg: str, amount: float) -> tuple[np.ndarray, np.ndarray]:
    """(model[0]'s output, the model's output) with a raw forward hook on model[0] returning
    tanh(out) + amount * [0, 1, 2], written here by hand."""
    models = user_models(pkg_root, pkg)
    model, data = models.tiny().eval(), models.data()
    seen = []

    def hook(module, args, out):
        seen.append(torch.tanh(out) + amount * torch.tensor([0.0, 1.0, 2.0]))
        return seen[-1]

    handle = model[0].register_forward_hook(hook)
    with torch.no_grad():
        final = model(data.tensors[0])
    handle.remove()
    return seen[0].numpy(), final.numpy()


SHIFT_HOOKS = ("{{s: {{at: '0', type: forward, actions: [{{name: modify_output, op: {op}, amount: 0.5}}, record]}}, "
               "out: {{at: '2', type: forward, actions: [record]}}}}")


@pytest.mark.slow
def test_a_kind_from_a_users_package_runs_reads_plots_and_reports(tmp_path):
    pkg_root = tmp_path / "site"
    make_package(pkg_root, "userkind_ep", "scaled", entry_point=True)
    base = ["model=custom", "model._target_=userkind_ep.models.tiny", "data=custom",
            "data.dataset._target_=userkind_ep.models.data", "data.batch_size=4", "device=cpu", "progress=false"]
    done = cli(*base, "+scaled={factor: 2.5}", "hydra.run.dir=out", cwd=tmp_path, pythonpath=pkg_root)
    assert done.returncode == 0, done.stderr
    with h5py.File(tmp_path / "out/captures.h5") as f:
        assert f.attrs["kind"] == "scaled"
        np.testing.assert_allclose(f["captures/scaled/__model__/sum"][:], expected_sums(pkg_root, "userkind_ep", 2.5),
                                   rtol=1e-6)
        assert "scaled:\n  factor: 2.5" in f.attrs["config"]  # the block as run, in the file's config
    shown = cli("out", cwd=tmp_path, pythonpath=pkg_root, module="hookrun.inspect")
    assert shown.returncode == 0 and "scaled     factor 2.5, 6 sums" in shown.stdout, shown.stdout + shown.stderr
    drawn = cli("out", cwd=tmp_path, pythonpath=pkg_root, module="hookrun.plot")
    assert drawn.returncode == 0, drawn.stderr
    assert (tmp_path / "out/figures/scaled_sums.png").is_file(), sorted(os.listdir(tmp_path / "out/figures"))
    page = cli("out", cwd=tmp_path, pythonpath=pkg_root, module="hookrun.report")
    assert page.returncode == 0, page.stderr
    assert "Scaled sums" in (tmp_path / "out/report.html").read_text()
    helped = cli("--help", cwd=tmp_path, pythonpath=pkg_root)  # the kinds the help lists: the user's too
    assert helped.returncode == 0 and re.search(r"^  scaled +the outputs summed, times a factor$", helped.stdout, re.M), \
        helped.stdout
    # a wrong value and a misspelt key of the user's block: one line each, before any model is built
    bad = cli(*base, "+scaled={factor: -1}", "hydra.run.dir=bad", cwd=tmp_path, pythonpath=pkg_root)
    assert bad.returncode == 2 and bad.stderr.strip() == "hookrun: error: scaled.factor=-1.0: must be above 0 (e.g. 2.0)"
    typo = cli(*base, "+scaled={factr: 2}", "hydra.run.dir=typo", cwd=tmp_path, pythonpath=pkg_root)
    assert typo.returncode == 2 and "scaled.factr: not a key of the scaled block; did you mean scaled.factor?" in typo.stderr
    # the package's op, on an ordinary record run (no scaled block): found by name through the entry point
    shifted = cli(*base, "hooks=" + SHIFT_HOOKS.format(op="scaled_shift"), "hydra.run.dir=shifted", cwd=tmp_path,
                  pythonpath=pkg_root)
    assert shifted.returncode == 0, shifted.stderr
    first, final = expected_shifted(pkg_root, "userkind_ep", 0.5)
    with h5py.File(tmp_path / "shifted/captures.h5") as f:
        assert f.attrs["kind"] == "record"
        np.testing.assert_allclose(f["captures/s/0/output"][:], first, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(f["captures/out/2/output"][:], final, rtol=1e-6, atol=1e-7)


def test_a_kind_registered_by_imports_runs_in_python_and_its_block_is_checked_once(tmp_path, monkeypatch):
    import hookrun
    from hookrun.config.plugins import register_plugin  # noqa: F401
    from hookrun.config.schema import _PLUGINS

    pkg_root = tmp_path / "site"
    make_package(pkg_root, "userkind_imp", "halved", entry_point=False)
    (pkg_root / "userkind_imp/register.py").write_text(
        "from hookrun.config.plugins import register_plugin\nfrom userkind_imp import KIND\nregister_plugin(KIND)\n")
    monkeypatch.syspath_prepend(str(pkg_root))
    monkeypatch.delitem(_PLUGINS, "halved", raising=False)
    from userkind_imp import models
    from userkind_imp.block import COUNT

    cfg = {"imports": ["userkind_imp.register"], "halved": {"factor": 0.5}, "device": "cpu", "progress": False,
           "data": {"batch_size": 4}, "output": {"path": str(tmp_path / "h.h5")}}
    result = hookrun.run(cfg, model=models.tiny(), dataset=models.data())
    assert len(COUNT) == 1  # parsed and checked once per run
    run = hookrun.open_run(result.path)
    np.testing.assert_allclose(run.halved_sums().column("sum"), expected_sums(pkg_root, "userkind_imp", 0.5), rtol=1e-6)
    x = models.data().tensors[0]
    np.testing.assert_allclose(hookrun.halved_sums(models.tiny().eval(), x, 0.5).numpy(),
                               expected_sums(pkg_root, "userkind_imp", 0.5), rtol=1e-6)
    # its op `halved_shift` modifies an ordinary record run (no halved block) as a raw hook does by hand
    hooks = {"s": {"at": "0", "type": "forward", "actions": [{"name": "modify_output", "op": "halved_shift",
                                                              "amount": 0.5}, "record"]},
             "out": {"at": "2", "type": "forward", "actions": ["record"]}}
    shifted = {"imports": ["userkind_imp.register"], "hooks": hooks, "device": "cpu", "progress": False,
               "data": {"batch_size": 4}, "output": {"path": str(tmp_path / "s.h5")}}
    run = hookrun.open_run(hookrun.run(shifted, model=models.tiny(), dataset=models.data()).path)
    first, final = expected_shifted(pkg_root, "userkind_imp", 0.5)
    np.testing.assert_allclose(run.file["captures/s/0/output"][:], first, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(run.file["captures/out/2/output"][:], final, rtol=1e-6, atol=1e-7)
    hooks["s"]["actions"][0]["op"] = "halved_shfit"  # a misspelt plugin op: one line, the plugin's name offered
    with pytest.raises(ConfigError, match=r"^hooks\.s\.actions\.0\.op: unknown op 'halved_shfit'; did you mean: "
                                          r"halved_shift"):
        hookrun.run({**shifted, "output": {"path": str(tmp_path / "t.h5")}}, model=models.tiny(), dataset=models.data())
    _PLUGINS.pop("halved", None)
    # a process that has not imported the module of `imports:`: the file's kind is named, with how to read it
    from hookrun.analysis.kind_readers import READERS

    READERS.pop("halved", None)
    run = hookrun.open_run(result.path)
    assert ("  kind      halved: no reader for this kind here (it came from imports: ['userkind_imp.register']): import "
            "that module before open_run, or declare the kind as an entry point of hookrun.kinds") in run.summary()
    with pytest.raises(AttributeError, match=r"no attribute 'halved_sums' \(halved: no reader for this kind here"):
        run.halved_sums()


def test_a_plugin_naming_nothing_or_a_built_in_op_is_one_line_before_any_batch(tmp_path, monkeypatch):
    import hookrun
    from hookrun.config.schema import _PLUGINS

    pkg_root = tmp_path / "site"
    make_package(pkg_root, "userkind_bad", "wrong", entry_point=False)
    (pkg_root / "userkind_bad/register.py").write_text(textwrap.dedent('''
        from hookrun.config.plugins import KindPlugin, register_plugin
        register_plugin(KindPlugin("wrong", block="userkind_bad.block:Blok", run="userkind_bad.kind:ScaledKind",
                                   ops={"scale": "userkind_bad.ops:shift", "wrong_gone": "userkind_gone.ops:shift",
                                        "wrong_typo": "userkind_bad.ops:shfit"}))
        '''))
    monkeypatch.syspath_prepend(str(pkg_root))
    from userkind_bad import models

    def run(**extra):
        cfg = {"imports": ["userkind_bad.register"], "device": "cpu", "progress": False, "data": {"batch_size": 4},
               "output": {"path": str(tmp_path / "never.h5")}, **extra}
        with pytest.raises(ConfigError) as caught:
            hookrun.run(cfg, model=models.tiny(), dataset=models.data())
        assert not (tmp_path / "never.h5").exists()
        return str(caught.value)

    def modify(op):
        return {"s": {"at": "0", "type": "forward", "actions": [{"name": "modify_output", "op": op, "amount": 0.5}]}}

    try:
        assert run(wrong={"factor": 2.0}) == ("kind plugin 'wrong', block: 'userkind_bad.block:Blok': userkind_bad.block "
                                              "has no attribute 'Blok'; did you mean userkind_bad.block:Block?")
        assert run(hooks=modify("scale")) == ("hooks.s.actions.0.op: 'scale' is one of hookrun's own ops, and a kind "
                                              "plugin declares an op 'scale' in its `ops` too; give the plugin's op "
                                              "another name")
        assert run(hooks=modify("wrong_gone")).startswith(
            "hooks.s.actions.0.op: kind plugin 'wrong', ops['wrong_gone']: 'userkind_gone.ops:shift': there is no "
            "module 'userkind_gone' on Python's path")
        assert run(hooks=modify("wrong_typo")).endswith("userkind_bad.ops has no attribute 'shfit'; did you mean "
                                                        "userkind_bad.ops:shift?")
    finally:
        _PLUGINS.pop("wrong", None)


BROKEN = '''
from dataclasses import dataclass
from hookrun.analysis.kind_readers import KindReader
from hookrun.config.plugins import KindPlugin
from hookrun.runner.kinds import RunKind

class NotADataclass:
    factor: float = 1.0

@dataclass
class Block:
    factor: float = 1.0

class BoomKind(RunKind):
    def step(self, model, call, session):
        raise ValueError("the plugin's step exploded")

def _explode(f):
    raise KeyError("the reader exploded")

BOOM = KindPlugin("boom", block=Block, run=BoomKind)
NOTDC = KindPlugin("notdc", block=NotADataclass, run=RunKind)
BADREAD = KindPlugin("badread", block=Block, run=RunKind, reader=KindReader("badread", present=lambda f: True,
                                                                           lines=_explode, figures=_explode, sections=_explode))
'''


@pytest.mark.slow
def test_a_broken_users_plugin_is_one_line_and_breaks_no_other_run(tmp_path):
    """A plugin's mistakes through the command line (a name no block can have, its step's own
    exception) are one line each naming the plugin (a run that failed in its step: exit 1, as the
    model's own forward's error); other runs and --help go on."""
    pkg_root = tmp_path / "site"
    make_package(pkg_root, "userkind_broken", "fine", entry_point=True)
    (pkg_root / "userkind_broken/broken.py").write_text(BROKEN)
    (pkg_root / "userkind_broken/crashing.py").write_text("import nonexistent_dependency_abc\n" + BROKEN)
    with open(pkg_root / "userkind_broken-0.1.dist-info/entry_points.txt", "a") as f:
        f.write("my-kind = userkind_broken:KIND\noutput = userkind_broken:KIND\nprobe = userkind_broken:KIND\n"
                "boom = userkind_broken.broken:BOOM\nnotdc = userkind_broken.broken:NOTDC\n"
                "badread = userkind_broken.broken:BADREAD\ncrashy = userkind_broken.crashing:BOOM\n"
                "misnamed = userkind_broken.broken:BOOM\n")
    other = pkg_root / "userkind_dup-0.1.dist-info"  # a second package declaring the kind `fine` too
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: userkind_dup\nVersion: 0.1\n")
    (other / "entry_points.txt").write_text("[hookrun.kinds]\nfine = userkind_broken.broken:BOOM\n")
    base = ["model=custom", "model._target_=userkind_broken.models.tiny", "data=custom",
            "data.dataset._target_=userkind_broken.models.data", "data.batch_size=4", "device=cpu", "progress=false"]

    def one_line(proc, text, code=2):
        assert proc.returncode == code and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert text in proc.stderr, proc.stderr

    helped = cli("--help", cwd=tmp_path, pythonpath=pkg_root)
    assert helped.returncode == 0, helped.stderr
    listed = " ".join(helped.stdout.split())
    assert ("my-kind (entry point 'my-kind' of hookrun.kinds (userkind_broken:KIND) is not used: a kind's name is its "
            "config block's key, a Python identifier (e.g. 'my_kind'))") in listed
    assert "'output' is a key every config has; give the kind another name" in listed
    assert "'probe' is one of hookrun's own kinds; give the kind another name" in listed
    plain = cli(*base, "hydra.run.dir=plain", cwd=tmp_path, pythonpath=pkg_root)  # no broken kind asked for
    assert plain.returncode == 0, plain.stderr
    # a built-in op and a report ask every kind for names: the broken ones are passed over (they were the
    # crashing plugin's traceback in every modify run, and "the report needs plotly")
    scaled = cli(*base, "hooks=" + SHIFT_HOOKS.replace("op: {op}, amount: 0.5", "op: scale, factor: 0.5").format(),
                 "hydra.run.dir=scaled", cwd=tmp_path, pythonpath=pkg_root)
    assert scaled.returncode == 0, scaled.stderr
    reported = cli(str(tmp_path / "scaled"), cwd=tmp_path, pythonpath=pkg_root, module="hookrun.report")
    assert reported.returncode == 0, reported.stderr
    # asked for by name: one line each, naming where the kind came from
    where = "entry point 'crashy' of hookrun.kinds (userkind_broken.crashing:BOOM)"
    one_line(cli(*base, "+crashy={}", "hydra.run.dir=crashy", cwd=tmp_path, pythonpath=pkg_root),
             f"hookrun: error: the kind plugin 'crashy' ({where}) fails to load: ModuleNotFoundError: No module named "
             f"'nonexistent_dependency_abc'")
    one_line(cli(*base, "+misnamed={}", "hydra.run.dir=misnamed", cwd=tmp_path, pythonpath=pkg_root),
             "the kind plugin 'misnamed' (entry point 'misnamed' of hookrun.kinds (userkind_broken.broken:BOOM)) is a "
             "KindPlugin named 'boom'; it must be the KindPlugin named 'misnamed'")
    one_line(cli(*base, "+fine={}", "hydra.run.dir=fine", cwd=tmp_path, pythonpath=pkg_root),
             "the kind 'fine' is declared twice: entry point 'fine' of hookrun.kinds (")
    assert not any((tmp_path / d).exists() for d in ("crashy", "misnamed", "fine"))
    boom = cli(*base, "+boom={}", "hydra.run.dir=boom", cwd=tmp_path, pythonpath=pkg_root)
    one_line(boom, "hookrun: error: the boom kind (userkind_broken.broken.BoomKind) failed in step: ValueError: the "
                   "plugin's step exploded (the traceback: HYDRA_FULL_ERROR=1 or --verbose)", code=1)  # failed, as a forward's error
    with h5py.File(tmp_path / "boom/captures.h5") as f:
        assert f.attrs["status"] == "failed"


def test_a_plugins_block_not_a_dataclass_is_one_line_and_its_failing_reader_hides_nothing_else(tmp_path, monkeypatch, capsys):
    """(in this process, the plugins registered by `imports:`: what the command line does with an entry point's)"""
    import hookrun
    from hookrun.analysis.kind_readers import READERS
    from hookrun.cli.inspect_command import main as inspect_main
    from hookrun.cli.plot_command import main as plot_main
    from hookrun.cli.report_command import main as report_main
    from hookrun.config.schema import _PLUGINS

    pkg_root = tmp_path / "site"
    make_package(pkg_root, "userkind_broken2", "fine2", entry_point=False)
    (pkg_root / "userkind_broken2/broken.py").write_text(BROKEN + "\nfrom hookrun.config.plugins import register_plugin\n"
                                                         "register_plugin(NOTDC)\nregister_plugin(BADREAD)\n")
    monkeypatch.syspath_prepend(str(pkg_root))
    from userkind_broken2 import models

    def cfg(name, block):
        return {"imports": ["userkind_broken2.broken"], name: block, "device": "cpu", "progress": False,
                "data": {"batch_size": 4}, "output": {"path": str(tmp_path / f"{name}.h5")}}

    try:
        with pytest.raises(ConfigError) as caught:
            hookrun.run(cfg("notdc", {}), model=models.tiny(), dataset=models.data())
        assert str(caught.value) == ("kind plugin 'notdc', block: <class 'userkind_broken2.broken.NotADataclass'> is "
                                     "<class 'userkind_broken2.broken.NotADataclass'>, not a dataclass (its keys, types "
                                     "and defaults: decorate the class with @dataclasses.dataclass)")
        assert not (tmp_path / "notdc.h5").exists()
        hooks = {"out": {"at": "2", "type": "forward", "actions": ["record"]}}
        path = hookrun.run({**cfg("badread", {}), "hooks": hooks}, model=models.tiny(), dataset=models.data()).path
        capsys.readouterr()
        with h5py.File(path) as f:  # the reference: what the file holds, read by h5py
            values, status = f["captures/out/2/output"][:], f.attrs["status"]
        # the user's reader fails in its part: the run's common parts are still shown, drawn and written, then one
        # line naming the plugin's function, and exit 1
        for main, part in ((inspect_main, "lines"), (plot_main, "figures"), (report_main, "sections")):
            assert main([str(path)]) == 1, part
            out, err = capsys.readouterr()
            assert err == (f"hookrun{'.inspect' if main is inspect_main else ''}: error: the badread kind's reader failed: "
                           f"KeyError: 'the reader exploded' (its {part}: userkind_broken2.broken._explode; the run's "
                           f"other parts are shown without it)\n"), err
            if main is inspect_main:
                assert f"status    {status}" in out and f"out/2/output  ({len(values)}, 2)" in out, out
                assert f"mean {values.mean():.4g} std {values.std():.4g}" in out, out
        assert (tmp_path / "figures/hist_out__2__output.png").is_file(), sorted(os.listdir(tmp_path / "figures"))
        assert "out/2/output" in (tmp_path / "report.html").read_text()
        # a reader of hookrun's own that raises still stops the command (a bug of hookrun's is not hidden)
        monkeypatch.setattr(READERS["badread"].lines, "__module__", "hookrun.runner.kinds.badread.reader")
        assert inspect_main([str(path)]) == 2
        assert capsys.readouterr().err == ("hookrun.inspect: error: the badread kind's reader failed in lines: KeyError: "
                                           "'the reader exploded'\n")
    finally:
        for name in ("notdc", "badread"):
            _PLUGINS.pop(name, None)
            READERS.pop(name, None)


def test_import_hookrun_loads_no_kind_plugin():
    code = ("import sys, hookrun; from hookrun.config.plugins import loaded_plugins; "
            "print(len(loaded_plugins()), sorted(m for m in sys.modules if m.startswith('hookrun.runner.kinds.') "
            "and m.count('.') == 3 and m.rsplit('.', 1)[1] in __import__('hookrun.config.schema', fromlist=['x'])"
            ".plugin_names()))")
    out = warm_python.run_code(code, [], cwd=ROOT, env=dict(os.environ), timeout=300)  # (hookrun imported fresh)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "0", out.stdout
    assert out.stdout.strip().endswith("[]"), out.stdout


def test_an_imports_module_that_raises_or_registers_a_taken_name_is_one_line(tmp_path, monkeypatch):
    """A module of `imports:` that raised as it ran was its traceback; one that registered a kind under a name
    another kind has replaced that kind in silence (which of two a run used hung on the import order)."""
    import hookrun
    from hookrun.config.plugins import KindPlugin, register_plugin
    from hookrun.config.schema import _PLUGINS

    (tmp_path / "raises_here.py").write_text("raise RuntimeError('no licence file found')\n")
    (tmp_path / "takes_a_name.py").write_text(
        "from hookrun.config.plugins import KindPlugin, register_plugin\nfrom hookrun.runner.kinds import RunKind\n"
        "from dataclasses import dataclass\n@dataclass\nclass B:\n    x: int = 1\n"
        "register_plugin(KindPlugin('taken', block=B, run=RunKind))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = register_plugin(KindPlugin("taken", block="a.b:C", run="a.b:D"))
    try:
        assert register_plugin(first) is first  # the same kind again: nothing changes
        for module, message in (("raises_here", "imports: 'raises_here' failed as it was imported: RuntimeError: no "
                                                "licence file found"),
                                ("takes_a_name", "register_plugin('taken'): a kind of that name is there already "
                                                 "(registered before); give it another name")):
            with pytest.raises(ConfigError) as caught:
                hookrun.run({"imports": [module], "device": "cpu", "output": {"path": str(tmp_path / "x.h5")}},
                            model=torch.nn.Linear(2, 2), dataset=torch.zeros(4, 2))
            assert str(caught.value) == message
        assert _PLUGINS["taken"] is first and not (tmp_path / "x.h5").exists()
    finally:
        _PLUGINS.pop("taken", None)


def test_a_file_of_a_kind_whose_package_is_not_installed_here_says_so(tmp_path):
    """(it said the kind came from the run's imports:, which the run never had)"""
    import h5py
    import numpy as np

    import hookrun

    with h5py.File(tmp_path / "k.h5", "w") as f:
        f.attrs.update(format_version="1", status="complete", kind="ghostkind", config="device: cpu\n")
        f["samples/index"] = np.arange(2)
        f["samples/step"] = np.zeros(2, dtype=np.int64)
    with hookrun.open_run(tmp_path / "k.h5") as run:
        assert ("  kind      ghostkind: no reader for this kind here: the package that declares it (an entry point of "
                "hookrun.kinds) is not installed in this environment; install it for inspect, plot and report to read "
                "its rows") in run.summary(stats=False)


def test_a_kinds_step_that_returns_no_step_adds_is_one_line_naming_the_kind(tmp_path):
    """A user's step returning None (or a dict) was 'failed in run_steps: AttributeError: 'NoneType' object
    has no attribute 'samples''; now the kind, step() and what it must return, and the file says failed (h5py)."""
    import dataclasses

    import h5py

    import hookrun
    from hookrun.config.plugins import KindPlugin, register_plugin
    from hookrun.config.schema import _PLUGINS
    from hookrun.errors import RunError
    from hookrun.runner.kinds import RunKind, plain_forward

    class Forgets(RunKind):
        def step(self, model, call, session):
            plain_forward(model, call)
            return None

    register_plugin(KindPlugin("forgets", block=dataclasses.make_dataclass("B", [("x", int, 1)]), run=Forgets))
    try:
        with pytest.raises(RunError, match=r"^the forgets kind's step\(\) returned NoneType; it returns a StepAdds "
                                           r"\(NOTHING, hookrun.runner.kinds,"):
            hookrun.run({"forgets": {}, "device": "cpu", "progress": False, "data": {"batch_size": 4},
                         "output": {"path": str(tmp_path / "f.h5")}}, model=torch.nn.Linear(4, 3),
                        dataset=torch.randn(6, 4))
        with h5py.File(tmp_path / "f.h5") as f:
            assert f.attrs["status"] == "failed"
    finally:
        _PLUGINS.pop("forgets", None)


def test_a_plugin_slots_module_that_fails_on_an_import_of_its_own_is_one_line_naming_the_slot(tmp_path, monkeypatch,
                                                                                                capsys):
    """The docs' layout names every slot by a "module:attribute" string; a slot's module that failed on an import
    of its own (a dependency of the user's package missing) was its traceback in a run, an op, a notebook call and
    inspect, and plot and report said "install the plot extra: pip install 'hookrun[plot]'". Now one line naming
    the plugin, the slot and Python's own error (the reference: importlib's ModuleNotFoundError, asked here)."""
    import importlib

    import hookrun
    from hookrun.cli.plot_command import main as plot_main
    from hookrun.config.plugins import KindPlugin, register_plugin
    from hookrun.config.schema import _PLUGINS

    (tmp_path / "slotdep_kind.py").write_text("import slotdep_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as python_says:
        importlib.import_module("slotdep_kind")
    error = f"ModuleNotFoundError: {python_says.value}"
    monkeypatch.delitem(sys.modules, "slotdep_kind", raising=False)
    register_plugin(KindPlugin("slotdep", block="slotdep_kind:Block", run="slotdep_kind:Kind",
                               reader="slotdep_kind:READER", notebook="slotdep_kind:slotdep_sums",
                               ops={"slotdep_shift": "slotdep_kind:shift"}))
    try:
        def refused(**extra):
            cfg = {"device": "cpu", "progress": False, "output": {"path": str(tmp_path / "never.h5")}, **extra}
            with pytest.raises(ConfigError) as caught:
                hookrun.run(cfg, model=torch.nn.Linear(4, 3), dataset=torch.randn(6, 4))
            assert not (tmp_path / "never.h5").exists()
            return str(caught.value)

        assert refused(slotdep={"factor": 2.0}) == (f"kind plugin 'slotdep', block: 'slotdep_kind:Block': slotdep_kind "
                                                    f"fails to load: {error}")
        hooks = {"s": {"at": "", "type": "forward", "actions": [{"name": "modify_output", "op": "slotdep_shift"}]}}
        assert refused(hooks=hooks) == (f"hooks.s.actions.0.op: kind plugin 'slotdep', ops['slotdep_shift']: "
                                        f"'slotdep_kind:shift': slotdep_kind fails to load: {error}")
        with pytest.raises(ConfigError, match=rf"^kind plugin 'slotdep', notebook: 'slotdep_kind:slotdep_sums': "
                                              rf"slotdep_kind fails to load: {re.escape(error)}$"):
            hookrun.slotdep_sums  # noqa: B018
        with h5py.File(tmp_path / "k.h5", "w") as f:  # a file of the kind, read where its reader cannot load
            f.attrs.update(format_version="1", status="complete", kind="slotdep", config="device: cpu\n")
            f["samples/index"] = np.arange(2)
            f["samples/step"] = np.zeros(2, dtype=np.int64)
        capsys.readouterr()
        assert plot_main([str(tmp_path / "k.h5"), "--out", str(tmp_path / "figures")]) != 0
        err = capsys.readouterr().err
        assert "hookrun[plot]" not in err and "Traceback" not in err, err  # (and: nothing could be drawn)
        assert (f"kind plugin 'slotdep', reader: 'slotdep_kind:READER': slotdep_kind fails to load: {error} (the "
                f"run's other parts are shown without the slotdep kind's)\n" in err), err
    finally:
        _PLUGINS.pop("slotdep", None)


def test_a_users_reader_that_fails_to_load_hides_nothing_else(tmp_path, monkeypatch, capsys):
    """A user's kind whose reader module fails on an import of its own (its package's dependency missing
    where the file is read) stopped inspect, plot and report before anything was shown; now, as a reader
    that raises, the run's common parts are shown, drawn and written, then one line, exit 1 (h5py: the
    reference for what is shown)."""
    import dataclasses

    import hookrun
    from hookrun.cli.inspect_command import main as inspect_main
    from hookrun.cli.plot_command import main as plot_main
    from hookrun.cli.report_command import main as report_main
    from hookrun.config.plugins import KindPlugin, register_plugin
    from hookrun.config.schema import _PLUGINS
    from hookrun.runner.kinds import RunKind

    (tmp_path / "unloaded_reader.py").write_text("import unloaded_reader_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    register_plugin(KindPlugin("unloadedr", block=dataclasses.make_dataclass("B", [("x", int, 1)]), run=RunKind,
                               reader="unloaded_reader:READER"))
    try:
        hooks = {"out": {"at": "", "type": "forward", "actions": ["record"]}}
        path = hookrun.run({"unloadedr": {}, "hooks": hooks, "device": "cpu", "progress": False,
                            "data": {"batch_size": 4}, "output": {"path": str(tmp_path / "u.h5")}},
                           model=torch.nn.Linear(4, 3), dataset=torch.randn(6, 4)).path
        with h5py.File(path) as f:
            assert f.attrs["kind"] == "unloadedr"
            values, status = f["captures/out/__model__/output"][:], f.attrs["status"]
        capsys.readouterr()
        line = ("kind plugin 'unloadedr', reader: 'unloaded_reader:READER': unloaded_reader fails to load: "
                "ModuleNotFoundError: No module named 'unloaded_reader_missing_dependency' (the run's other parts "
                "are shown without the unloadedr kind's)\n")
        for main, prog in ((inspect_main, "hookrun.inspect"), (plot_main, "hookrun"), (report_main, "hookrun")):
            assert main([str(path)]) == 1, prog
            out, err = capsys.readouterr()
            assert err == f"{prog}: error: {line}", err
            if main is inspect_main:
                assert f"status    {status}" in out and f"({len(values)}, 3)" in out, out
                assert f"mean {values.mean():.4g} std {values.std():.4g}" in out, out
        assert (tmp_path / "figures/hist_out__model__output.png").is_file(), sorted(os.listdir(tmp_path / "figures"))
        assert "out/(model)/output" in (tmp_path / "report.html").read_text()
        # a file of another kind: that kind's reader is never its concern (the report asks every kind's names)
        other = hookrun.run({"hooks": hooks, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "o.h5")}},
                            model=torch.nn.Linear(4, 3), dataset=torch.randn(6, 4)).path
        for main in (inspect_main, plot_main, report_main):
            assert main([str(other)]) == 0, capsys.readouterr().err
        assert "unloadedr" not in capsys.readouterr().err
    finally:
        _PLUGINS.pop("unloadedr", None)


def test_a_plugin_blocks_enum_is_stored_by_name_so_its_file_reads_back(tmp_path, capsys):
    """A block's Enum field was stored as `!!python/object/apply:pkg.Mode`: inspect, report, open_run(...).config
    and resume=true of such a run said its config "is not YAML". It is stored by name, as the schema's enums are
    (yaml.safe_load, the reference), and the kind still reads the Enum member."""
    import dataclasses
    import enum

    import yaml

    import hookrun
    from hookrun.cli.inspect_command import main as inspect_main
    from hookrun.config.plugins import KindPlugin, register_plugin
    from hookrun.config.schema import _PLUGINS
    from hookrun.runner.kinds import RunKind

    class Reduce(enum.Enum):
        total = "sum"
        average = "mean"

    seen = []

    class Reads(RunKind):
        def step(self, model, call, session):
            seen.append(self.ctx.cfg.enumblock.reduce)
            return super().step(model, call, session)

    block = dataclasses.make_dataclass("B", [("reduce", Reduce, Reduce.total)])
    register_plugin(KindPlugin("enumblock", block=block, run=Reads))
    try:
        cfg = {"enumblock": {"reduce": "average"}, "device": "cpu", "progress": False, "data": {"batch_size": 4},
               "hooks": {"out": {"at": "", "type": "forward", "actions": ["record"]}},
               "output": {"path": str(tmp_path / "e.h5")}}
        path = hookrun.run(cfg, model=torch.nn.Linear(4, 3), dataset=torch.randn(6, 4)).path
        assert seen and all(r is Reduce.average for r in seen)
        with h5py.File(path) as f:
            stored = yaml.safe_load(f.attrs["config"])
        assert stored["enumblock"] == {"reduce": "average"}
        assert hookrun.open_run(path).config["enumblock"]["reduce"] == "average"
        capsys.readouterr()
        assert inspect_main([str(path)]) == 0, capsys.readouterr().err
        done = hookrun.run({**cfg, "resume": True}, model=torch.nn.Linear(4, 3), dataset=torch.randn(6, 4))
        assert done.path == path
    finally:
        _PLUGINS.pop("enumblock", None)


def test_a_plugin_blocks_path_is_stored_as_its_text_so_its_file_reads_back(tmp_path):
    """A block's pathlib.Path field was stored as `!!python/object/apply:pathlib.PosixPath`: the file's config
    was no YAML to any reader. It is stored as the path's text (yaml.safe_load, the reference); the kind
    still reads a Path."""
    import dataclasses
    from pathlib import Path

    import yaml

    import hookrun
    from hookrun.config.plugins import KindPlugin, register_plugin
    from hookrun.config.schema import _PLUGINS
    from hookrun.runner.kinds import RunKind

    seen = []

    class Reads(RunKind):
        def step(self, model, call, session):
            seen.append(self.ctx.cfg.pathblock.where)
            return super().step(model, call, session)

    register_plugin(KindPlugin("pathblock", block=dataclasses.make_dataclass("B", [("where", Path, Path("a"))]),
                               run=Reads))
    try:
        cfg = {"pathblock": {"where": str(tmp_path / "there")}, "device": "cpu", "progress": False,
               "hooks": {"out": {"at": "", "type": "forward", "actions": ["record"]}},
               "output": {"path": str(tmp_path / "p.h5")}}
        path = hookrun.run(cfg, model=torch.nn.Linear(4, 3), dataset=torch.randn(6, 4)).path
        assert seen and all(w == tmp_path / "there" and isinstance(w, Path) for w in seen)
        with h5py.File(path) as f:
            assert yaml.safe_load(f.attrs["config"])["pathblock"] == {"where": str(tmp_path / "there")}
        assert hookrun.open_run(path).config["pathblock"]["where"] == str(tmp_path / "there")
        assert hookrun.run({**cfg, "resume": True}, model=torch.nn.Linear(4, 3), dataset=torch.randn(6, 4)).path == path
    finally:
        _PLUGINS.pop("pathblock", None)


def test_a_users_reader_whose_present_attr_lines_or_header_raises_hides_nothing_else(tmp_path, monkeypatch, capsys):
    """KindReader's `present` (every command asks it), `attr_lines` (inspect) and `header` (the report's run
    table) were called outside the isolation the other parts have: a user's that raised was the command's
    traceback. Now each is one line naming the function, after the run's common parts (h5py: the reference)."""
    import dataclasses

    import hookrun
    from hookrun.analysis.kind_readers import READERS, KindReader
    from hookrun.cli.inspect_command import main as inspect_main
    from hookrun.cli.report_command import main as report_main
    from hookrun.config.plugins import KindPlugin, register_plugin
    from hookrun.config.schema import _PLUGINS
    from hookrun.runner.kinds import RunKind

    (tmp_path / "raising_parts.py").write_text(textwrap.dedent('''
        def present(f):
            return f["no/such/group"] is not None

        def attr_lines(attrs):
            raise KeyError("attr_lines exploded")

        def header(attrs):
            raise KeyError("header exploded")
        '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    import raising_parts

    reader = KindReader("rparts", present=raising_parts.present, attr_lines=raising_parts.attr_lines,
                        header=raising_parts.header, lines=lambda f: ["  rparts    never shown"])
    register_plugin(KindPlugin("rparts", block=dataclasses.make_dataclass("B", [("x", int, 1)]), run=RunKind,
                               reader=reader))
    try:
        hooks = {"out": {"at": "", "type": "forward", "actions": ["record"]}}
        path = hookrun.run({"rparts": {}, "hooks": hooks, "device": "cpu", "progress": False,
                            "output": {"path": str(tmp_path / "r.h5")}},
                           model=torch.nn.Linear(4, 3), dataset=torch.randn(6, 4)).path
        with h5py.File(path) as f:
            values, status = f["captures/out/__model__/output"][:], f.attrs["status"]
            with pytest.raises(KeyError) as h5py_says:
                f["no/such/group"]
        present = (f"the rparts kind's reader failed: KeyError: {' '.join(str(h5py_says.value).split())} (its present: "
                   f"raising_parts.present; the run's other parts are shown without it)")
        capsys.readouterr()
        assert inspect_main([str(path)]) == 1
        out, err = capsys.readouterr()
        assert f"status    {status}" in out and f"mean {values.mean():.4g} std {values.std():.4g}" in out, out
        assert "never shown" not in out and "Traceback" not in err, err
        assert err == (f"hookrun.inspect: error: {present}\nhookrun.inspect: error: the rparts kind's reader failed: "
                       f"KeyError: 'attr_lines exploded' (its attr_lines: raising_parts.attr_lines; the run's other "
                       f"parts are shown without it)\n"), err
        assert report_main([str(path)]) == 1
        err = capsys.readouterr().err
        assert ("hookrun: error: the rparts kind's reader failed: KeyError: 'header exploded' (its header: "
                "raising_parts.header; the run's other parts are shown without it)\n") in err, err
        assert "out/(model)/output" in (tmp_path / "report.html").read_text()
    finally:
        _PLUGINS.pop("rparts", None)
        READERS.pop("rparts", None)


@pytest.mark.slow
def test_a_kind_a_package_declares_as_an_entry_point_and_registers_too_runs(tmp_path):
    """inspect's advice for a kind of `imports:` is to declare it as an entry point too; a package that did (its
    `imports:` module, or the entry point's own module, calling register_plugin(KIND)) was refused: "a kind of
    that name is there already (entry point ...); give it another name", the same kind. A different kind under
    an entry point's name is still refused. (The reference: the model's own forward, expected_sums.)"""
    pkg_root = tmp_path / "site"
    make_package(pkg_root, "userkind_both", "both", entry_point=True)
    (pkg_root / "userkind_both/register.py").write_text(
        "from hookrun.config.plugins import register_plugin\nfrom userkind_both import KIND\nregister_plugin(KIND)\n")
    (pkg_root / "userkind_both/selfreg.py").write_text(textwrap.dedent('''
        from hookrun.config.plugins import KindPlugin, register_plugin
        KIND = register_plugin(KindPlugin("selfreg", block="userkind_both.block:Block", run="userkind_both.kind:ScaledKind"))
        '''))
    (pkg_root / "userkind_both/other.py").write_text(textwrap.dedent('''
        from hookrun.config.plugins import KindPlugin, register_plugin
        register_plugin(KindPlugin("both", block="userkind_both.block:Block", run="userkind_both.kind:Other"))
        '''))
    (pkg_root / "userkind_both/kind.py").write_text((pkg_root / "userkind_both/kind.py").read_text().replace(
        "self.ctx.cfg.both.", "getattr(self.ctx.cfg, self.name)."))
    with open(pkg_root / "userkind_both-0.1.dist-info/entry_points.txt", "a") as f:
        f.write("selfreg = userkind_both.selfreg:KIND\n")
    base = ["model=custom", "model._target_=userkind_both.models.tiny", "data=custom",
            "data.dataset._target_=userkind_both.models.data", "data.batch_size=4", "device=cpu", "progress=false"]
    for name, extra, factor in (("both", ["imports=[userkind_both.register]"], 2.0), ("selfreg", [], 3.0),
                                ("selfreg", ["imports=[userkind_both.selfreg]"], 0.5)):
        folder = f"{name}_{len(extra)}"
        done = cli(*base, *extra, f"+{name}={{factor: {factor}}}", f"hydra.run.dir={folder}", cwd=tmp_path,
                   pythonpath=pkg_root)
        assert done.returncode == 0, done.stderr
        with h5py.File(tmp_path / folder / "captures.h5") as f:
            assert f.attrs["kind"] == name
            np.testing.assert_allclose(f["captures/both/__model__/sum"][:],  # (the package's kind names its capture so)
                                       expected_sums(pkg_root, "userkind_both", factor), rtol=1e-6)
    other = cli(*base, "imports=[userkind_both.other]", "hydra.run.dir=other", cwd=tmp_path, pythonpath=pkg_root)
    assert other.returncode == 2 and other.stderr == (
        "hookrun: error: register_plugin('both'): a kind of that name is there already (entry point 'both' of "
        "hookrun.kinds (userkind_both:KIND)); give it another name\n"), other.stderr


def test_a_users_reader_whose_no_values_raises_is_one_line_and_the_capture_still_listed(tmp_path, monkeypatch, capsys):
    """KindReader.no_values (what inspect says of a capture with no finite value) was called outside the
    readers' isolation: a user's that raised was inspect's traceback. Now it is one line naming the function,
    the capture still listed with hookrun's own note (h5py: the reference that it holds no finite value)."""
    import dataclasses

    import hookrun
    from hookrun.analysis.kind_readers import READERS, KindReader
    from hookrun.cli.inspect_command import main as inspect_main
    from hookrun.config.plugins import KindPlugin, register_plugin
    from hookrun.config.schema import _PLUGINS
    from hookrun.runner.kinds import RunKind

    (tmp_path / "raising_notes.py").write_text(textwrap.dedent('''
        def no_values(label):
            raise KeyError("no_values exploded")
        '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    import raising_notes

    reader = KindReader("rnotes", present=lambda f: "rnotes" in f.attrs.get("kind", ""), no_values=raising_notes.no_values)
    register_plugin(KindPlugin("rnotes", block=dataclasses.make_dataclass("B", [("x", int, 1)]), run=RunKind,
                               reader=reader))
    try:
        hooks = {"out": {"at": "", "type": "forward", "actions": ["record"]}}
        path = hookrun.run({"rnotes": {}, "hooks": hooks, "device": "cpu", "progress": False,
                            "output": {"path": str(tmp_path / "r.h5")}},
                           model=torch.nn.Linear(4, 3), dataset=torch.full((6, 4), float("nan"))).path
        with h5py.File(path) as f:
            assert not np.isfinite(f["captures/out/__model__/output"][:]).any()
        capsys.readouterr()
        assert inspect_main([str(path)]) == 1
        out, err = capsys.readouterr()
        assert "out/(model)/output" in out and "Traceback" not in err, (out, err)
        assert err == ("hookrun.inspect: error: the rnotes kind's reader failed: KeyError: 'no_values exploded' (its "
                       "no_values: raising_notes.no_values; the run's other parts are shown without it)\n"), err
    finally:
        _PLUGINS.pop("rnotes", None)
        READERS.pop("rnotes", None)
