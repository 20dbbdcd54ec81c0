"""A long-lived worker of benchmarks/cache_peers.py: one per Python environment (venv), commands over a pipe.

    python benchmarks/peer_worker.py --dir D --device cpu --points 1 --threads 1   # JSON lines in and out

It says which routes its environment can run, builds the model once for the routes it is given,
then runs one command at a time: a route for N batches, or a reader over a hookrun file. Around
each command it collects garbage, returns freed heap to the system (malloc_trim), resets the
process's peak RSS (/proc/self/clear_refs, 5) and reports the peak the command reached (VmHWM).
Library output is sent to stderr: stdout carries only the protocol.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib.util
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path


def can_import(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that is missing
        return False


def rss_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1)) / 1024


def fresh_peak() -> float:
    """Free what can be freed, then restart the peak RSS from the current RSS; returns that RSS."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return rss_mb("VmRSS")


def versions() -> dict:
    import importlib.metadata

    got = {}
    for dist in ("torch", "transformers", "h5py", "s3fs", "transformer-lens", "nnsight", "sae-lens", "datasets"):
        try:
            got[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return got


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--points", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever a library prints goes to the log, not into the protocol
    send = lambda msg: proto.write(json.dumps(msg) + "\n")  # noqa: E731

    from peer_routes import NEEDS

    endpoint = bool(os.environ.get("AWS_ENDPOINT_URL"))
    able = [r for r, mods in NEEDS.items() if all(can_import(m) for m in mods) and (r != "hookrun_s3" or endpoint)]
    send({"python": sys.executable, "routes": able, "versions": versions()})
    hello = json.loads(sys.stdin.readline() or '{"host": []}')
    if not hello["host"]:
        return
    import torch

    torch.set_num_threads(a.threads)
    from peer_routes import Routes

    t = time.perf_counter()
    routes = Routes(a.device, a.points)
    routes.prepare(hello["host"], a.dir)
    send({"ready": True, "setup_s": time.perf_counter() - t})
    readers = None
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            break
        try:
            before = fresh_peak()
            if cmd["op"] == "run":
                res = routes.run(cmd["route"], cmd["batches"], a.dir / f"{cmd['route']}_{os.getpid()}")
            else:  # a reader of benchmarks/cache_reads.py over one hookrun file
                import cache_reads as readers

                res = getattr(readers, cmd["op"])(cmd["rows"], a.dir, **cmd.get("kwargs", {}))
            res.update(rss_before_mb=before, peak_mb=rss_mb("VmHWM"))
            send(res)
        except Exception:
            send({"error": traceback.format_exc()[-4000:]})


if __name__ == "__main__":
    main()
