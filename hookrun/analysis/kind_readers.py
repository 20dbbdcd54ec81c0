"""What readers show of a kind of run: one registry that each kind's reader module fills.

    register_reader(KindReader("mykind", present=lambda f: "mykind" in f, lines=describe, columns=columns,
                               sections=sections, methods={"mine": read_mine}, properties={"names": names}))
    for r in readers_of(run.file): ...   # the file's kind's reader (inspect, plot, report, open_run)
    run.mine(...), run.names             # a kind's methods and properties, through Run.__getattr__

A file names its kind in the root attribute `kind` (written by run() from hookrun 0.x on); a file
written before that is asked through each reader's `present(f)`. The readers (run_reader.py,
output/objects/remote_run.py, sweep.py, report/) ask this registry and test no group or attribute by name; the
kinds' reader modules live in their own folders (hookrun/runner/kinds/<kind>/reader.py) and are
imported when first asked for: a file's `kind` imports that kind's reader (reader_for), and a question
put to every reader (a file without `kind`, the names Run adds) imports the shipped ones first. What a reader reads from
the root attributes alone (`units`, `attr_lines`, `header`, `properties`) is asked through
`readers_by_attrs`: an object-store run's come from its manifest, nothing fetched.

Table (below): a table of plain values, rows of dicts that print aligned and convert to pandas
(`print(t); t.to_pandas(); t.column("score")`): what open_sweep(...).table() and the kinds' reader
methods (run.edges(), ...) return.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import h5py
import yaml

from hookrun.analysis.reader_failures import asked, isolated_readers, unloaded
from hookrun.errors import HookrunError
from hookrun.store import BATCH_UNITS
from hookrun.text_labels import visible


def _none(_: Any) -> list:
    return []


def _no_columns(_: h5py.File) -> dict:
    return {}


def _no_note(_: str) -> str | None:
    return None


@dataclass(frozen=True)
class KindReader:
    kind: str  # the kind's registered name, as the file's `kind` attribute says it
    present: Callable[[h5py.File], bool]  # a file written before the `kind` attribute holds this kind's rows
    lines: Callable[[h5py.File], list[str]] = _none  # inspect's summary lines
    columns: Callable[[h5py.File], dict[str, Any]] = _no_columns  # a sweep table's (and plot's) numbers
    sections: Callable[[Any], list[dict]] = _none  # the report's sections (given the Run)
    methods: dict[str, Callable[..., Any]] = field(default_factory=dict)  # Run's methods: run.NAME(...) -> fn(file, ...)
    sweep: Callable[[Any], list[dict]] = _none  # the report's sections of a sweep (given the Sweep) whose jobs are this kind's
    units: tuple[str, str] = BATCH_UNITS  # what its steps and rows are called (inspect, the report)
    attr_lines: Callable[[Mapping], list[str]] = _none  # inspect's lines from the root attributes alone
    header: Callable[[Mapping], list[list[str]]] = _none  # the report's run-table rows, from the root attributes
    properties: dict[str, Callable[[Mapping], Any]] = field(default_factory=dict)  # Run's properties: run.NAME -> fn(attrs)
    figures: Callable[..., list[tuple[str, Any]]] = _none  # plot's pictures (given the Run[, the samples]): (file stem, figure spec)
    sweep_figures: Callable[[Any], list[tuple[str, Any]]] = _none  # plot's pictures of a sweep (given the Sweep), as `figures`
    no_values: Callable[[str], str | None] = _no_note  # what a summary says of its capture LABEL with no finite value


READERS: dict[str, KindReader] = {}
# the shipped kinds that are not plugins: the module that registers each one's reader when imported
SHIPPED_READERS = {"evaluate": "hookrun.runner.kinds.evaluate.reader", "patching": "hookrun.runner.kinds.patching.reader"}


def register_reader(reader: KindReader) -> KindReader:
    READERS[reader.kind] = reader
    return reader


def reader_for(kind: str) -> KindReader | None:
    """The reader of the kind `kind`: registered, or loaded from its kind plugin (hookrun/config/plugins.py)."""
    if kind not in READERS and kind in SHIPPED_READERS:
        importlib.import_module(SHIPPED_READERS[kind])
    if kind not in READERS:
        from hookrun.config.plugins import plugin

        try:
            found = plugin(kind)
            reader = found.reader_object() if found is not None else None
            if reader is not None:  # (a name Run has already: hidden behind Run's own, analysis/reader_names.py)
                importlib.import_module("hookrun.analysis.reader_names").refuse_taken_names(reader)
        except HookrunError as exc:  # (a user's kind inside inspect, plot, report: the run's other parts are shown)
            if not unloaded(kind, exc):
                raise
            return None
        if reader is not None:
            register_reader(reader)
    return READERS.get(kind)


def all_readers() -> list[KindReader]:
    """Every registered reader, the shipped kinds' imported first (a file without `kind` asks each)."""
    for kind in SHIPPED_READERS:
        reader_for(kind)
    return list(READERS.values())


