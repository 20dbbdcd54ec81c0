"""`hookrun.compose(*overrides)`: the config the CLI would run, for `hookrun.run` in Python.

    cfg = hookrun.compose("experiment=resnet_layer1", "data.batch_size=4")
    hookrun.run(cfg)                      # the same run as: python -m hookrun experiment=resnet_layer1 data.batch_size=4

Hydra's compose API on hookrun's own conf/ (version_base 1.3), with the CLI's one rule applied on
top: a relative output.path lands in the run folder the CLI would make (hydra.run.dir, by
default outputs/DATE/TIME/, TIME-2 where a run started in the same second). Hydra's errors are one ConfigError line, as on
the command line.

A relative output.path: the command line and compose put it in the run folder; a dict written by
hand and given to hookrun.run has no run folder, so its relative path is from the working folder
(docs/config.md, "Where a relative output.path lands"). To write a fixed place with compose, name
the folder, or give an absolute path:

    hookrun.run(hookrun.compose("experiment=resnet_layer1", "hydra.run.dir=outputs/layer1"))   # outputs/layer1/captures.h5
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf, open_dict

from hookrun.cli import app
from hookrun.cli.around_hydra import renamed, with_late_blocks
from hookrun.errors import ConfigError
from hookrun.output.process import free_start


def compose(*overrides: str) -> dict[str, Any]:
    """The config `python -m hookrun OVERRIDES` would run, as a plain dict.

    Args:
        *overrides: command-line overrides, one per argument ("experiment=resnet_layer1",
            "data.batch_size=4", "+hooks.x={at: fc, type: forward}").

    Returns:
        A dict with every group resolved and a relative `output.path` made the run folder's
        (`hydra.run.dir`: outputs/DATE/TIME/ unless given, as on the command line; a dict given
        to `hookrun.run` by hand keeps its relative path from the working folder), which
        `hookrun.run` takes as it is (and which may be edited first).

    Raises:
        hookrun.errors.ConfigError: an unknown group option, key or malformed override, with the
            closest valid names.
    """
    started_here = "HOOKRUN_STARTED" not in os.environ  # (set: a rank's, shared with the others)
    if started_here:  # outputs/DATE/TIME-2 where an earlier run started in the same second
        os.environ["HOOKRUN_STARTED"] = free_start()
    try:
        cfg = compose_config(list(overrides), hydra=True)
        run_dir = Path(OmegaConf.select(cfg, "hydra.run.dir"))
    finally:
        if started_here:
            os.environ.pop("HOOKRUN_STARTED", None)
    with open_dict(cfg):
        del cfg["hydra"]  # the launcher's settings: not part of what run() takes
    plain = OmegaConf.to_container(cfg, resolve=True)
    out = Path(plain["output"]["path"])
    if not out.is_absolute():
        plain["output"]["path"] = str(run_dir / out)
    return plain


def compose_config(overrides: list[str], hydra: bool = False) -> DictConfig:
    """The config `python -m hookrun OVERRIDES` would run, composed without running it (the module
    lister and hookrun.compose use it; `hydra`: with the hydra node, for hydra.run.dir); Hydra's
    errors come out as a ConfigError in hookrun's one-line form."""
    line = app.missing_block_line(overrides)
    if line is not None:
        raise ConfigError(line)
    for note in renamed(overrides, app.conf_dir()):
        warnings.warn(note, UserWarning, stacklevel=3)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=app.conf_dir(), version_base="1.3", job_name="hookrun"):
            return with_late_blocks(lambda: hydra_compose("config", overrides=app.forced_block_keys(overrides),
                                                          return_hydra_config=hydra), app.SCHEMA)
    except Exception as exc:
        from hookrun.cli.hydra_errors import composition_line  # (loaded only here)

        line = composition_line(exc, overrides, app.compose_groups, app.conf_dir())
        if line is None or app.FULL_ERROR:
            raise
        raise ConfigError(line) from None
    finally:
        GlobalHydra.instance().clear()
