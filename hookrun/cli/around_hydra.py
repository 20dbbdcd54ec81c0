"""What hookrun does around Hydra's app (cli/app.py): the command line read before Hydra composes it
(an override the shell broke, a kind's block set where the config has none, a renamed group option),
the schema's slots Hydra composes onto, and Hydra's record of a run held until the run is accepted.

    line = shell_damage(sys.argv[1:])      # a brace-expanded or split override, before Hydra sees it
    notes = renamed(overrides, conf_dir())  # experiment=OLD: "... was renamed ...; the old name still runs"
    ConfigStore.instance().store(name="hookrun_schema", node=hydra_slots(HookrunConfig))
    line = missing_block(["experiment=resnet_layer1", "my_kind.method=x"], blocks, compose_groups, conf)
    # "my_kind.method=x: this config has no my_kind block; add one with '+my_kind={method: x}' ..."

The CLI prints a line these return as `hookrun: error: ...` and exits with 2; the checks run on every
call, and the words of a line are override_faults.py's, loaded only where a check finds a fault. An
error of Hydra's composition itself is put in one line by hydra_errors.py, loaded only where one happens.

A block that is off is null in the composed config. OmegaConf cannot merge anything into a null
node typed with the block's dataclass (`+my_kind={method: x}` ended in "'NoneType' object has no
attribute 'get'", `my_kind.method=x` in "Unexpected type for root: NoneType"), so the schema Hydra
composes onto types every null block as Any (`hydra_slots`): `+my_kind={...}`, `my_kind={...}`,
`+my_kind.method=...` then add the block, and `hookrun.config.load` types it (its unknown
keys and wrong types are one line there, before anything is built). `my_kind.method=x` without a
`+`, where the config has no such block, reads as a change to a block the user thinks is there: it
is refused in one line saying how to add one (`missing_block`).

Hydra's record of a run (`.hydra/config.yaml`, `hydra.yaml`, `overrides.yaml`, `hookrun.log`) is
written into the run folder only once the run is accepted (output/__init__.py: on_accepted).

    with held_saves():              # main(): Hydra's run_job keeps its .hydra files here, unwritten
        _app()                      # the task: record = RunRecord.take(folder); run(cfg) under
                                    # on_accepted(record.write); record.discard() if never accepted

Hydra 1.3 writes `.hydra/` and opens the log file before the task starts, so a second run into an
existing folder, refused a moment later (the file exists, another writer holds it, a bad config),
used to rewrite the first run's `.hydra/` and append its error to the first run's log. Here the
three files are held as text and the log's records in memory until the run's output opens; a run
that is refused writes nothing (a folder Hydra made for it and left empty is removed). The files
hold what Hydra would have written, byte for byte. Only Hydra's in-process launchers (a plain
run, `-m` with the basic launcher) go through here; a launcher that runs jobs in other processes
(joblib, submitit) writes the record as Hydra does.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from hookrun.config.schema import HookrunConfig, nested_block, takes_bool
from hookrun.store import REFUSED


def shell_damage(args: list[str]) -> str | None:
    """An override the shell brace-expanded (the same key twice) or split at spaces (unbalanced
    braces), recognised before Hydra sees it; None if the arguments look whole (the line that says
    what is wrong: override_faults.py, loaded only where something is)."""
    overrides = [a for a in args if not a.startswith("-")]
    for i, arg in enumerate(overrides):
        if _depth(arg) > 0:
            for end in range(i + 2, len(overrides) + 1):
                if _depth(" ".join(overrides[i:end])) <= 0:
                    from hookrun.cli.override_faults import split_line

                    return split_line(arg, overrides[i:end])
    for arg in overrides:
        key, eq, value = arg.lstrip("+").partition("=")
        wrong = [v for v in value.split(",") if re.fullmatch(r"-?\d+", v.strip()) and v.strip() not in ("0", "1")]
        if eq and wrong and _is_boolean(key):  # Hydra's schema reads dry_run=2 as true, silently
            from hookrun.cli.override_faults import not_boolean_line

            return not_boolean_line(key, wrong[0].strip())
    seen: dict[str, list[tuple[int, str]]] = {}
    for i, arg in enumerate(overrides):
        key, eq, _ = arg.partition("=")
        if eq:
            seen.setdefault(key.lstrip("+~"), []).append((i, arg))
    for key, found in seen.items():
        if len(found) > 1:
            from hookrun.cli.override_faults import repeated_line

            return repeated_line(key, found, [i for i, _ in found] == list(range(found[0][0], found[0][0] + len(found))))
    return None


RENAMED = re.compile(r"^# renamed: (\S+)", re.MULTILINE)  # a group option's file that only points at its new name


def renamed(overrides: list[str], conf: str) -> list[str]:
    """A note for each group choice whose file says `# renamed: NEW` (experiment=OLD):
    the old name still runs (its file pulls the new one in)."""
    notes = []
    for o in overrides:
        key, eq, value = o.lstrip("+").partition("=")
        if not eq or "." in key or not re.fullmatch(r"[\w/]+", key):
            continue
        for option in value.split(","):
            path = Path(conf, key, f"{option.strip()}.yaml")
            m = RENAMED.search(path.read_text(errors="replace")) if path.is_file() else None
            if m:
                notes.append(f"{key}={option.strip()} was renamed {key}={m.group(1)}; the old name still runs")
    return notes


def _is_boolean(key: str) -> bool:
    """`key` (dotted) is a boolean of hookrun's schema (dry_run, output.overwrite)."""
    *path, last = key.split(".")
    cls: type | None = HookrunConfig
    for part in path:
        cls = nested_block(cls, part)
        if cls is None:
            return False
    return takes_bool(cls, last)


