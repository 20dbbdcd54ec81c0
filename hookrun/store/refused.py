"""A write the disk refused, told apart and worded: a full disk (ENOSPC), a full quota (EDQUOT), a file-size
limit (EFBIG), as Python, h5py (HDF5's 'file write failed ... errno = N'), torch and safetensors report them.
No torch or h5py import: readers that write a view use it too.

    if refused_write(exc): raise RunError(f"writing {path} failed: {write_reason(exc)}; free some space ...")
"""

from __future__ import annotations

import errno


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
