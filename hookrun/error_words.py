"""The words of refusals only an error path runs, loaded where one is worded (hookrun/errors.py holds the
exception types and the labels every run uses).

    typed_line("probe.control", "Value 'maybe' is not a valid bool (type str)")
                                     # 'probe.control=maybe is not a boolean; give true or false'
    object_in_config("model", "Value 'TinyCNN' is not a supported primitive type")   # a live object in a config
    not_a_state_dict(exc)            # why torch.load(weights_only=True) refused a file, in a few words
    json_attribute(f.attrs, "probe") # a run's JSON root attribute; damaged text is one HookrunError line
    write_reason(exc), refused_write(exc)   # a write that failed, in a few words; whether the disk refused it
"""

from __future__ import annotations

import errno
import json
import re
from typing import Any

from hookrun.errors import HookrunError, article


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
