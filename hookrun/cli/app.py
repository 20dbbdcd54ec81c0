"""The command line: `python -m hookrun [overrides]` (also the `hookrun` console script).

    python -m hookrun experiment=resnet_layer1
    python -m hookrun -m experiment=resnet_layer1 seed=0,1,2

Hydra composes the config; this module puts the output file in the run folder, calls run(), and
turns a HookrunError into one line on stderr and a non-zero exit (HYDRA_FULL_ERROR=1 shows the
traceback instead).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, open_dict

from hookrun.config.schema import HookrunConfig
from hookrun.errors import HookrunError
from hookrun.runner.ranks import agree_on_start, detect
from hookrun.runner.run import run
from hookrun.runner.signals import Interrupted

log = logging.getLogger("hookrun")


def conf_dir() -> str:
    """conf/ ships inside the wheel as hookrun/conf; in a checkout it sits beside hookrun/."""
    here = Path(__file__).resolve().parents[1]  # hookrun/
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return str(candidate)
    raise FileNotFoundError(f"hookrun's conf/ folder is missing (looked in {here / 'conf'} and {here.parent / 'conf'})")


ConfigStore.instance().store(name="hookrun_schema", node=HookrunConfig)


@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="config")
def _app(cfg: DictConfig) -> None:
    path = Path(cfg.output.path)
    hydra_cfg = HydraConfig.get()
    if path.is_absolute() and hydra_cfg.mode == RunMode.MULTIRUN:
        _fail(HookrunError(f"output.path={path} is absolute: every job of a multirun would write the same file; "
                           f"give a relative path (each job has its own folder) or one with ${{hydra.job.num}} in it"))
    if not path.is_absolute():
        with open_dict(cfg):
            cfg.output.path = str(Path(HydraConfig.get().runtime.output_dir) / path)
    try:
        run(cfg)
        if cfg.dry_run:
            _remove_empty(Path(HydraConfig.get().runtime.output_dir))
    except HookrunError as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        _fail(exc)
    except KeyboardInterrupt:
        print("hookrun: interrupted (the file is marked 'interrupted'; resume=true goes on from it)", file=sys.stderr)
        sys.exit(130)


MULTIRUN = {"-m", "--multirun"}
DRY_RUN = re.compile(r"^\+?dry_run=(true|True|yes|1)$")


def _fail(exc: HookrunError) -> None:
    """One line on stderr (and in the run's log), the exit status, no traceback."""
    if getattr(exc, "every_rank", False) and detect().rank != 0:
        sys.exit(exc.exit_code)  # every rank found the same; rank 0 says it
    word = "" if isinstance(exc, Interrupted) else "error: "
    _log_to_file(f"{word}{exc}")
    print(f"hookrun: {word}{exc}", file=sys.stderr)
    sys.exit(exc.exit_code)


def _log_to_file(message: str) -> None:
    """Keep the error in the run's log file without printing it a second time on the terminal
    (Hydra's job logging sends records to the console as well as to the file)."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, "%s", (message,), None)
    for handler in logging.getLogger().handlers + log.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _remove_empty(folder: Path) -> None:
    """Remove the run folder Hydra made for a dry run, and its parents while they are empty."""
    try:
        while folder != folder.parent and not any(folder.iterdir()) and folder.resolve() != Path.cwd().resolve():
            folder.rmdir()
            folder = folder.parent
    except OSError:
        pass


def main() -> None:
    try:
        ranks = detect()
        if ranks.launcher == "torchrun" and ranks.many and "HOOKRUN_STARTED" not in os.environ:
            # every rank in rank 0's run folder outputs/DATE/TIME, even when they start seconds apart
            os.environ["HOOKRUN_STARTED"] = agree_on_start(ranks)
    except HookrunError as exc:
        _fail(exc)
    if any(arg.startswith("hydra/launcher=") for arg in sys.argv[1:]) and not MULTIRUN & set(sys.argv[1:]):
        sys.argv.insert(1, "--multirun")  # Hydra ignores a launcher outside a multirun, silently
    if any(DRY_RUN.match(arg) for arg in sys.argv[1:]):
        # a dry run writes nothing: no .hydra/ folder, no log file (the empty run folder is removed)
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=stdout"]
    _app()


if __name__ == "__main__":
    main()
