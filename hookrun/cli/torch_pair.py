"""Whether torch and torchvision belong together, checked at every command's start without importing
torchvision (a run of a language model never needs it; importing it costs about as much as torch).

    line = mismatch()     # None, or: "torch 2.13.0+cpu and torchvision 0.28.0+cu128 do not belong together ..."

The two packages' `version.py` files are read as text (milliseconds): torchvision 0.N goes with
torch 2.(N-15), and a CUDA build of torchvision does not load its ops (`torchvision::nms`) beside a
CPU-only torch, nor beside a torch of another CUDA major version. Only where these say the pair
looks wrong is torchvision imported, to see whether its ops load; a pair that loads is left alone.
pip can leave such a pair where one index (PyTorch's CPU wheels) cannot be reached and it takes the
other package from elsewhere; the line names both versions and the command that reinstalls both
from one source.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPAIR = ("reinstall both from one source: pip install --force-reinstall torch torchvision (or, CPU-only wheels: "
          "pip install --force-reinstall torch torchvision --index-url https://download.pytorch.org/whl/cpu)")
VERSION = re.compile(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)


def installed_version(package: str) -> str | None:
    """`package.__version__` read from its version.py, without importing the package; None if absent."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder, "version.py")
        if path.is_file():
            m = VERSION.search(path.read_text(errors="replace"))
            if m:
                return m.group(1)
    return None


def _split(version: str) -> tuple[tuple[int, ...], str]:
    public, _, local = version.partition("+")
    numbers = tuple(int(n) for n in re.findall(r"\d+", public)[:2])
    return numbers, local


def pair_problem(torch_version: str, vision_version: str) -> str | None:
    """Why these versions do not go together, or None where they look like one pair."""
    (t_major, t_minor), t_build = _split(torch_version)
    (v_major, v_minor), v_build = _split(vision_version)
    if t_major == 2 and v_major == 0 and v_minor != t_minor + 15:
        return f"torchvision 0.{v_minor} is built for torch 2.{v_minor - 15}"
    if t_build == "cpu" and v_build.startswith(("cu", "rocm")):
        return "a CUDA build of torchvision beside a CPU-only torch"
    cuda = [re.match(r"cu(\d+?)\d$", b) for b in (t_build, v_build)]
    if all(cuda) and cuda[0].group(1) != cuda[1].group(1):
        return "torch and torchvision built for different CUDA versions"
    return None


def mismatch() -> str | None:
    """One line where torch and torchvision do not belong together (their ops do not load), else None."""
    torch_version, vision_version = installed_version("torch"), installed_version("torchvision")
    if torch_version is None or vision_version is None:
        return None
    why = pair_problem(torch_version, vision_version)
    if why is None:
        return None
    try:  # the pair looks wrong: see whether torchvision's ops load after all
        import torch
        import torchvision.ops  # noqa: F401

        if hasattr(torch.ops.torchvision, "nms"):
            return None
        failure = "operator torchvision::nms does not exist"
    except Exception as exc:  # RuntimeError: operator torchvision::nms does not exist; an ImportError; ...
        failure = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return (f"torch {torch_version} and torchvision {vision_version} do not belong together ({why}; "
            f"torchvision's ops do not load: {failure}); {REPAIR}")
