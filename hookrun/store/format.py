"""The file format's constants: versions and reserved names (docs/format.md is the full description).

    f.attrs["format_version"] == FORMAT_VERSION
    f"captures/{hook}/{module or MODEL_NODE}/{role}"
    storable_text(np.array(["a\x00b"], dtype=object))     # ['a\u2400b']: what a text column holds
"""

from importlib import metadata

import numpy as np

FORMAT_VERSION = "1"  # the layout version written to every file's `format_version` attribute
MODEL_NODE = "__model__"  # the group name for the whole model (module path '')
PART_BYTES = 2 << 30  # an object-store run: bytes of rows per part file (2 GiB), output.part_bytes' default
# what a run's steps and rows are called in its log and in inspect, unless its kind names its own
BATCH_UNITS = ("batches", "samples")


def _package_version() -> str:
    """hookrun's version as installed (pyproject.toml is the one place it is written); a source
    tree that was never installed says so rather than guessing."""
    try:
        return metadata.version("hookrun")
    except metadata.PackageNotFoundError:
        return "0+unknown (not installed)"


HOOKRUN_VERSION = _package_version()  # hookrun.__version__, written to each file's `hookrun_version`


def storable_text(arr: np.ndarray) -> np.ndarray:
    """Texts as HDF5's UTF-8 strings can hold them: a NUL (which ends a C string) becomes U+2400 '\u2400',
    a lone surrogate U+FFFD (a prompt or a sampled token can hold either; the token ids stay exact)."""
    def one(v: object) -> object:
        if not isinstance(v, str):
            return v
        v = v.replace("\x00", "\u2400")
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            v = v.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return v
    return np.array([one(v) for v in arr], dtype=object)
