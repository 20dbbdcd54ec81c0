"""What the user asked: the config schema, the hook specs, and loading a config onto the schema;
and build.py, which turns the config's `_target_` nodes into objects (the one module that calls
hydra.utils.instantiate; it is not imported here). It imports only hookrun.errors. `conf_folder()`:
where hookrun's conf/ is (hookrun/conf in a wheel, conf/ beside hookrun/ in a checkout)."""

from pathlib import Path

from hookrun.config.schema import HookrunConfig, load, to_yaml
from hookrun.config.specs import ActionSpec, HookSpec, parse_hooks

__all__ = ["ActionSpec", "HookSpec", "HookrunConfig", "conf_folder", "load", "parse_hooks", "to_yaml"]

_HOOKRUN = Path(__file__).resolve().parents[1]
CONF_PLACES = (_HOOKRUN / "conf", _HOOKRUN.parent / "conf")  # (a wheel's, a checkout's)
SWEPT = "HOOKRUN_SWEPT"  # the environment variable naming the keys a -m sweep varies, in its jobs (cli/sweep_checks.py)


def conf_folder() -> Path | None:
    """hookrun's conf/ (the first of CONF_PLACES holding config.yaml); None where neither does."""
    return next((c for c in CONF_PLACES if (c / "config.yaml").is_file()), None)
