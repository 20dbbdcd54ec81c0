"""What the user asked: the config schema, the hook specs, and loading a config onto the schema;
and build.py, which turns the config's `_target_` nodes into objects (the one module that calls
hydra.utils.instantiate; it is not imported here). It imports only hookrun.errors."""

from hookrun.config.schema import HookrunConfig, load, to_yaml
from hookrun.config.specs import ActionSpec, HookSpec, parse_hooks

__all__ = ["ActionSpec", "HookSpec", "HookrunConfig", "load", "parse_hooks", "to_yaml"]
