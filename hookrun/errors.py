"""The one exception type hookrun raises for a user's mistake, and how things are named in its messages.

    raise ConfigError("hooks.fmap.type: 'fwd' is not a hook type; choose one of: forward, ...")

The CLI prints its message on one line and exits non-zero without a traceback; anything else is a
bug in hookrun (or in user code) and keeps its traceback.

How a module and a capture are named in messages, warnings and plans: one label builder.

    module_label("")                          # '(model)': the whole model (module path '')
    capture_label("layer1", "output", call=1)  # 'layer1 output@1'
    call_role("output", 1)                     # 'output@1': a capture's role and call, as the file names it
    dataset_label({"_target_": "x.Shapes"})    # 'x.Shapes': the data a run reads (plan, inspect, report)
    token_label(" the\n")                     # '␣the↵': a token's text with its whitespace made visible
    sorted(names, key=natural_key)            # h.2 before h.10: modules by depth, as every listing orders them

The file itself names the whole model's group MODEL_NODE (hookrun.store); this is what a
person reads.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any


class HookrunError(Exception):
    """A problem the user can fix: bad config, bad data, bad file. The message says how."""

    exit_code = 2

    def __reduce__(self):  # rebuilt from its message and attributes, whatever its __init__ takes (a
        # launcher's worker sends it pickled: Hydra's submitit launchers re-raise it in the sweep's process)
        return _rebuilt, (type(self), self.args), self.__dict__


def _rebuilt(cls: type, args: tuple) -> HookrunError:
    return cls.__new__(cls, *args)  # BaseException.__new__ sets args; __init__ is not called again


class ConfigError(HookrunError, ValueError):
    """A config value is wrong; raised before any batch runs."""


class NotFoundError(HookrunError, LookupError):
    """A named thing (module, parameter, hook type, action, capture) does not exist."""


class StoreError(HookrunError):
    """A run's store refused or could not be reached (after retries, where there were any): the run
    stops `interrupted` and what was not stored stays local (output/objects/ raises it)."""


class ChangedWhileRead(HookrunError):
    """A live run's file changed under a reader (its writer flushed while HDF5 read it): the file is
    intact, opening it again reads it (open_run does, a few times, before it raises this)."""


class RunError(HookrunError, RuntimeError):
    """Something the config allowed went wrong while the run was in progress."""

    exit_code = 1


def foreign_failure(what: str, exc: BaseException, limit: int = 400) -> RunError:
    """An exception of code hookrun calls but does not own (the model's forward, a user's kind) as one
    RunError line: `what`, the exception's type and message on one line, and where the traceback is."""
    text = " ".join(str(exc).split())
    return RunError(f"{what} {type(exc).__name__}: {text[:limit] + ('...' if len(text) > limit else '')} "
                    f"(the traceback: HYDRA_FULL_ERROR=1 or --verbose)")


PASSED = (KeyboardInterrupt, GeneratorExit)  # what code hookrun does not own may raise and foreign_code lets through


@contextlib.contextmanager
def foreign_code(what: str | Callable[[Exception], HookrunError], passed: tuple[type[BaseException], ...] = (),
                 limit: int = 400) -> Iterator[None]:
    """Code hookrun calls but does not own (a model's forward, a user's metric, loss, target function or
    kind) runs inside this: a HookrunError it raises (and the `passed` types: early_stop's StopForward)
    goes through as it is, and so do KeyboardInterrupt (Ctrl-C, SIGTERM: the run stops `interrupted`)
    and GeneratorExit; any other exception, a BaseException too (SystemExit(0) of a user's sys.exit
    would end the process with status 0 and a failed file), becomes one RunError line,
    `foreign_failure(what, exc)`, or `what(exc)` where the line needs the exception or is costly to
    write, the original as its __cause__.

        with foreign_code(f"patching.metric {name}(logits, items) raised"):
            value = fn(logits, items)
    """
    try:
        yield
    except (HookrunError, *PASSED, *passed):
        raise
    except BaseException as exc:
        raise (foreign_failure(what, exc, limit) if isinstance(what, str) else what(exc)) from exc


