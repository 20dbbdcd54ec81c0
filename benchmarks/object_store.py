"""hookrun writing to an object store against writing to local disk, and reading it back: `python benchmarks/object_store.py`.

The object store is moto's S3 server on 127.0.0.1, started by this script in a thread of its own
process (nothing leaves the machine); every route runs in a child process of its own, after an
os.sync(). Each round runs the routes of a comparison in a shuffled order (seeded), and the
figure is the median of the per-round ratios, so a round slowed by another job on the machine
slows both sides of its ratio.

1. Writing, the same run both ways: a GPT-2-shaped random-init model (6 blocks of d_model 256, 4
   heads, the real 50257-token vocabulary, 128-token sequences, batches of 8), `record` with
   `rows: token` on the six blocks' outputs (6 KiB a token), `early_stop: true`; to
   `captures.h5` on local disk, and to `s3://bench/.../captures.h5` (parts of `--part-bytes`,
   staged on the same disk, each uploaded and verified while the next is written). The clock
   starts once the model is built and stops when run() returns: the last part uploaded and the
   manifest written. Also, for information, a writer-bound run (a linear layer, the forward next
   to nothing) the same two ways.
2. Reading the cache in the bucket: `open_run(url).loader(capture, batch_size=4096)` over one
   block's token rows, shuffled against in order, every part fetched from the server (a fresh
   cache_dir each time).

    python benchmarks/object_store.py                 # about 10 minutes on 2 cores
    python benchmarks/object_store.py --quick         # a smoke run: 2 batches, 1 round
    python benchmarks/object_store.py --markdown table.md
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness

HERE = Path(__file__).resolve().parent
BUCKET = "bench"
LAYERS, BATCH, SEQ, D, VOCAB = 6, 8, 128, 256, 50257
CAPTURE = "res/transformer.h.3/output"
MODEL = None  # built before the clock starts; hookrun's _target_ returns it


# -- what the children run ---------------------------------------------------------------------
def gpt2():
    global MODEL
    if MODEL is None:
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        MODEL = GPT2LMHeadModel(GPT2Config(n_layer=LAYERS, n_embd=D, n_head=4, n_positions=SEQ, vocab_size=VOCAB)).eval()
    return MODEL


def tokens(batches: int):
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(torch.randint(0, VOCAB, (batches * BATCH, SEQ), generator=g))


def linear():
    import torch

    global MODEL
    if MODEL is None:
        torch.manual_seed(0)
        MODEL = torch.nn.Sequential(*[torch.nn.Linear(D, D) for _ in range(LAYERS)]).eval()
    return MODEL


def run_cfg(kind: str, batches: int, path: str, staging: str, part_bytes: int) -> dict:
    if kind == "gpt2":
        model = {"_target_": "object_store.gpt2"}
        data = {"dataset": {"_target_": "object_store.tokens", "batches": batches}, "batch_size": BATCH}
        points, record = [f"transformer.h.{i}" for i in range(LAYERS)], {"name": "record", "what": "output", "rows": "token"}
    else:  # writer-bound: the same bytes (SEQ rows of D floats a sample, six points) through six linear layers
        model = {"_target_": "object_store.linear"}
        data = {"dataset": {"_target_": "hookrun.data.RandomTensors", "n": batches * BATCH, "shape": [SEQ, D]},
                "batch_size": BATCH}
        points, record = [str(i) for i in range(LAYERS)], {"name": "record", "what": "output"}
    return {"model": model, "data": data, "device": "cpu", "progress": False, "early_stop": kind == "gpt2",
            "hooks": {"res": {"at": points, "type": "forward", "actions": [record]}},
            "output": {"path": path, "overwrite": True, "staging": staging, "part_bytes": part_bytes}}


def child_main(a: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(a.threads)
    if a.route in ("read_inorder", "read_shuffled"):
        import hookrun

        cache = Path(a.dir) / f"cache-{os.getpid()}"
        run = hookrun.open_run(a.url, cache_dir=cache)
        t = time.perf_counter()
        rows = 0
        for x in run.loader(CAPTURE, batch_size=4096, shuffle=a.route == "read_shuffled", seed=0):
            rows += len(x)
        seconds = time.perf_counter() - t
        shutil.rmtree(cache, ignore_errors=True)
        return {"seconds": seconds, "rows": rows}
    import hookrun

    kind, where = a.route.split("_")  # gpt2_disk, gpt2_s3, linear_disk, linear_s3
    (gpt2 if kind == "gpt2" else linear)()
    folder = Path(a.dir) / f"{a.route}-{os.getpid()}"
    path = a.url if where == "s3" else str(folder / "captures.h5")
    cfg = run_cfg(kind, a.batches, path, str(folder / "stage"), a.part_bytes)
    t = time.perf_counter()
    result = hookrun.run(cfg)
    seconds = time.perf_counter() - t
    size = sum(p.stat().st_size for p in folder.rglob("*.h5")) if where == "disk" else 0
    shutil.rmtree(folder, ignore_errors=True)
    return {"seconds": seconds, "tokens": a.batches * BATCH * SEQ, "steps": result.steps,
            "bytes": size}


# -- the parent ------------------------------------------------------------------------------------
def child(route: str, a: argparse.Namespace, folder: Path, url: str) -> dict:
    harness.sync()
    cmd = [sys.executable, str(HERE / "object_store.py"), "--child", route, "--dir", str(folder), "--url", url,
           "--batches", str(a.batches), "--part-bytes", str(a.part_bytes), "--threads", str(a.threads)]
    server_before = resource.getrusage(resource.RUSAGE_SELF)  # this process runs nothing but the S3 server now
    result, usage = harness.run_child(cmd, f"route {route}", harness.child_env(), warm=harness.QUICK,
                                      preload=("s3fs",))  # usage: this child's own CPU time
    server = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu"] = usage.ru_utime + usage.ru_stime
    result["server_cpu"] = (server.ru_utime + server.ru_stime) - (server_before.ru_utime + server_before.ru_stime)
    return result


def paired(routes: list[str], a: argparse.Namespace, folder: Path, url_of, log) -> list[dict[str, dict]]:
    """`a.rounds` rounds; in each, every route once, in a shuffled order."""
    rng = random.Random(0)
    out = []
    for r in range(a.rounds):
        order = rng.sample(routes, len(routes))
        got = {}
        for route in order:
            got[route] = child(route, a, folder, url_of(route, r))
            log(f"  round {r + 1}/{a.rounds} {route:14s} {got[route]['seconds']:8.3f} s")
        out.append(got)
    return out


def main() -> None:
    p = harness.parser(__doc__)
    p.add_argument("--batches", type=int, default=40, help="batches of 8 x 128 tokens per run (default 40: 240 MiB)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--part-bytes", type=int, default=32 << 20, help="output.part_bytes of the runs to the store (32 MiB)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per child (default 1 of this machine's cores)")
    harness.quick_and_markdown(p, "2 batches, 1 round: checks that everything runs", "write the results table to this file too")
    p.add_argument("--dir", type=Path, help="where the runs write (default: a temporary folder)")
    p.add_argument("--child", dest="route", help=argparse.SUPPRESS)
    p.add_argument("--url", default="", help=argparse.SUPPRESS)
    a = harness.parse(p, batches=2, rounds=1, part_bytes=1 << 20)  # a child is never --quick: it gets the sizes
    if a.route:
        print(json.dumps(child_main(a)))
        return
    log = harness.log

    import boto3
    from moto.server import ThreadedMotoServer

    started = time.time()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(AWS_ENDPOINT_URL=f"http://{host}:{port}", AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1")
    boto3.client("s3").create_bucket(Bucket=BUCKET)
    try:
        with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
            folder = Path(tmp)
            log(f"writing, {a.batches} batches, {a.rounds} round(s), shuffled order")
            write = paired(["gpt2_disk", "gpt2_s3"], a, folder, lambda route, r: f"s3://{BUCKET}/w{r}/captures.h5", log)
            log("writer-bound writing (a linear layer)")
            bound = paired(["linear_disk", "linear_s3"], a, folder, lambda route, r: f"s3://{BUCKET}/l{r}/captures.h5", log)
            log("reading the first round's cache from the bucket")
            read = paired(["read_inorder", "read_shuffled"], a, folder, lambda route, r: f"s3://{BUCKET}/w0/captures.h5", log)
    finally:
        server.stop()
    print(table(a, write, bound, read, started))


def table(a: argparse.Namespace, write: list, bound: list, read: list, started: float) -> str:
    targets = harness.Targets()

    def row(target: str, ratios: list[float], bound: str, ok: bool | None, detail: str) -> None:
        targets.add(target, statistics.median(ratios), bound, ok, detail)

    def cpu(runs: list, kind: str) -> str:
        def m(route: str, key: str) -> float:
            return statistics.median(r[route][key] for r in runs)

        return (f"CPU seconds (medians): hookrun's process {m(f'{kind}_disk', 'cpu'):.1f} to disk, "
                f"{m(f'{kind}_s3', 'cpu'):.1f} to S3, the S3 server {m(f'{kind}_s3', 'server_cpu'):.1f} on the same cores")

    def rate(runs: list, route: str, key: str) -> float:
        return statistics.median(r[route][key] / r[route]["seconds"] for r in runs)

    w = [r["gpt2_disk"]["seconds"] / r["gpt2_s3"]["seconds"] for r in write]
    mb = write[0]["gpt2_disk"]["bytes"] / 1e6
    row("hookrun to a local S3 server / to local disk (tokens/s)", w, ">= 0.90", statistics.median(w) >= 0.9,
        f"{rate(write, 'gpt2_s3', 'tokens'):.0f} vs {rate(write, 'gpt2_disk', 'tokens'):.0f} tokens/s (medians); "
        f"{mb:.0f} MB a run, parts of {a.part_bytes >> 20} MiB; per round {', '.join(f'{x:.3f}' for x in w)}; "
        f"{cpu(write, 'gpt2')}")
    b = [r["linear_disk"]["seconds"] / r["linear_s3"]["seconds"] for r in bound]
    mbb = bound[0]["linear_disk"]["bytes"] / 1e6
    row("writer-bound run: to S3 / to local disk (rows/s)", b, "(info)", None,
        f"{mbb / statistics.median(r['linear_s3']['seconds'] for r in bound):.0f} vs "
        f"{mbb / statistics.median(r['linear_disk']['seconds'] for r in bound):.0f} MB/s; {mbb:.0f} MB a run; "
        f"per round {', '.join(f'{x:.3f}' for x in b)}; {cpu(bound, 'linear')}")
    s = [r["read_inorder"]["seconds"] / r["read_shuffled"]["seconds"] for r in read]
    row("URL loader: shuffled / in order (rows/s)", s, ">= 0.50", statistics.median(s) >= 0.5,
        f"{rate(read, 'read_shuffled', 'rows'):.0f} vs {rate(read, 'read_inorder', 'rows'):.0f} rows/s (medians), "
        f"{read[0]['read_inorder']['rows']} token rows of {D} float32, batches of 4096, parts fetched from the server; "
        f"per round {', '.join(f'{x:.3f}' for x in s)}")
    env = harness.environment(time.time() - started, *harness.module_versions("torch", "h5py", "s3fs", "moto"),
                              threads=f"{a.threads} torch thread(s) per route")
    return harness.report("object_store.py", env, targets.lines(), markdown=a.markdown)


if __name__ == "__main__":
    main()