def _depth(text: str) -> int:
    return text.count("{") + text.count("[") - text.count("}") - text.count("]")


def _optional_dataclass(hint: Any) -> bool:
    return any(dataclasses.is_dataclass(t) for t in typing.get_args(hint)) and type(None) in typing.get_args(hint)


def block_names(schema: type, own: type) -> list[str]:
    """The top-level keys that are a kind's block: an optional dataclass of hookrun's own schema
    `own`, or a null slot `schema` adds to it (a kind plugin's)."""
    hints = typing.get_type_hints(own)
    names = [f.name for f in dataclasses.fields(own) if _optional_dataclass(hints[f.name])]
    mine = set(hints)
    return names + [f.name for f in dataclasses.fields(schema) if f.name not in mine and f.default is None]


def hydra_slots(schema: type) -> type:
    """`schema` with every block whose default is null typed Any, so the command line can add it."""
    hints = typing.get_type_hints(schema)
    null = [(f.name, Any, dataclasses.field(default=None)) for f in dataclasses.fields(schema)
            if _optional_dataclass(hints[f.name]) and f.default is None]
    return dataclasses.make_dataclass(schema.__name__, null, bases=(schema,)) if null else schema


def missing_block(overrides: list[str], blocks: list[str], compose_groups: Callable[[], Any], conf: str | Path,
                  swept: list[str] = (), added_by_key: Callable[[str], bool] = lambda _: False) -> str | None:
    """One line for `BLOCK.key=value` (no `+`) where the config, as its groups compose it, has no
    BLOCK; None where every such override has its block. `compose_groups()` composes the group
    choices alone (called only where a block's key is set); `swept`: the sweeps over group options
    (`-m experiment=a,b`), which Hydra leaves out of the config it composes first; `added_by_key(BLOCK)`:
    a key of that block adds it (its kind plugin says so: `added_by_key`)."""
    given = {o.lstrip("+").split("=", 1)[0] for o in overrides if "=" in o}
    dotted = [o for o in overrides if not o.startswith(("+", "~")) and "=" in o and "." in o.split("=", 1)[0]
              and o.split(".", 1)[0] in blocks and o.split(".", 1)[0] not in given]
    if not dotted:
        return None
    cfg = compose_groups()
    for override in dotted:
        block = override.split(".", 1)[0]
        if cfg.get(block) is None and not added_by_key(block):
            from hookrun.cli.override_faults import missing_block_line

            return missing_block_line(override, block, list(swept), conf)
    return None