def kind_of(attrs: Mapping) -> str | None:
    """The root attribute `kind` as text (None in a file written before it)."""
    kind = attrs.get("kind")
    return kind.decode() if isinstance(kind, bytes) else kind


def readers_of(f: h5py.File) -> list[KindReader]:
    """The reader of the file's kind (by its `kind` attribute), else every reader whose rows it holds."""
    kind = kind_of(f.attrs)
    if kind is not None:
        reader_for(kind)
        return [READERS[kind]] if kind in READERS and asked(READERS[kind], "present", f) else []
    return [r for r in all_readers() if asked(r, "present", f)]


def readers_by_attrs(attrs: Mapping, file: Callable[[], h5py.File | None]) -> list[KindReader]:
    """The reader of the kind the root attributes name; for a file written before the `kind`
    attribute, every reader whose rows `file()` holds (None: no file to ask, no reader)."""
    kind = kind_of(attrs)
    if kind is not None:
        reader_for(kind)
        return [READERS[kind]] if kind in READERS else []
    f = file()
    return [r for r in all_readers() if asked(r, "present", f)] if f is not None else []


def kind_units(readers: list[KindReader]) -> tuple[str, str]:
    return readers[0].units if readers else BATCH_UNITS


def kind_property(readers: list[KindReader], attrs: Mapping, name: str) -> Any:
    """run.NAME of a kind's reader, from the root attributes; a run of another kind gets what the
    owning reader says of attributes that are not its own (an empty list, ...)."""
    owners = [r for r in readers if name in r.properties] or [r for r in all_readers() if name in r.properties]
    return owners[0].properties[name](attrs)


def property_names() -> set[str]:
    return {name for r in all_readers() for name in r.properties}


def no_values_note(label: str) -> str | None:
    """What a kind says of its own capture `label` holding no finite value (None: nothing special); a
    user's reader that raises here is one line at the command's end (reader_failures.asked)."""
    return next((note for r in all_readers() if (note := asked(r, "no_values", label))), None)


def kind_figures(run: Any, samples: int | None = None) -> list[tuple[str, Any]]:
    """plot's pictures of the file's kind: (file stem, figure spec); a reader whose `figures` takes a
    second argument is given the samples plot was asked to show (`--samples`)."""
    return [fig for r in readers_of(run.file) for fig in (asked(r, "figures", run, samples) if samples is not None
                                                         and _takes_two(r.figures) else asked(r, "figures", run))]


def _takes_two(fn: Callable[..., Any]) -> bool:
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    return len([p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]) >= 2 or any(
        p.kind is p.VAR_POSITIONAL for p in params)


def kind_method(f: h5py.File, name: str) -> Callable[..., Any] | None:
    """A kind's reader method `name` bound to the file (run.NAME(...)); None where no kind has
    it. Called on a file of another kind, the method says in its own NotFoundError what is missing."""
    owners = [r for r in readers_of(f) if name in r.methods] or [r for r in every_reader() if name in r.methods]
    if not owners:
        return None
    method = owners[0].methods[name]
    return lambda *args, **kwargs: method(f, *args, **kwargs)


def method_names(asked: str | None = None) -> set[str]:
    """Every method a kind's reader adds to Run (run.NAME(...)); where `asked` is none of the loaded readers',
    every kind's reader is loaded first (run.probes() on a record run: the probe reader says what is missing)."""
    names = {name for r in all_readers() for name in r.methods}
    if asked is not None and asked not in names:
        names |= {name for r in every_reader() for name in r.methods}
    return names


