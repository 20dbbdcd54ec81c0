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
import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from hookrun.config import HookrunConfig
from hookrun.errors import HookrunError
from hookrun.runner import run

log = logging.getLogger("hookrun")


def conf_dir() -> str:
    """conf/ ships inside the wheel as hookrun/conf; in a checkout it sits beside hookrun/."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return str(candidate)
    raise FileNotFoundError(f"hookrun's conf/ folder is missing (looked in {here / 'conf'} and {here.parent / 'conf'})")


ConfigStore.instance().store(name="hookrun_schema", node=HookrunConfig)


@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="config")
def _app(cfg: DictConfig) -> None:
    path = Path(cfg.output.path)
    if not path.is_absolute():
        with open_dict(cfg):
            cfg.output.path = str(Path(HydraConfig.get().runtime.output_dir) / path)
    try:
        run(cfg)
    except HookrunError as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        log.error("%s", exc)
        print(f"hookrun: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("hookrun: interrupted", file=sys.stderr)
        sys.exit(130)


def main() -> None:
    _app()


if __name__ == "__main__":
    main()
