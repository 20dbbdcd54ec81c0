"""hookrun's activation cache against every peer, side by side: `python benchmarks/cache_peers.py`.

    python benchmarks/cache_peers.py --quick                      # a smoke run: the routes this Python has
    bash tests/envs/make_tl4.sh /opt/tl4                          # TransformerLens 4.3 beside dev's 3.9
    python benchmarks/cache_peers.py --python /opt/tl4/bin/python --markdown table.md  # every peer (docs/benchmarks/caches.md)

Six routes cache the same activations of the same GPT-2-shaped model (random weights, seed 0) on the
same token ids (benchmarks/peer_routes.py): the bare forward stopped after the last cached block;
hookrun (`rows: token`, `early_stop`) to a local file; hookrun to an S3 bucket (a moto server this
command starts on 127.0.0.1); TransformerLens 4 `run_with_cache(stop_at_layer=6)` + `torch.save`;
nnsight `trace` + `save` + `tracer.stop()` + `torch.save`; SAELens' own `CacheActivationsRunner`
(Arrow shards). Each Python environment (this one, and each `--python`) runs one long-lived worker
(benchmarks/peer_worker.py) that builds the model once; a route runs in the first worker whose
environment has its library, so SAELens (which pins TransformerLens 3) can run beside
TransformerLens 4. One route runs at a time. Every round runs every route once, in a new random
order, and each target is the median over rounds of that round's ratio (paired ratios: the load
of a shared machine moves both sides of a pair together). A route whose library is missing
everywhere is reported as not run. Reading: shuffled against in-order reads of one hookrun file
(benchmarks/cache_reads.py), paired the same way. Peak RSS: each route's peak (VmHWM, reset
before each run) at the timed number of batches against a short run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import harness  # noqa: E402
import torch  # noqa: E402
from cache_peers_table import table  # noqa: E402
from peer_routes import BUCKET, NEEDS  # noqa: E402

ROUTES = list(NEEDS)


def check_device(p: argparse.ArgumentParser, device: str) -> None:
    """--device, refused in one line before any worker starts (this process may lack hookrun, so
    not hookrun's own check: torch's)."""
    try:
        kind = torch.device(device).type
    except RuntimeError:
        p.error(f"--device {device!r} is not a torch device; use cpu, cuda or cuda:N")
    if kind == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {device}: CUDA is not available on this machine; use --device cpu")


class Worker:
    """One Python environment's worker process; JSON lines over its stdin and stdout."""

    def __init__(self, python: str, folder: Path, a: argparse.Namespace, env: dict, log: Path) -> None:
        self.python, self.log_path = python, log
        self.log = open(log, "w")
        cmd = [python, str(HERE / "peer_worker.py"), "--dir", str(folder), "--device", a.device, "--points", str(a.points),
               "--threads", str(a.threads)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.routes: list[str] = []
        self.hosts: list[str] = []
        self.versions: dict = {}

    def recv(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.log.flush()
            raise RuntimeError(f"the worker of {self.python} ended:\n{self.log_path.read_text()[-3000:]}")
        msg = json.loads(line)
        if "error" in msg:
            raise RuntimeError(f"the worker of {self.python} failed:\n{msg['error']}")
        return msg

    def send(self, msg: dict) -> None:
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def call(self, msg: dict) -> dict:
        self.send(msg)
        return self.recv()

    def close(self) -> None:
        try:
            self.send({"op": "exit"})
            self.proc.stdin.close()
        except (BrokenPipeError, ValueError):
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class S3Server:
    """moto's S3 server in a process of its own on 127.0.0.1 (FACTS.md), with one bucket."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                    "AWS_DEFAULT_REGION": "us-east-1"}

    def ready(self, timeout: float = 120) -> None:
        deadline = time.time() + timeout
        while True:
            try:
                urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{BUCKET}", method="PUT"), timeout=5)
                return
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"moto's S3 server did not start on {self.endpoint}") from None
                time.sleep(0.3)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def have_moto() -> bool:
    import importlib.util

    return importlib.util.find_spec("moto") is not None and importlib.util.find_spec("flask") is not None


def main() -> None:
    p = harness.parser(__doc__)
    p.add_argument("--python", action="append", default=[], help="another environment's interpreter (repeatable): "
                   "its worker runs the routes this one cannot (e.g. a venv with sae-lens)")
    p.add_argument("--batches", type=int, default=32, help="batches of 8 x 128 tokens per timed run (default 32)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rss-small", type=int, default=4, help="batches of the short run whose peak RSS is set against the timed runs'")
    p.add_argument("--rows", type=int, default=262144, help="token rows (256 float32) in the read benchmark's file")
    p.add_argument("--read-epochs", type=int, default=8, help="epochs per timed read of the read benchmark (default 8: "
                   "one pass over a file in the page cache takes about 50 ms, too short to time)")
    p.add_argument("--points", type=int, default=1, help="hook points: the residual stream after the last N blocks up to "
                   "block 5 (default 1: SAELens' runner takes one)")
    p.add_argument("--part-mb", type=float, default=8.0, help="the S3 route's output.part_bytes, in MiB (default 8)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (the model, the forward and hookrun's device)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--routes", default=",".join(ROUTES), help="comma-separated subset of " + ",".join(ROUTES))
    p.add_argument("--seed", type=int, default=0, help="the rounds' random orders")
    harness.quick_and_markdown(p, "2 batches, 1 round, 16384 rows: checks that everything runs")
    p.add_argument("--dir", type=Path)
    a = harness.parse(p, batches=2, rounds=1, rss_small=1, rows=16384, read_epochs=1)
    check_device(p, a.device)
    log = harness.log
    wanted = [r for r in a.routes.split(",") if r]
    started, load = time.time(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        folder = Path(tmp)
        server = S3Server() if "hookrun_s3" in wanted and have_moto() else None
        env = harness.child_env(TOKENIZERS_PARALLELISM="false", BENCH_PART_BYTES=str(int(a.part_mb * 2**20)))
        env.update(server.env if server else {})
        if server is None:
            env.pop("AWS_ENDPOINT_URL", None)
        pythons = list(dict.fromkeys([sys.executable, *a.python]))
        workers = [Worker(py, folder, a, env, folder / f"worker{i}.log") for i, py in enumerate(pythons)]
        try:
            if server:
                server.ready()
            host, missing = assign(workers, wanted, server is not None)
            for w in workers:
                log(f"{w.python}: {', '.join(w.hosts) or 'nothing'}; setup {w.recv()['setup_s']:.1f} s" if w.hosts else
                    f"{w.python}: nothing to run here")
            log(f"not run: {missing or 'none'}")
            results = measure(a, host, log)
        finally:
            for w in workers:
                w.close()
            if server:
                server.stop()
    results.update(missing=missing, versions=[(w.python, w.versions, w.hosts) for w in workers], seconds=time.time() - started,
                   load=(load, os.getloadavg()[0]))
    text = table(a, results)
    print(text)
    harness.save(text, a.markdown)


def assign(workers: list[Worker], wanted: list[str], s3: bool) -> tuple[dict, dict]:
    """Each route to the first worker whose environment has its library; the reasons for the rest."""
    for w in workers:
        hello = w.recv()
        w.routes, w.versions = hello["routes"], hello["versions"]
    host, missing = {}, {}
    for route in wanted:
        w = next((w for w in workers if route in w.routes), None)
        if w is None:
            missing[route] = ("moto[server] is not installed here (pip install 'moto[server]')" if route == "hookrun_s3" and not s3
                              else f"{' and '.join(NEEDS[route])} not importable in {', '.join(x.python for x in workers)}")
            continue
        host[route] = w
        w.hosts.append(route)
    for w in workers:
        w.send({"host": w.hosts})
    return host, missing


def measure(a: argparse.Namespace, host: dict, log) -> dict:
    rng = random.Random(a.seed)
    routes = list(host)
    checks = {}
    for route in routes:  # one batch each: warms every route up, and checks what each cached
        checks[route] = host[route].call({"op": "run", "route": route, "batches": 1})["check"]
    runs: dict[str, list] = {r: [] for r in routes}
    for r in range(a.rounds):
        order = rng.sample(routes, len(routes))
        for route in order:
            res = host[route].call({"op": "run", "route": route, "batches": a.batches})
            runs[route].append(res)
            log(f"  round {r + 1} {route:17s} {res['seconds']:7.2f} s (cpu {res['cpu_s']:6.2f} s) "
                f"{res['tokens'] / res['seconds']:7.0f} tokens/s  peak {res['peak_mb']:6.0f} MB")
    small = {}
    for route in routes:
        small[route] = host[route].call({"op": "run", "route": route, "batches": a.rss_small})
        log(f"  peak RSS {route:17s} {a.rss_small} batches {small[route]['peak_mb']:6.0f} MB")
    reads: dict[str, list] = {"read_inorder": [], "read_shuffled": []}
    if "hookrun" in host:
        w = host["hookrun"]
        w.call({"op": "make_h5", "rows": a.rows})
        for r in range(a.rounds):
            for name in rng.sample(list(reads), 2):
                reads[name].append(w.call({"op": name, "rows": a.rows, "kwargs": {"epochs": a.read_epochs}}))
                log(f"  round {r + 1} {name:17s} {reads[name][-1]['rows_per_s']:10.0f} rows/s")
    return {"runs": runs, "small": small, "checks": checks, "reads": reads}


if __name__ == "__main__":
    main()
