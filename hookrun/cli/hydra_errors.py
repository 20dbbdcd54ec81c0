"""Hydra's composition errors as hookrun's one-line error (loaded only where one happens; what the
shell did to an override is read before Hydra, in around_hydra.py).

    message = one_line(exc, overrides, keys)    # "data.batchsize=8: ... did you mean data.batch_size?"

Hydra reports a bad override or a missing config option with several lines of its own (and
suggests `+key=value`, which a key of hookrun's schema then refuses); the CLI prints what these
functions return as `hookrun: error: ...` and exits with 2.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from hydra.errors import (
    ConfigCompositionException,
    HydraException,
    MissingConfigException,
    OverrideParseException,
)
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hookrun.cli.override_faults import QUOTE
from hookrun.error_words import typed_line
from hookrun.errors import ConfigError, close_matches

# nodes whose keys are free (a constructor's arguments, a hook map): a new key there takes `+`
FREE_NODES = ("model", "data.dataset", "loss", "hooks", "params")
def one_line(exc: BaseException, overrides: list[str], known_keys: Callable[[], list[str]],
             group_options: Callable[[str], list[str]]) -> str | None:
    """hookrun's one line for an error of Hydra's composition, or None for any other exception.
    `known_keys()` lists the dotted keys of the config; `group_options(group)` a group's options."""
    if isinstance(exc, yaml.YAMLError):
        return _yaml_message(exc)
    if isinstance(exc, OverrideParseException):
        key, eq, value = str(exc.override or "").partition("=")
        plain = eq and value and value[0] not in "{[('\"" and '"' not in value  # a value with a character Hydra reserves (~ , ...)
        hint = f"give the value Hydra's own quotes inside the shell's: '{key}=\"{value}\"'" if plain else QUOTE
        return f"cannot parse the override {exc.override!r}: {str(exc).splitlines()[0]}; {hint}"
    if isinstance(exc, MissingConfigException):
        return _missing_message(exc, overrides, group_options)
    if isinstance(exc, ConfigCompositionException):
        cause = exc.__cause__ or exc.__context__  # (a ValidationError of an experiment file is only the context)
        if isinstance(cause, yaml.YAMLError):
            return _yaml_message(cause)
        text = str(exc).strip()
        m = re.match(r"Multiple values for (\S+)\. To override a value use 'override \S+: (\S+)'", text)
        if m:  # (Hydra names the defaults list's syntax; on the command line it is the plain override)
            return (f"+{m.group(1)}={m.group(2)}: the config already chooses a {m.group(1)}; choose another without "
                    f"the +: {m.group(1)}={m.group(2)}")
        m = re.match(r"Could not delete from config\. '([^']+)' does not exist", text)
        if m and m.group(1) in known_keys():  # (a key whose value is null: Hydra cannot delete it)
            return f"~{m.group(1)}: {m.group(1)} is already unset (null); leave it out, or give {m.group(1)}=VALUE"
        m = re.match(r"Could not override '([^']+)'", text)
        if m:
            return _unknown_key_message(m.group(1), overrides, known_keys(), getattr(cause, "full_key", None))
        m = re.match(r"Could not append to config. An item is already at '([^']+)'", text)
        if m:
            key = m.group(1)
            return f"+{key}: the config already has {key}; set it without the +: {_given(key, overrides).lstrip('+')}"
        m = re.match(r"Error merging override (.+)", text)
        first = text.splitlines()[0]
        if m and isinstance(cause, OmegaConfBaseException):
            return _block_given_a_value(m.group(1), getattr(cause, "full_key", None)) \
                or typed_line(m.group(1), str(cause).strip().splitlines()[0])
        if isinstance(cause, OmegaConfBaseException):
            key = getattr(cause, "full_key", None)
            return f"{first.rstrip(': ')}: {f'{key}: ' if key else ''}{str(cause).strip().splitlines()[0]}"
        rest = [line.strip() for line in text.splitlines()[1:] if line.strip()]
        return f"{first.rstrip(': ')}: {rest[0]}" if rest else first
    if isinstance(exc, OmegaConfBaseException | HydraException) and str(exc).strip():
        return str(exc).strip().splitlines()[0]
    if isinstance(exc, ValueError) and str(exc).startswith("Config group override must be a string"):
        return _group_given_no_name(overrides, group_options)
    return None


def composition_line(exc: BaseException, overrides: list[str], compose_groups: Callable[[list[str]], Any],
                     conf: str) -> str | None:
    """one_line for the app: the config's keys are those of `compose_groups(overrides)` (the group
    choices alone, composed only where a key's suggestion is wanted), a group's options the YAML
    files of that folder of `conf`."""
    return one_line(exc, overrides, lambda: dotted_keys(OmegaConf.to_container(compose_groups(overrides), resolve=False)),
                    lambda group: sorted(p.stem for p in Path(conf, group).glob("*.yaml")))



