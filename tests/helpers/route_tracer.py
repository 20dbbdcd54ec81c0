"""Run a module as `python -m` under a profiler and print every hookrun file whose code ran.

    python tests/helpers/route_tracer.py hookrun experiment=resnet_layer1 data.limit=1 progress=false

A 'call' event is recorded for every code object that runs (module bodies included), from
sys.setprofile and threading.setprofile (the writer thread); at exit the sorted list of files
under hookrun/ is printed, one a line, after a line `ROUTE <count>`.
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys
import threading

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "hookrun") + os.sep
SEEN: set[str] = set()


def _profile(frame, event, arg):  # noqa: ANN001, ANN202 (the profiler's signature)
    if event == "call":
        name = frame.f_code.co_filename
        if name.startswith(ROOT):
            SEEN.add(name)


def _report() -> None:
    sys.setprofile(None)
    files = sorted(os.path.relpath(f, os.path.dirname(os.path.dirname(ROOT))).replace(os.sep, "/") for f in SEEN)
    print(f"ROUTE {len(files)}", flush=True)
    for f in files:
        print(f"ROUTE-FILE {f}", flush=True)


def main() -> None:
    module, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
    atexit.register(_report)
    threading.setprofile(_profile)
    sys.setprofile(_profile)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