# the units of a size key (output.max_bytes, output.part_bytes, a kind's `memory`): parse_bytes reads them
UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 1 << 10, "m": 1e6, "mb": 1e6, "mib": 1 << 20, "g": 1e9,
         "gb": 1e9, "gib": 1 << 30, "t": 1e12, "tb": 1e12, "tib": 1 << 40}


def parse_bytes(value: Any, where: str) -> int:
    """1000000, '512MB', '2GiB' -> bytes: every size key's one parser; a ConfigError line naming `where` otherwise."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if isinstance(value, bool) or m is None or m.group(2).lower() not in UNITS or float(m.group(1)) <= 0:
        raise ConfigError(f"{where}={value!r}; give bytes as a number or with a unit (512MB, 2GiB)")
    return max(1, int(float(m.group(1)) * UNITS[m.group(2).lower()]))


def json_attribute(attrs: Any, name: str, default: Any = None) -> Any:
    """A run's JSON root attribute (a kind's `patching`, `probe`, ...), `default` where it has none; one
    that is not JSON (bytes damaged on disk, a hand edit) is a HookrunError line, not json's traceback."""
    text = attrs.get(name)
    if text is None:
        return default
    try:
        return json.loads(text)
    except (ValueError, TypeError) as exc:
        raise HookrunError(f"the run's {name!r} attribute is not JSON ({exc}): the file is damaged, or another "
                           f"program wrote it; run it again (or use an intact copy)") from None


def close_matches(word: str, choices: Iterable[str], n: int = 5) -> list[str]:
    """The choices closest to ``word``, best first (for 'did you mean' hints): first those it is a whole
    `_`- or `.`-separated part of (`cka`: linear_cka, rbf_cka), in their order; then difflib's."""
    choices = list(choices)
    parts = [c for c in choices if c != word and word in re.split(r"[_.]", c)]
    found = list(dict.fromkeys([*parts, *difflib.get_close_matches(word, choices, n=n, cutoff=0.5)]))[:n]
    if not found:
        prefix = [c for c in choices if c.startswith(word) or word.startswith(c) and c]
        found = prefix[:n]
    return found


def article(word: str) -> str:
    """'an attribution', 'a patching': the word with its indefinite article."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def one_of(choices: Iterable[str]) -> str:
    """'a, b, c' for an error message listing the valid choices."""
    return ", ".join(sorted(choices))


def object_in_config(where: str, omegaconf_message: str, live: str | None = None) -> str | None:
    """A Python object put in a config (OmegaConf: "Value 'TinyCNN' is not a supported primitive type"):
    one line saying what a config holds, and `live`: the call that takes the object itself, where one does."""
    m = re.match(r"Value '([^']*)' is not a supported primitive type", omegaconf_message)
    if m is None:
        return None
    return (f"{where}: {article(m.group(1))} object cannot be in a config (it holds numbers, strings, lists and mappings); "
            + (f"pass it live: {live}" if live else "name what builds it: {_target_: package.module.Name, ...}"))


# OmegaConf's words for a value of another type than its key's, and hookrun's: what to give instead
_WRONG_TYPE = ((r"Value '(.*)' is not a valid bool \(type \w+\)", "is not a boolean; give true or false"),
               (r"Value '(.*)' of type '\w+' could not be converted to Integer", "is not a whole number; give an integer"),
               (r"Value '(.*)' of type '\w+' could not be converted to Float", "is not a number; give one such as 0.5"))


def typed_line(where: str, omegaconf_message: str) -> str:
    """`where: message`, where OmegaConf's message about a value of the wrong type says what to give:
    ("probe.control", "Value 'maybe' is not a valid bool (type str)") is "probe.control=maybe is not a
    boolean; give true or false" (a `where` of key=value, as Hydra's overrides name it, keeps its value)."""
    for pattern, words in _WRONG_TYPE:
        m = re.fullmatch(pattern, omegaconf_message)
        if m:
            return f"{where if '=' in where else f'{where}={m.group(1)}'} {words}"
    return f"{where}: {omegaconf_message}"