def failure_line(exc: BaseException, overrides: list[str], compose_groups: Callable[[list[str]], Any], conf: str,
                 task_started: bool) -> str | None:
    """The app's one line for an exception out of Hydra's run (composition_line's; before the first job started,
    Hydra's mkdir of the run folder, or any other exception's first line), or None: it keeps its traceback."""
    line = composition_line(exc, overrides, compose_groups, conf)
    if line is None and not task_started and isinstance(exc, OSError) and exc.filename:  # Hydra's mkdir of the run folder
        line = (f"cannot make the run folder {str(exc.filename)!r} ({exc.strerror}): give hydra.run.dir (a sweep: "
                f"hydra.sweep.dir) a folder that can be written, e.g. hydra.run.dir=outputs/run1")
    if line is None and not task_started and str(exc).strip():
        line = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    return line


def late_blocks(compose: Callable[[], Any], schema: type, exc: Exception) -> Any:
    """around_hydra.with_late_blocks once compose() raised `exc`: where Hydra refused a top-level key
    `schema` lacks, compose() again with an untyped slot for it (and for each such key after it); any
    other error is raised as it is."""
    from hydra.core.config_store import ConfigStore
    from omegaconf.errors import ConfigKeyError

    added: list[str] = []
    first: Exception | None = None
    while True:
        cause = exc.__cause__ or exc.__context__ if isinstance(exc, ConfigCompositionException) else None
        key = getattr(cause, "full_key", None) if isinstance(cause, ConfigKeyError) else None
        if not key or "." in key or key in added or f"Key '{key}' not in '{schema.__name__}'" not in str(cause):
            if first is not None and any(k in f"{exc} {cause}" for k in added):  # (a slot let an override of
                ConfigStore.instance().store(name="hookrun_schema", node=schema)  # a misspelt key through:
                raise first from None  # its first error, against the schema, for its did-you-mean line)
            raise exc
        first = first or exc
        added.append(key)
        slots = [(k, Any, dataclasses.field(default=None)) for k in added]
        ConfigStore.instance().store(name="hookrun_schema", node=dataclasses.make_dataclass(schema.__name__, slots, bases=(schema,)))
        try:
            return compose()
        except Exception as again:
            exc = again


def _group_given_no_name(overrides: list[str], group_options: Callable[[str], list[str]]) -> str | None:
    """`data=null`, `model=5`: a config group's override that names no option (Hydra: "Config group
    override must be a string or a list. Got NoneType")."""
    for o in overrides:
        key, _, value = o.partition("=")
        options = group_options(key.lstrip("+~"))
        try:
            named = isinstance(yaml.safe_load(value), str | list)
        except yaml.YAMLError:
            named = True
        if options and not named:
            return (f"{o}: {key.lstrip('+~')} is a config group; name one of its options ({', '.join(options)}), "
                    f"e.g. {key.lstrip('+~')}={options[0]}")
    return None


def _another_dataset(value: str, keys: list[str]) -> str:
    """The overrides that name another data set than the config's (data.dataset is a field of the typed data
    block, which `~data.dataset` cannot delete): its _target_, each key the config's data set has (from the data
    group or an experiment, which data=custom leaves: an experiment's n and length) removed or set, then the
    new keys added."""
    try:
        given = yaml.safe_load(value)
    except yaml.YAMLError:
        given = None
    has = [k.rpartition(".")[2] for k in keys if k.startswith("data.dataset.") and k.count(".") == 2
           and k != "data.dataset._target_"]
    if not isinstance(given, dict) or "_target_" not in given:
        return " ".join(["'data.dataset._target_=PKG.DATASET'", *(f"'~data.dataset.{k}'" for k in has),
                         "'+data.dataset.ARG=VALUE'"])
    flat = {k: f"{'null' if v is None else v if isinstance(v, str | int | float | bool) else yaml.safe_dump(v, default_flow_style=True).strip()}"
            for k, v in given.items()}
    return " ".join([f"'data.dataset._target_={flat['_target_']}'", *(f"'~data.dataset.{k}'" for k in has if k not in given),
                     *(f"'{'' if k in has else '+'}data.dataset.{k}={v}'" for k, v in flat.items() if k != "_target_")])


LISTED = 40  # keys named in an unknown key's line; the rest counted (the top level's all fit)


