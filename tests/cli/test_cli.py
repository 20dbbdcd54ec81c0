"""The command line in a subprocess: the README's commands as written, multirun, clean errors."""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import warm_python
from conftest import ENV, ROOT, run_cli

pytestmark = pytest.mark.slow


def h5_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.h5"))


def assert_ok(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("args, captures", [
    (["experiment=resnet_layer1"], {"captures/blocks/layer1.0/output": (64, 64, 56, 56),
                                     "captures/blocks/layer1.1/output": (64, 64, 56, 56)}),
    (["model=resnet50", "data.batch_size=2", "hooks={fmap: {at: layer1.1.conv2, type: forward, actions: [record]}}"],
     {"captures/fmap/layer1.1.conv2/output": (64, 64, 56, 56), "captures/fmap/layer1.1.conv2/input": (64, 64, 56, 56)}),
    (["model=custom", "model._target_=my_pkg.Net", "data=custom", "data.dataset._target_=my_pkg.MyData", "+data.dataset.n=10",
      "hooks={feat: {at: pool, type: forward, actions: [{name: record, what: output}]}}"], {"captures/feat/pool/output": (10, 32, 1, 1)}),
    (["experiment=resnet_layer1", "~hooks", "+hooks={fc_in: {at: fc, type: forward_pre, actions: [record]}}"],
     {"captures/fc_in/fc/input": (64, 512)}),
    (["mode=grad", "loss=cross_entropy", "hooks={g: {at: layer4, type: backward, actions: [record]}}"],
     {"captures/g/layer4/grad_input": (64, 256, 14, 14), "captures/g/layer4/grad_output": (64, 512, 7, 7)}),
    (["experiment=resnet_layer1", "+hooks.fc_in={at: fc, type: forward_pre, actions: [record]}"],
     {"captures/blocks/layer1.0/output": (64, 64, 56, 56), "captures/fc_in/fc/input": (64, 512)}),
], ids=["experiment", "resnet50", "custom", "replace-hooks", "grad", "plus-hook"])
def test_issue_commands_as_written(tmp_path, args, captures):
    proc = run_cli(*args, cwd=tmp_path, env=ENV)
    assert_ok(proc)
    (path,) = h5_files(tmp_path / "outputs")
    assert (path.parent / "hookrun.log").exists()  # Hydra's per-run log
    with h5py.File(path) as f:
        assert f.attrs["status"] == "complete"
        for name, shape in captures.items():
            assert f[name].shape == shape
        assert len(f["captures"]) == len({n.split("/")[1] for n in captures})  # ~hooks: the experiment's are gone
        assert f["samples/index"].shape[0] == (10 if "model=custom" in args else 64)


def test_multirun_gives_each_job_its_own_complete_file(tmp_path):
    proc = run_cli("-m", "experiment=resnet_layer1", "seed=0,1,2", "data.limit=1", cwd=tmp_path)
    assert_ok(proc)
    files = h5_files(tmp_path / "outputs" / "multirun")
    assert [p.parent.name for p in files] == ["0", "1", "2"]
    firsts = []
    for p in files:
        with h5py.File(p) as f:
            assert f.attrs["status"] == "complete"
            firsts.append(f["captures/blocks/layer1.0/output"][0, 0])
    assert not np.allclose(firsts[0], firsts[1])  # seed changes the random init


@pytest.mark.parametrize("args, message", [
    (["bogus=1"], "bogus=1: the config has no key 'bogus'; the top level has: attribution, data, device, dry_run"),
    (["data.batchsize=8"], "data.batchsize=8: the config has no key 'data.batchsize'; did you mean data.batch_size? "
                           "(data has: batch_size, collate, dataset, inputs, limit, num_workers, root, store, target)"),
    (["+data.batchsize=8"], "data.batchsize: Key 'batchsize' not in 'DataConfig'; did you mean data.batch_size?"),
    (["model.num_clases=3"], "did you mean model.num_classes?"),
    (["hooks={x: {at: layer9, type: forward}}"], "has no module 'layer9'; closest names: layer4, layer3"),
    (["hooks={x: {at: fc, type: fwd}}"], "unknown hook type 'fwd'"),
    (["mode=grad", "hooks={x: {at: fc, type: backward}}"], "mode=grad needs a loss"),
    (["mode=train"], "mode=train: Invalid value 'train', expected one of [eval, grad, generate]"),
    (["model=resnet51"], "model=resnet51: there is no model option 'resnet51' (conf/model/resnet51.yaml); did you mean resnet50"),
    (["experiment=ablate_layr3"], "did you mean ablate_layer3"),
    (["data.batch_size=[1"], "cannot parse the override 'data.batch_size=[1'"),
    (["output.path=~/x.h5"], "give the value Hydra's own quotes inside the shell's: 'output.path=\"~/x.h5\"'"),  # (the shell's alone were said to do)
    (["output=5"], "output=5: a mapping of its keys (path, compression, dtype, overwrite, max_bytes, flush_every, "
                   "checksum, staging, part_bytes); set one with output.path=..."),  # (was OmegaConf's "not a subclass")
    (["data=null"], "data=null: data is a config group; name one of its options (custom, image_folder, shapes, "
                    "synthetic, text), e.g. data=custom"),  # (was Hydra's ValueError, typed as such)
    (["experiment=resnet_layer1", "hooks={x: {at: fc, type: forward}}"],
     "to replace hooks, write '~hooks' '+hooks={x: {at: fc, type: forward}}'; to add one entry, '+hooks.x=...'"),
    (["dry_run=2"], "dry_run=2 is not a boolean; give true or false"),  # (Hydra's schema read it as true)
    (["~output"], "~output removed the output block every run needs"),  # (was Hydra's 'Error executing job' line too)
    (["output.path=${params.nope}.h5"], "output.path=${params.nope}.h5: Interpolation key 'params.nope' not found"),  # (likewise)
    (["experiment=resnet_layer1", "~hooks", "hooks={x: {at: fc, type: forward}}"],
     "~hooks removed hooks, so set it again with a +: '+hooks={x: {at: fc, type: forward}}'"),
    # what bash makes of `hooks={a:{at:fc,type:forward}}` and of `hooks={a: {at: fc, type: forward}}` unquoted
    (["hooks={a:at:fc}", "hooks={a:type:forward}"], "hooks is given 2 times (hooks={a:at:fc}, hooks={a:type:forward}): "
                                                    "the shell brace-expanded an unquoted {..,..}"),
    (["hooks={a:", "{at:", "fc,", "type:", "forward}}"], "the override 'hooks={a:' was split by the shell at its spaces "
                                                         "into 5 arguments; put it in single quotes: 'hooks={a: {at: fc, type: forward}}'"),
])
def test_bad_input_gives_one_clear_line_and_no_traceback(tmp_path, args, message):
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert proc.stderr.startswith("hookrun: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert (proc.stderr + proc.stdout).count(message) == 1  # once on the terminal, not echoed by the log
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not h5_files(tmp_path)


def test_the_overrides_said_to_replace_the_data_set_run(tmp_path):
    """data.dataset={...} with a key the config's data set lacks said to write '~data.dataset', which Hydra
    refuses (DataConfig does not support deletion): the overrides the line gives now run as written."""
    import shlex

    import h5py
    from toy_lm import Prompts

    proc = run_cli("model._target_=toy_lm.tiny_gpt2", "data.dataset={_target_: toy_lm.Prompts, n: 20, side: left}",
                   f"hydra.run.dir={tmp_path / 'bad'}", cwd=tmp_path, env=ENV)
    assert proc.returncode == 2, proc.stderr
    said = proc.stderr.split("to replace data.dataset, write ", 1)[1].split("; to add one entry", 1)[0]
    assert said == ("'data.dataset._target_=toy_lm.Prompts' '~data.dataset.size' '~data.dataset.image_size' "
                    "'~data.dataset.num_classes' '~data.dataset.seed' '+data.dataset.n=20' '+data.dataset.side=left'")
    proc = run_cli("model._target_=toy_lm.tiny_gpt2", *shlex.split(said), f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env=ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with h5py.File(tmp_path / "run" / "captures.h5", "r") as f:
        assert f.attrs["status"] == "complete" and len(f["samples/index"]) == len(Prompts(n=20)) == 20


@pytest.mark.slow
def test_an_unknown_key_lists_every_top_level_key_and_a_misspelt_blocks_key_gets_the_close_name(tmp_path):
    """The top level's keys were cut at 20 without saying so (similarity, the 21st, left out); `similarty.x=1`
    said "similarty has no keys". Reference: the top-level keys of the config Hydra composes."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from hookrun.cli.app import conf_dir

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        top = sorted(compose("config"))
    GlobalHydra.instance().clear()
    assert len(top) > 20 and "similarity" in top, top
    listing = f"(the top level has: {', '.join(top)})"
    for override, line in (("bogus=1", f"bogus=1: the config has no key 'bogus'; the top level has: {', '.join(top)}"),
                           ("similarty.x=1", f"similarty.x=1: the config has no key 'similarty.x'; did you mean "
                                             f"similarity.x? {listing}"),
                           ("outptu.path=x", f"outptu.path=x: the config has no key 'outptu.path'; did you mean "
                                             f"output.path? {listing}")):
        proc = run_cli(override, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr == f"hookrun: error: {line}\n", proc.stderr


def test_an_unknown_keys_line_counts_the_keys_it_does_not_name():
    from hookrun.cli.hydra_errors import _unknown_key_message

    keys = ["big"] + [f"big.k{i:02d}" for i in range(45)]
    line = _unknown_key_message("big.zzz", ["big.zzz=1"], keys)
    assert line.endswith(f"(big has: {', '.join(f'k{i:02d}' for i in range(40))} and 5 more)"), line


def test_a_key_given_twice_apart_is_not_taken_for_the_shells_brace_expansion():
    from hookrun.cli.around_hydra import shell_damage

    assert shell_damage(["experiment=probe_shapes", "data.dataset.size=128", "probe.C=2", "data.dataset.size=4"]) == (
        "data.dataset.size is given 2 times (data.dataset.size=128, data.dataset.size=4): give it once (a later "
        "value does not replace an earlier one); to run several values, sweep: -m data.dataset.size=a,b")
    assert "the shell brace-expanded" in shell_damage(["probe.C=1", "hooks={a:at:fc}", "hooks={a:type:forward}"])
    assert shell_damage(["probe.C=1", "data.dataset.size=4"]) is None
    assert shell_damage(["resume=0,3"]) == "resume=3 is not a boolean; give true or false"  # (a sweep's values too)
    assert shell_damage(["output.overwrite=1", "probe.C=3", "data.limit=2"]) is None
    # side by side, but plain values: typed twice as likely as brace-expanded, so both are named
    assert shell_damage(["experiment=sae_train", "sae.k=8", "sae.k=16"]) == (
        "sae.k is given 2 times (sae.k=8, sae.k=16): give it once (a later value does not replace an earlier one); "
        "to run several values, sweep: -m sae.k=a,b; an unquoted {..,..} is split by the shell this way: quote it")


def test_a_run_folder_or_plot_folder_that_cannot_be_made_is_one_line(tmp_path):
    """(was `NotADirectoryError: ...` with no key named, and for plot --out a traceback)"""
    (tmp_path / "afile").write_text("a file, not a folder")
    proc = run_cli("experiment=resnet_layer1", f"hydra.run.dir={tmp_path / 'afile' / 'x'}", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr == (f"hookrun: error: cannot make the run folder {str(tmp_path / 'afile' / 'x')!r} (Not a "
                           f"directory): give hydra.run.dir (a sweep: hydra.sweep.dir) a folder that can be written, "
                           f"e.g. hydra.run.dir=outputs/run1\n")
    with h5py.File(tmp_path / "r.h5", "w") as f:
        f.attrs["format_version"] = "1"
        f.create_dataset("samples/index", data=np.arange(3))
    plot = warm_python.run_module("hookrun.plot", [str(tmp_path / "r.h5"), "--out", str(tmp_path / "afile" / "figs")],
                                  cwd=tmp_path, env=dict(os.environ), timeout=300)
    assert plot.returncode == 2 and "Traceback" not in plot.stderr, plot.stderr
    assert plot.stderr.strip().endswith("--out: cannot create the folder "
                                        f"{str(tmp_path / 'afile' / 'figs')!r} (Not a directory); name a writable one")


def test_a_malformed_experiment_file_is_one_line(tmp_path):
    (tmp_path / "extra" / "experiment").mkdir(parents=True)
    (tmp_path / "extra" / "experiment" / "broken.yaml").write_text("# @package _global_\nhooks:\n  a: {at: fc\n  b: [\n")
    proc = run_cli(f"hydra.searchpath=[file://{tmp_path / 'extra'}]", "experiment=broken", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"hookrun: error: malformed YAML in {tmp_path / 'extra/experiment/broken.yaml'}, "
                                   f"line 4, column 4: expected ',' or '}}', but got ':'")


def test_the_last_lines_name_the_file_and_the_sweep_folder(tmp_path):
    one = run_cli("experiment=resnet_layer1", "data.limit=1", "progress=false", cwd=tmp_path)
    assert_ok(one)
    (path,) = h5_files(tmp_path / "outputs")
    assert one.stdout.strip().splitlines()[-1].endswith(f"file: {path}")
    sweep = run_cli("-m", "experiment=resnet_layer1", "seed=0,1", "data.limit=1", "progress=false", cwd=tmp_path)
    assert_ok(sweep)
    (folder,) = (tmp_path / "outputs" / "multirun").glob("*/*")
    last = sweep.stdout.strip().splitlines()[-1]
    assert last.startswith(f"hookrun: sweep folder: {folder.relative_to(tmp_path)} (2 jobs")


def test_wheel_ships_conf_and_runs_from_an_installed_layout(tmp_path, wheel_site):
    import subprocess

    names, site = wheel_site
    for conf in ("hookrun/conf/config.yaml", "hookrun/conf/model/resnet18.yaml", "hookrun/conf/experiment/resnet_layer1.yaml",
                 "hookrun/conf/data/synthetic.yaml", "hookrun/conf/loss/cross_entropy.yaml"):
        assert conf in names
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = subprocess.run([sys.executable, "-c", "import hookrun.cli.app as c; print(c.__file__); print(c.conf_dir())"],
                           cwd=work, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert probe[0].startswith(str(site)) and probe[1] == str(site / "hookrun" / "conf")
    proc = subprocess.run([sys.executable, "-m", "hookrun", "experiment=resnet_layer1", "data.limit=1", "progress=false"],
                          cwd=work, env=env, capture_output=True, text=True)
    assert_ok(proc)
    assert len(h5_files(work / "outputs")) == 1


def test_intervention_commands_as_written(tmp_path):
    """Issue 3's commands, exactly as a user types them, in one fresh folder, each with one batch of 4
    images appended (the commands' parsing and effects are what is checked, not the data's size)."""
    commands = [
        ["hooks={z: {at: layer3, type: forward, actions: [{name: modify_output, op: scale, factor: 0.0}, record]}}"],
        ["-m", "experiment=ablate_layer3", "params.factor=0,0.5,1"],
        ["hooks={x: {at: layer1.0.conv1, type: forward_pre, actions: [{name: replace_input, op: noise, std: 0.1, seed: 0}]}}"],
        ["mode=grad", "loss=cross_entropy", "hooks={g: {at: layer2, type: backward, actions: [{name: modify_grad, op: scale, factor: 0.0}]}}"],
        ["experiment=clean_reference"],
        ["hooks={p: {at: layer2, type: forward, actions: [{name: modify_output, op: patch, source: outputs/clean/captures.h5}]}}"],
        ["hooks={c: {at: layer1, type: forward, actions: [{name: modify_output, op: {_target_: my_pkg.steer, _partial_: true}}]}}"],
        ["experiment=patch_layer2", "hydra.run.dir=outputs/patched"],
    ]
    for args in commands:
        assert_ok(run_cli(*args, "data.batch_size=4", "data.limit=1", cwd=tmp_path, env=ENV))
    for path in h5_files(tmp_path / "outputs"):
        with h5py.File(path) as f:
            assert f.attrs["status"] == "complete", path
    sweep = sorted((tmp_path / "outputs" / "multirun").rglob("captures.h5"))
    assert len(sweep) == 3
    logits = [h5py.File(p)["captures/logits/fc/output"][:] for p in sweep]
    assert np.ptp(logits[0], axis=0).max() < 1e-6  # factor 0: layer3 carries nothing, every sample alike
    assert not np.allclose(logits[1], logits[2])
    with h5py.File(tmp_path / "outputs/clean/captures.h5") as a, h5py.File(tmp_path / "outputs/patched/captures.h5") as b:
        np.testing.assert_array_equal(a["captures/logits/fc/output"][:], b["captures/logits/fc/output"][:])


def test_a_run_started_in_the_same_second_as_the_last_gets_its_own_folder(tmp_path):
    """outputs/DATE/TIME has a second's resolution: two commands one after the other within a second
    shared it, and the second was refused ('output.path ... exists'). Every second the next one could
    start in already holds an earlier run's file here; the run takes TIME-2 and leaves them alone."""
    now = dt.datetime.now()
    earlier = [tmp_path / "outputs" / (now + dt.timedelta(seconds=s)).strftime("%Y-%m-%d/%H-%M-%S") for s in range(-1, 60)]
    for folder in earlier:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "captures.h5").write_bytes(b"an earlier run")
    assert_ok(run_cli("data.batch_size=2", "data.limit=1", cwd=tmp_path, env=ENV))
    (path,) = [p for p in h5_files(tmp_path / "outputs") if p.read_bytes()[:8] != b"an earli"]
    assert path.parent.name.endswith("-2") and path.parent.with_name(path.parent.name[:-2]) in earlier
    with h5py.File(path) as f:
        assert f.attrs["status"] == "complete"
    assert all((folder / "captures.h5").read_bytes() == b"an earlier run" for folder in earlier)


def test_free_start_counts_past_every_taken_name(tmp_path, monkeypatch):
    from hookrun.output import process

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return dt.datetime(2026, 12, 2, 10, 0, 0)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(process.dt, "datetime", Frozen)
    assert process.free_start() == process.free_start(sweep=True) == "2026-12-02/10-00-00"
    for name in ["10-00-00", "10-00-00-2", "10-00-00-3"]:
        (tmp_path / "outputs/multirun/2026-12-02" / name).mkdir(parents=True)
    assert (process.free_start(), process.free_start(sweep=True)) == ("2026-12-02/10-00-00", "2026-12-02/10-00-00-4")


def test_free_start_claims_its_folder_so_two_commands_side_by_side_take_two(tmp_path, monkeypatch):
    """Two commands started in the same second, side by side: each checked the name before either's
    Hydra made the folder, so both took 10-00-00 and the second was refused. Claimed (os.mkdir), the
    second takes -2; release_start removes a claimed folder the run left empty, and the date folders
    above it while empty, and keeps one the run wrote to."""
    from hookrun.output import process

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return dt.datetime(2026, 12, 3, 10, 0, 0)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(process.dt, "datetime", Frozen)
    monkeypatch.delenv("HOOKRUN_STARTED", raising=False)
    first, second = process.free_start(claim=True), process.free_start(claim=True)
    assert (first, second) == ("2026-12-03/10-00-00", "2026-12-03/10-00-00-2")
    assert (tmp_path / "outputs" / first).is_dir() and (tmp_path / "outputs" / second).is_dir()
    (tmp_path / "outputs" / first / "captures.h5").write_bytes(b"a run")
    for started in (second, first):
        monkeypatch.setenv("HOOKRUN_STARTED", started)
        process.release_start(sweep=False, claimed=True)
        assert "HOOKRUN_STARTED" not in os.environ
    assert sorted(p.name for p in (tmp_path / "outputs" / "2026-12-03").iterdir()) == ["10-00-00"]
    (tmp_path / "outputs" / first / "captures.h5").unlink()
    monkeypatch.setenv("HOOKRUN_STARTED", first)
    process.release_start(sweep=False, claimed=True)
    assert list(tmp_path.iterdir()) == []  # (the date folder and outputs/, empty, went with it)


def test_wrong_shape_replacement_exits_cleanly(tmp_path):
    proc = run_cli("data.limit=1", "hooks={c: {at: layer1, type: forward, actions: [{name: modify_output, op: {_target_: toy_models.wrong_shape, _partial_: true}}]}}",
                   cwd=tmp_path, env=ENV)
    assert proc.returncode == 1
    assert "hooks.c.actions.0: op toy_models.wrong_shape returned shape (16, 1, 56, 56)" in proc.stderr
    assert "Traceback" not in proc.stderr
    (path,) = h5_files(tmp_path)
    with h5py.File(path) as f:
        assert f.attrs["status"] == "failed"


def test_own_actions_by_name_and_by_target(tmp_path):
    by_name = run_cli("imports=[my_pkg]", "data.limit=1", "hooks={n: {at: layer1, type: forward, actions: [log_norm]}}", cwd=tmp_path, env=ENV)
    assert_ok(by_name)
    assert "n layer1 step 0 output norm" in by_name.stdout
    by_target = run_cli("data.limit=1", "hooks={n: {at: layer1, type: forward, actions: [{_target_: my_pkg.print_shapes, _partial_: true}]}}",
                        cwd=tmp_path, env=ENV)
    assert_ok(by_target)
    assert "n layer1 {'input': (16, 64, 56, 56), 'output': (16, 64, 56, 56)}" in by_target.stdout


def test_a_mode_set_by_an_override_or_a_config_still_sweeps(tmp_path):
    """hookrun skips Hydra's first compose (it only reads hydra.mode) where nothing can set the mode
    (issue 41 item 18); an override or a config folder that sets it still starts a sweep."""
    from hookrun.cli.app import conf_dir, mode_is_the_command_lines

    assert mode_is_the_command_lines(["experiment=resnet_layer1", "seed=0,1"], conf_dir())
    assert not mode_is_the_command_lines(["hydra.mode=MULTIRUN"], conf_dir())
    extra = tmp_path / "conf" / "experiment"
    extra.mkdir(parents=True)
    (extra / "swept.yaml").write_text("# @package _global_\ndefaults:\n  - resnet_layer1\nhydra:\n  mode: MULTIRUN\n"
                                      "  sweeper:\n    params:\n      seed: 0,1\n")
    assert not mode_is_the_command_lines([f"--config-dir={tmp_path / 'conf'}"], conf_dir())
    assert_ok(run_cli(f"--config-dir={tmp_path / 'conf'}", "experiment=swept", "data.limit=1", "progress=false", cwd=tmp_path))
    assert [p.parent.name for p in h5_files(tmp_path / "outputs" / "multirun")] == ["0", "1"]


def test_a_command_run_as_the_process_freezes_the_heap_only_after_its_work(tmp_path):
    """`python -m hookrun...` and the `hookrun` script run their command through exit_process: the
    heap is frozen once the command has returned, so the interpreter's last collection skips torch's
    objects (0.75 s of every process, issue 41 item 18); its exit code and atexit handlers stay."""
    import subprocess
    from importlib.metadata import entry_points

    probe = ("import atexit, gc\nfrom hookrun.cli import exit_process\n"
             "atexit.register(lambda: print('at exit', gc.get_freeze_count() > 0, flush=True))\n"
             "def main():\n    print('during', gc.get_freeze_count() > 0, flush=True)\n    return 3\n"
             "exit_process(main)\n")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout.split("\n")[:2], proc.stderr) == (3, ["during False", "at exit True"], "")
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "hookrun"]
    assert script.value == "hookrun.cli.app:process"
    assert "process()" in (ROOT / "hookrun" / "__main__.py").read_text()