def with_late_blocks(compose: Callable[[], Any], schema: type) -> Any:
    """compose(), again with an untyped slot for each top-level key of a config file that `schema` lacks: a
    kind's block beside the `imports:` that registers the kind (`imports: [my_kinds]` and `scaled: {...}` in an
    experiment's YAML), which Hydra composes before imports: is read ("Key 'scaled' not in 'HookrunConfig'");
    load() then imports the modules and types the block, or refuses a key no kind has in one line (the
    composing again: hydra_errors.late_blocks, loaded only where Hydra refused a key)."""
    try:
        return compose()
    except Exception as exc:
        first = exc
    from hookrun.cli.hydra_errors import late_blocks

    return late_blocks(compose, schema, first)


_HELD: list[tuple[Path, str]] = []  # (file, text) of the .hydra files Hydra asked to write
log = logging.getLogger("hookrun")


@contextmanager
def held_saves() -> Iterator[None]:
    """Within: Hydra's `_save_config` (run_job's `.hydra/*.yaml`) is held instead of written."""
    import hydra.core.utils as utils

    original = utils._save_config

    def hold(cfg: Any, filename: str, output_dir: Path) -> None:
        _HELD.append((Path(output_dir) / filename, OmegaConf.to_yaml(cfg)))  # the text Hydra writes

    utils._save_config = hold
    try:
        yield
    finally:
        utils._save_config = original
        _HELD.clear()


class _Pending(logging.Handler):
    """Keeps the records a file handler would have written until the run is accepted."""

    def __init__(self, file: logging.FileHandler) -> None:
        super().__init__(file.level)
        self.file = file
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class RunRecord:
    """One job's record: its held `.hydra` files and its log's records, until `write` or `discard`."""

    def __init__(self, folder: Path, files: list[tuple[Path, str]], pending: list[_Pending], made: list[Path]) -> None:
        self.folder, self.files, self.pending, self.made = folder, files, pending, made
        self.written = False

    @classmethod
    def take(cls, folder: Path) -> RunRecord:
        """The files held since the last job, and the root logger's file handlers swapped for
        pending ones (Hydra opened them in append mode: an empty file it made is removed)."""
        files = list(_HELD)
        _HELD.clear()
        root = logging.getLogger()
        pending, made = [], []
        for handler in list(root.handlers):
            if isinstance(handler, logging.FileHandler):
                handler.close()
                path = Path(handler.baseFilename)
                try:  # (torchrun's ranks share the run folder: another rank may have removed it first)
                    if path.is_file() and path.stat().st_size == 0:
                        path.unlink(missing_ok=True)
                        made.append(path)
                except FileNotFoundError:
                    made.append(path)
                stand_in = _Pending(handler)
                root.removeHandler(handler)
                root.addHandler(stand_in)
                pending.append(stand_in)
        return cls(folder, files, pending, made)

    def write(self) -> None:
        """The run is accepted: write the `.hydra` files and the log (its records so far, then on)."""
        if self.written:
            return
        self.written = True
        (self.folder / REFUSED).unlink(missing_ok=True)  # (an earlier refusal of this job: it runs now)
        root = logging.getLogger()
        for stand_in in self.pending:
            old = stand_in.file
            file = logging.FileHandler(old.baseFilename, mode="a", encoding=old.encoding)
            file.setLevel(old.level)
            file.setFormatter(old.formatter)
            for f in old.filters:
                file.addFilter(f)
            for record in stand_in.records:
                file.handle(record)
            root.removeHandler(stand_in)
            root.addHandler(file)
        for path, text in self.files:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
            except OSError as exc:  # the run goes on: its output is open
                log.warning("could not write %s: %s", path, exc)

    def discard(self) -> None:
        """The run was refused (or wrote nothing): forget the record; the folder stays as it was."""
        if self.written:
            return
        root = logging.getLogger()
        for stand_in in self.pending:
            root.removeHandler(stand_in)
        self.pending = []


def remove_empty(folder: Path) -> None:
    """Remove the run folder Hydra made for a refused or dry run, and its parents while they are empty."""
    try:
        while folder != folder.parent and not any(folder.iterdir()) and folder.resolve() != Path.cwd().resolve():
            folder.rmdir()
            folder = folder.parent
    except OSError:
        pass