def not_a_state_dict(exc: BaseException) -> str:
    """Why torch.load(weights_only=True) refused a file, in a few words: torch's own message is a page
    (with terminal colour codes) whose advice, weights_only=False, hookrun never takes."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if found:
        return f"it holds a Python object ({found.group(1)}), which hookrun never unpickles"
    if re.search(r"Unsupported operand|invalid load key|not a zip file|failed finding central directory", text):
        return "it is not a file torch.save wrote"
    detail = re.search(r"WeightsUnpickler error:\s*([^\n]+)", text)
    first = detail.group(1) if detail else (text.strip().splitlines() or [type(exc).__name__])[0]
    return first.strip()[:200]


# a write the disk refused, told apart and worded (a full disk, a full quota, a file-size limit), as
# Python, h5py (HDF5's 'file write failed ... errno = N'), torch and safetensors report them
def write_reason(exc: BaseException) -> str:
    """Why a write failed, in a few words: a full disk (ENOSPC, as h5py, torch and safetensors word it), or the
    error's type and first line."""
    text = str(exc)
    if getattr(exc, "errno", None) == errno.ENOSPC or "errno = 28" in text or "No space left" in text or "os error 28" in text:
        return "no space left on the device"
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"


FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a full disk, a full quota, a file-size limit


def refused_write(exc: BaseException) -> bool:
    """Whether `exc` is a write the disk refused (full, over a quota or a file-size limit): an OSError of
    that errno, or h5py's error around HDF5's 'file write failed ... errno = N' (an OSError, or a RuntimeError
    raised as h5py closes a dataset or the file whose cached chunks it then wrote)."""
    if isinstance(exc, OSError) and exc.errno in FULL:
        return True
    text = str(exc)
    return isinstance(exc, (OSError, RuntimeError)) and any(f"errno = {n}," in text for n in FULL)


MODEL_LABEL = "(model)"  # the whole model, where a module path is '' (hooks at the model's own forward)


def module_label(module: str) -> str:
    """A module's path, or MODEL_LABEL for the whole model."""
    return module or MODEL_LABEL


def natural_key(text: str) -> list:
    """Sort key that orders the numbers inside names by value: features.4 before features.10 (HDF5
    lists a file's groups in text order: h.10, h.11 before h.2)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(text))]


def call_role(role: str, call: int = 0) -> str:
    """A capture's role with its call: 'output' for a module's first call, 'output@1' for the next:
    the one builder of that name (the file's dataset names, the labels, the in-memory keys)."""
    return role + (f"@{call}" if call else "")


def capture_label(module: str, role: str, call: int = 0, hook: str | None = None, sep: str = " ") -> str:
    """`module role` (`@call` where it is not the module's first call), prefixed by `hook` where given:
    sep=" " for messages ('layer1 output@1'), sep="/" for keys ('fmap/layer1/output')."""
    parts = ([hook] if hook is not None else []) + [module_label(module), call_role(role, call)]
    return sep.join(parts)


WHITESPACE = {" ": "␣", "\n": "↵", "\t": "⇥"}  # how a token's whitespace is shown (plot, report, grids)


def token_label(text: str, special: str = "<empty>") -> str:
    """A token's text as a label that can be seen: each space, newline and tab as a sign (WHITESPACE),
    any other character that does not print as its escape (\\x0d, \\u200b); `special` (`<bos>`,
    ...) where the text is empty (a special token decodes to nothing). Plain text, never markup: a
    report escapes it where it is drawn."""
    if not text:
        return special
    return "".join(WHITESPACE.get(c) or (c if c.isprintable() else _escaped(c)) for c in text)


def visible(text: str) -> str:
    """`text` with each character that does not print (a carriage return, an ESC, a tab) as its escape
    (\\x0d), newlines kept: matplotlib stopped drawing a title at a carriage return, so a class
    name 'a\\rb' hid the rest of its caption. Running it twice changes nothing."""
    return "".join(c if c == "\n" or c.isprintable() else _escaped(c) for c in str(text))


def _escaped(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def dataset_label(node: object) -> str:
    """The dataset a run reads, as the plan, `inspect` and the report name it: the `data.dataset` block's
    `_target_`, the name of a live object handed to `hookrun.run`, or the value itself; '?' where unknown."""
    if isinstance(node, Mapping):
        return str(node.get("_target_", node.get("live", "?")))
    return str(node) if node else "?"