def _unknown_key_message(key: str, overrides: list[str], keys: list[str], deeper: str | None = None) -> str:
    given = _given(key, overrides)
    value = given.partition("=")[2]
    if f"~{key}" in overrides:
        return f"{given}: ~{key} removed {key}, so set it again with a +: '+{key}={value}'"
    if key in keys and deeper and deeper != key:
        replace = (f"write {_another_dataset(value, keys)}" if key == "data.dataset"  # (a typed block's field: ~ cannot delete it)
                   else f"write '~{key}' '+{key}={value}'")
        return (f"{given}: a mapping given for {key} is merged into the {key} the config already has "
                f"(from an experiment, say), and {deeper} cannot be added that way; to replace {key}, "
                f"{replace}; to add one entry, '+{deeper}=...'")
    parent = key.rpartition(".")[0]
    same_depth = [k for k in keys if k.count(".") == key.count(".")]
    close = close_matches(key, same_depth, n=1)
    free = next((n for n in FREE_NODES if key.startswith(n + ".")), None)
    if free == "hooks" and key.count(".") == 2 and key.rpartition(".")[0] in keys:  # (a hook's keys: the schema's, no +)
        free = None
    while parent and parent not in keys and "." in parent:  # (hooks.0.at: the entries hooks has)
        parent = parent.rpartition(".")[0]
    if parent and parent not in keys:  # (similarty.x: its first name is no key; the top level's close one, and its keys)
        close = close or [f"{c}{key[len(parent):]}" for c in close_matches(parent, [k for k in keys if "." not in k], n=1)]
        parent = ""
    siblings = sorted(k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == parent)
    more = f" and {len(siblings) - LISTED} more" if len(siblings) > LISTED else ""
    listing = (f"{parent or 'the top level'} has: {', '.join(siblings[:LISTED])}{more}" if siblings
               else f"{parent} has no keys" if parent and not free else "")  # (an action's keys are the user's: not listed)
    hints = [(f"did you mean {close[0]}?" + (f" ({listing})" if listing else "")) if close else listing] \
        if listing or close else []
    if free:
        hints.append(f"to add a new key to {free}, write +{given.lstrip('+')}")
    return "; ".join([f"{given}: the config has no key {key!r}", *hints])


def _missing_message(exc: MissingConfigException, overrides: list[str], group_options: Callable[[str], list[str]]) -> str:
    missing = exc.missing_cfg_file or ""
    group, _, option = missing.rpartition("/")
    if not group:
        return str(exc).strip().splitlines()[0]
    options = list(exc.options or []) or group_options(group)
    close = close_matches(option, options, n=3)
    hint = (f"did you mean {' or '.join(close)}? " if close else "") + f"options: {', '.join(sorted(options))}"
    builder = _model_builder(option) if group == "model" else None
    if builder:
        hint += f"; or any model by its builder: model=custom model._target_={builder}"
    return f"{group}={option}: there is no {group} option {option!r} (conf/{group}/{option}.yaml); {hint}"


def _model_builder(name: str) -> str | None:
    """torchvision.models.NAME (or timm's) where a library has a model of that name."""
    try:
        import torchvision

        if name in torchvision.models.list_models():
            return f"torchvision.models.{name}"
    except Exception:  # an old torchvision: no list_models
        pass
    return None


def _yaml_message(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "a config file"
    return f"malformed YAML in {where}: {problem}"


def _block_given_a_value(override: str, key: str | None) -> str | None:
    """`output=5`, `output=null`: the schema's block at `key` given one value: the line that names
    its keys (hookrun.config.schema.mapping_where_nested), else None."""
    from hookrun.config.schema import HookrunConfig, mapping_where_nested, nested_block

    if not key or "=" not in override:
        return None
    cls: type | None = HookrunConfig
    *parents, last = key.split(".")
    for part in parents:  # the dataclass holding `last`
        cls = nested_block(cls, part) if cls is not None else None
    if cls is None:
        return None
    try:
        mapping_where_nested(f"{'.'.join(parents)}." if parents else "", cls, last,
                             yaml.safe_load(override.split("=", 1)[1]))
    except ConfigError as err:
        return str(err)
    except yaml.YAMLError:
        return None
    return None


def _given(key: str, overrides: Iterable[str]) -> str:
    for o in sorted(overrides, key=lambda o: o.startswith("~")):  # key=value before ~key
        if o.split("=", 1)[0].lstrip("+~") == key:
            return o
    return key


def dotted_keys(node: object, prefix: str = "") -> list[str]:
    """Every dotted key of a nested mapping (lists are leaves)."""
    out = []
    if isinstance(node, Mapping):
        for k, v in node.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            out.append(path)
            out.extend(dotted_keys(v, path))
    return out