def every_reader() -> list[KindReader]:
    """The readers of every kind that can be asked for (the shipped kinds, entry points, imports)."""
    from hookrun.config.plugins import loadable
    from hookrun.config.schema import plugin_names

    for kind in plugin_names():
        with contextlib.suppress(Exception), isolated_readers():  # (a kind, or its reader, that fails to load: asking it by name says why; a command's file of another kind is not failed by it)
            if kind not in READERS and loadable(kind) is not None:
                reader_for(kind)
    return all_readers()


def kind_lines(f: h5py.File) -> list[str]:
    readers = readers_of(f)
    note = None if readers else unread_kind(f.attrs)
    return [line for r in readers for line in asked(r, "lines", f)] + ([f"  kind      {note}"] if note else [])


def kind_columns(f: h5py.File) -> dict[str, Any]:
    return {k: v for r in readers_of(f) for k, v in asked(r, "columns", f).items()}


def kind_sections(run: Any) -> list[dict]:
    return [s for r in readers_of(run.file) for s in asked(r, "sections", run)]


MODE_KINDS = ("record", "grad", "generate")  # the modes' kinds (runner/kinds/__init__.py): no reader of their own


def unread_kind(attrs: Mapping) -> str | None:
    """One line where the file's kind has no reader in this process (a module of the run's `imports:`
    registered it, or its package is not installed here), else None."""
    kind = kind_of(attrs)
    if kind is None or kind in MODE_KINDS or reader_for(kind) is not None:
        return None
    from hookrun.config.schema import plugin_names

    if kind in plugin_names():  # found here: a kind without a reader
        return None
    config = attrs.get("config")
    try:
        imports = (yaml.safe_load(config) or {}).get("imports") if isinstance(config, str) else None
    except (yaml.YAMLError, AttributeError):  # (a config that is not a mapping of plain YAML: no list to name)
        imports = None
    if not imports:  # (an entry point of the package that wrote it, not installed where it is read)
        return f"{kind}: no reader for this kind here: the package that declares it (an entry point of hookrun.kinds) is not installed in this environment; install it for inspect, plot and report to read its rows"
    return f"{kind}: no reader for this kind here (it came from imports: {list(imports)}): import that module before open_run, or declare the kind as an entry point of hookrun.kinds, for inspect, plot and report to read its rows"


def kind_sweep_sections(sweep: Any) -> list[dict]:
    """The report's sections of a sweep from the kinds of its jobs' files (each kind once)."""
    return [s for r in _sweep_readers(sweep) for s in asked(r, "sweep", sweep)]


def kind_sweep_figures(sweep: Any) -> list[tuple[str, Any]]:
    """plot's pictures of a sweep from the kinds of its jobs' files: (file stem, figure spec)."""
    return [fig for r in _sweep_readers(sweep) for fig in asked(r, "sweep_figures", sweep)]


def _sweep_readers(sweep: Any) -> list[KindReader]:
    kinds: dict[str, KindReader] = {}
    for job in sweep.jobs:
        if job.file is None:
            continue
        try:  # (a URL, str: its manifest names the kind; a local file opened as a job still running's last flush)
            with job.open() if isinstance(job.file, str) else h5py.File(job.file, "r", locking=False) as f:
                kinds.update((r.kind, r) for r in (f.kind_readers() if isinstance(job.file, str) else readers_of(f)))
        except (OSError, HookrunError):  # an unreadable job: the sweep table says so
            continue
    return list(kinds.values())


@dataclass
class Table:
    """Rows of plain values; prints aligned, converts to pandas."""

    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.rows[i]

    def column(self, name: str) -> list[Any]:
        return [r.get(name) for r in self.rows]

    def to_pandas(self) -> Any:
        import pandas as pd

        return pd.DataFrame(self.rows, columns=self.columns)

    def __str__(self) -> str:
        cells = [[_fmt(r.get(c)) for c in self.columns] for r in self.rows]
        names = [_fmt(c) for c in self.columns]
        widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(names)]
        line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths, strict=True)).rstrip()  # noqa: E731
        return "\n".join([line(names), line(["-" * w for w in widths])] + [line(r) for r in cells])


def _fmt(v: Any) -> str:
    """A cell as the terminal shows it: an ESC or carriage return in a value (a swept override's) as its
    escape, never acted on; a newline as \\n (one row a line)."""
    if isinstance(v, float):
        return f"{v:.6g}"
    return "" if v is None else visible(str(v)).replace("\n", "\\n")
