"""The command line: `python -m hookrun [overrides]` (also the `hookrun` console script).

    python -m hookrun experiment=resnet_layer1
    python -m hookrun -m experiment=resnet_layer1 seed=0,1,2

Hydra composes the config; this module puts the output file in the run folder, calls run(), and
turns a HookrunError, or an error of Hydra's composition (app_errors.py and hydra_errors.py, loaded
then), into one line `hookrun: error: ...` on stderr and a non-zero exit (HYDRA_FULL_ERROR=1 shows
the traceback instead). The last log line names the file; a multirun ends by naming its sweep folder.

Hydra 1.3 composes the whole config twice for every command: `Hydra.get_mode` composes it only to
read `hydra.mode` (a config may set `hydra: {mode: MULTIRUN}` to sweep without `-m`), then the run
composes it again. That first compose is about 0.2 s of every run's start (cProfile of
`python -m hookrun experiment=resnet_layer1`; benchmarks/process_pair.py times the whole process).

    with skip_mode_compose(sys.argv[1:], conf_dir()):
        app()

The compose is skipped, and the mode left to the command line (`-m` or not, as Hydra does when a
config sets no mode), only where nothing can set `hydra.mode`: no argument names it or adds a config
folder (`--config-dir`, `--config-path`, `--config-name`, `hydra.searchpath`, `hydra.mode`), and
no YAML file in hookrun's config folder sets `mode: RUN` or `mode: MULTIRUN` or a search path.
Anywhere else Hydra's own get_mode runs, unchanged.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hookrun.cli import ends_quietly, exit_process, note_late_signals
from hookrun.cli.around_hydra import (
    RunRecord,
    block_names,
    held_saves,
    hydra_slots,
    missing_block,
    remove_empty,
    renamed,
    shell_damage,
    with_late_blocks,
)
from hookrun.config import CONF_PLACES, added_by_key, conf_folder, load
from hookrun.config.schema import HookrunConfig, hydra_schema, replaced
from hookrun.errors import ConfigError, HookrunError
from hookrun.output import in_run_folder, on_accepted
from hookrun.output.process import Interrupted, detect, release_start, share_start
from hookrun.runner import run

log = logging.getLogger("hookrun")
QUIET = ("botocore", "aiobotocore", "boto3", "s3transfer", "s3fs", "fsspec", "urllib3", "filelock", "httpx")  # their INFO crowds the log


def conf_dir() -> str:
    """conf/ ships inside the wheel as hookrun/conf; in a checkout it sits beside hookrun/."""
    if (found := conf_folder()) is None:
        raise FileNotFoundError(f"hookrun's conf/ folder is missing (looked in {' and '.join(map(str, CONF_PLACES))})")
    return str(found)


SCHEMA = hydra_slots(hydra_schema())  # every kind's null block typed Any: the command line can add one (around_hydra.py)
ConfigStore.instance().store(name="hookrun_schema", node=SCHEMA)


@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="config")
def _app(cfg: DictConfig) -> None:
    global _TASK_STARTED
    _TASK_STARTED = True
    for name in QUIET:  # Hydra's job logging sets the root to INFO; these keep to warnings
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(logging.WARNING)
    folder = Path(HydraConfig.get().runtime.output_dir)
    record = RunRecord.take(folder)  # Hydra's .hydra/ and log: written only once the run is accepted
    try:
        _task(cfg, folder, record)
    finally:
        if not record.written:  # refused, or a dry run: the run folder stays as it was
            record.discard()
            remove_empty(folder)


def _task(cfg: DictConfig, folder: Path, record: RunRecord) -> None:
    if not isinstance(cfg.get("output"), DictConfig):  # (~output: the task cannot read where to write)
        _fail(ConfigError("~output removed the output block every run needs; leave it, and change its keys instead "
                          "(output.path=FILE, ...)"))
    raw = str(OmegaConf.to_container(cfg.output)["path"])  # (raw: interpolations kept)
    try:
        path = Path(cfg.output.path).expanduser()
    except OmegaConfBaseException as exc:  # (Hydra's "Error executing job" line, then OmegaConf's, naming no key)
        _fail(ConfigError(f"output.path={raw}: {str(exc).splitlines()[0]}"))
    if HydraConfig.get().mode == RunMode.MULTIRUN and "${" not in raw:  # (sweep_checks: a multirun's, off the route)
        from hookrun.cli.sweep_checks import shared_output

        if (line := shared_output(raw, path, folder)) is not None:
            _fail(HookrunError(line))
    try:
        typed = load(cfg)  # the config's one conversion: Hydra's node into the HookrunConfig every step reads
        # a relative file, or an object store's staged parts: in the run folder
        path, staging = in_run_folder(typed.output.path, typed.output.staging, folder)
        typed = replaced(typed, output=dataclasses.replace(typed.output, path=path, staging=staging))
        with on_accepted(record.write):
            result = run(typed)
        if HydraConfig.get().mode == RunMode.RUN:  # its file is closed: a signal from here keeps the exit code
            note_late_signals()
        if not typed.dry_run:
            log.info("file: %s%s", result.path, f" · {result.note}" if result.note else "")
    except HookrunError as exc:
        if HydraConfig.get().mode == RunMode.MULTIRUN and not isinstance(exc, Interrupted):
            from hookrun.cli.sweep_checks import keep_refusal

            keep_refusal(record, str(exc))  # (its file not opened: the sweep's readers name it refused, with this line)
        if FULL_ERROR:
            raise
        _fail(exc)
    except KeyboardInterrupt:
        print("hookrun: interrupted by SIGINT (outside the run's batches: any file keeps the status it had)", file=sys.stderr)
        sys.exit(130)


MULTIRUN = {"-m", "--multirun"}
HELP = {"-h", "--help"}
DRY_RUN = re.compile(r"^\+?dry_run=(true|True|yes|1)$")
# the user asked for tracebacks: HYDRA_FULL_ERROR=1, or --verbose (taken off the command line in main())
FULL_ERROR = os.environ.get("HYDRA_FULL_ERROR") == "1" or os.environ.get("HOOKRUN_VERBOSE") == "1"
_TASK_STARTED = False  # before the first job starts, every exception is Hydra's reading of the config


class SweepFolder(Callback):
    """Hydra callback (conf/config.yaml, hydra.callbacks): a multirun's jobs are checked before the first starts
    (sweep_checks.py); it ends by naming its folder and jobs (multirun.yaml's)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: object) -> None:
        from hookrun.cli.sweep_checks import check_jobs
        check_jobs(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: object) -> None:
        from hookrun.analysis.sweep import ran_jobs
        folder = Path(OmegaConf.select(config, "hydra.sweep.dir", default="."))
        print("hookrun: a dry run of a sweep: each job's plan is above; nothing was written" if OmegaConf.select(
            config, "dry_run") else f"hookrun: sweep folder: {folder} ({ran_jobs(folder)} jobs; python -m hookrun.inspect {folder})", flush=True)


def compose_groups(overrides: list[str]) -> DictConfig:
    """These overrides' group choices alone (a sweep's first choice), on the user's search path too
    (search_path.py, off the main route: a block's key was set, or Hydra's error wants the config's keys)."""
    from hookrun.cli.search_path import compose_groups

    return compose_groups(overrides, conf_dir(), SCHEMA, block_names(SCHEMA, HookrunConfig))


def forced_block_keys(args: list[str]) -> list[str]:
    """`my_kind.key=2` where the config has the block (missing_block said so): `++my_kind.key=2`.
    A block's slot is untyped (around_hydra.py), so a key its YAML does not list would be refused by
    Hydra's struct mode; `load()` types the block and refuses a key it does not have, in one line."""
    blocks = set(block_names(SCHEMA, HookrunConfig))
    return [f"++{a}" if not a.startswith(("+", "-")) and "=" in a and "." in a.partition("=")[0]
            and a.partition(".")[0] in blocks else a for a in args]


def missing_block_line(overrides: list[str]) -> str | None:
    """`my_kind.method=x` where the config has no my_kind block: one line saying how to add it
    (a sweep over group options: Hydra composes the sweep's config without them first)."""
    swept = [o for o in overrides if "," in o.partition("=")[2] and Path(conf_dir(), o.partition("=")[0].lstrip("+")).is_dir()]
    rest = [o for o in overrides if o not in swept]
    return missing_block(overrides, block_names(SCHEMA, HookrunConfig), lambda: compose_groups(rest), conf_dir(), swept,
                         added_by_key)


def _fail(exc: HookrunError, shown: bool = False) -> NoReturn:
    """One line on stderr (and in the run's log), the exit status, no traceback (`shown`: printed already;
    app_errors.py's, loaded only where a run is refused or fails)."""
    from hookrun.cli.app_errors import give_up

    give_up(exc, FULL_ERROR and not shown)


SETS_MODE = re.compile(r"^\s*(hydra\.)?mode:\s*['\"]?(MULTIRUN|RUN)\b|searchpath", re.MULTILINE)
ARGS = ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn", "hydra.mode", "+hydra.mode",
        "++hydra.mode", "hydra.searchpath", "+hydra.searchpath", "++hydra.searchpath")


