"""The shipped config (conf/) composed with overrides, as the command line composes it, without a run.

    cfg = composed("experiment=sae_cache", "device=cpu")   # an omegaconf DictConfig
    hookrun.run(cfg)
"""

from __future__ import annotations

from omegaconf import DictConfig


def composed(*overrides: str) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from hookrun.cli.app import conf_dir

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
            return compose("config", overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()
