"""What the user asked: the config schema, the hook specs, and loading a config onto the schema.
Nothing here builds a model or touches a file; it imports only hookrun.errors."""

from hookrun.config.schema import HookrunConfig, load, to_yaml
from hookrun.config.specs import ActionSpec, HookSpec, parse_hooks

__all__ = ["ActionSpec", "HookSpec", "HookrunConfig", "load", "parse_hooks", "to_yaml"]