def mode_is_the_command_lines(args: list[str], conf: str | Path) -> bool:
    """Whether no argument and no config file of `conf` can set hydra.mode."""
    if any(a.split("=", 1)[0] in ARGS for a in args):
        return False
    return not any(SETS_MODE.search(p.read_text(errors="replace")) for p in Path(conf).rglob("*.yaml"))


@contextmanager
def skip_mode_compose(args: list[str], conf: str | Path) -> Iterator[bool]:
    """Within: Hydra's get_mode answers None (the command line decides) where no config can set the mode."""
    from hydra._internal.hydra import Hydra

    skip = mode_is_the_command_lines(args, conf)
    original = Hydra.get_mode
    if skip:
        Hydra.get_mode = lambda self, config_name, overrides: None
    try:
        yield skip
    finally:
        Hydra.get_mode = original


@ends_quietly
def main() -> None:
    global FULL_ERROR
    if "--verbose" in sys.argv:  # hookrun's own flag: Hydra would not know it
        sys.argv.remove("--verbose")
        os.environ["HOOKRUN_VERBOSE"] = "1"  # launcher workers inherit it
        FULL_ERROR = True
    args = sys.argv[1:]
    if "--version" in args:  # hookrun's version, not Hydra's
        from hookrun.cli.usage import version

        print(version())
        sys.exit(0)
    if HELP & set(args):  # hookrun's own help; Hydra's groups and config follow (hydra.help in conf/config.yaml)
        from hookrun.cli.usage import usage

        print(usage(conf_dir()), flush=True)
    for note in renamed([a for a in args if not a.startswith("-")], conf_dir()):
        print(f"hookrun: note: {note}", file=sys.stderr, flush=True)
    try:  # (a block's key asks its kind whether a key adds it: a plugin that fails to load is one line)
        damage = shell_damage(args) or missing_block_line([a for a in args if not a.startswith("-")])
        if damage:
            raise ConfigError(damage)
        sys.argv[1:] = forced_block_keys(sys.argv[1:])
        if MULTIRUN & set(args):
            from hookrun.cli.sweep_folder import check_sweep_folder

            check_sweep_folder(sys.argv[1:])
        ranks = detect()
        sweep = bool(MULTIRUN & set(args))
        claim = not ranks.many and not any(a.startswith(f"hydra.{'sweep' if sweep else 'run'}.dir=") for a in args)  # (ranks: rank 0's)
        started_here = share_start(ranks, sweep, claim)  # the default run folder's DATE/TIME (claimed: made now)
    except HookrunError as exc:
        _fail(exc)
    if any(arg.startswith("hydra/launcher=") for arg in args) and not MULTIRUN & set(args):
        sys.argv.insert(1, "--multirun")  # Hydra ignores a launcher outside a multirun, silently
    if any(DRY_RUN.match(arg) for arg in args):
        # a dry run writes nothing: no .hydra/ folder, no log file (the empty run folder is removed)
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=stdout"]
    overrides = [a for a in args if not a.startswith("-")]
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises its errors to us instead of printing them
    try:
        with skip_mode_compose(args, conf_dir()), held_saves():
            with_late_blocks(_app, SCHEMA)
    except Exception as exc:
        from hookrun.cli.app_errors import failed  # (loaded only here)

        failed(exc, overrides, compose_groups, conf_dir(), _TASK_STARTED, FULL_ERROR)
        raise  # neither hookrun's error nor Hydra's: a bug, with its traceback
    finally:
        if not FULL_ERROR:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        if started_here:  # the next run of this process (a notebook's, a test's) picks its own folder
            release_start(sweep, claim)


def process() -> None:
    """`python -m hookrun` and the `hookrun` script: main() as the whole process (command.exit_process)."""
    exit_process(main)


if __name__ == "__main__":
    process()
