"""The routes of benchmarks/cache_peers.py: one activation cache, written six ways.

    routes = Routes(device="cpu", points=1)       # the model and tokens: built once, before any clock
    routes.prepare(["bare", "hookrun"], folder)   # each route's own set-up (a bridge, a wrapper), untimed
    result = routes.run("hookrun", batches=32, out=folder / "x")   # {"seconds", "tokens", "bytes", "check"}

The model is GPT-2-shaped with random weights (seed 0: every process builds the same one): 8 blocks
of d_model 256, 4 heads, the real 50257-token vocabulary, 128-token sequences, batches of 8. Every
route caches the residual stream after the last `points` blocks up to block 5 (`points=1`: block 5
alone, the one hook point SAELens' runner takes) for every token, and computes nothing after block 5
(no blocks 6-7, no head: FACTS.md). The clock starts once the model and the route's own wrapper
exist (TransformerLens' bridge, nnsight's NNsight, SAELens' HookedTransformer) and stops when the
last byte is written. After the clock each route reads its own output back and returns a check of
its first batch (sum of |x|, two values), which the coordinator compares with the bare forward's.
"""

from __future__ import annotations

import copy
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

LAYERS, STOP, BATCH, SEQ, D, HEADS, VOCAB = 8, 6, 8, 128, 256, 4, 50257
TOKENS_PER_BATCH = BATCH * SEQ
BUCKET = "hookrun-bench"
# the library each route needs in the process that runs it; "hookrun_s3" also needs AWS_ENDPOINT_URL
NEEDS = {"bare": ["torch"], "hookrun": ["hookrun", "h5py"], "hookrun_s3": ["hookrun", "s3fs"],
         "transformer_lens": ["transformer_lens.model_bridge"], "nnsight": ["nnsight"],
         "saelens": ["sae_lens", "datasets"]}


class Stop(Exception):
    pass


def _raise_stop(module, args, output):
    raise Stop


def check_of(x: torch.Tensor) -> list[float]:
    """A route's first batch, (8 x 128, 256) token rows: sum of |x| and the first and last values."""
    x = x.detach().to("cpu", torch.float64).reshape(-1, D)
    return [float(x.abs().sum()), float(x[0, 0]), float(x[-1, -1])]


def clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def since(t: tuple[float, float]) -> dict:
    """Wall-clock seconds and this process's CPU seconds (every thread's: hookrun's writer too)."""
    return {"seconds": time.perf_counter() - t[0], "cpu_s": time.process_time() - t[1]}


def size_of(out: Path) -> int:
    if out.is_dir():
        return sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return out.stat().st_size if out.exists() else 0


class Routes:
    def __init__(self, device: str = "cpu", points: int = 1) -> None:
        self.device = torch.device(device)
        self.blocks = list(range(STOP - points, STOP))
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        cfg = GPT2Config(n_layer=LAYERS, n_embd=D, n_head=HEADS, n_positions=SEQ, vocab_size=VOCAB)
        built = GPT2LMHeadModel(cfg).eval().to(self.device)
        # every route runs a deep copy made the same way (nnsight and TransformerLens need their own):
        # a freshly built module and its deep copy differ by about 0.7% in forward time on this CPU
        self.model = copy.deepcopy(built)
        self.wrappers: dict = {}

    def tokens(self, batches: int) -> torch.Tensor:
        """The same token ids in every process and route: (batches * 8, 128) int64, seed 1."""
        g = torch.Generator().manual_seed(1)
        return torch.randint(0, VOCAB, (batches * BATCH, SEQ), generator=g)

    def prepare(self, routes: list[str], folder: Path) -> None:
        for name in routes:
            getattr(self, f"prepare_{name}", lambda folder: None)(folder)

    def run(self, name: str, batches: int, out: Path) -> dict:
        """One timed run of a route, then (untimed) the check of its first batch; `out` is removed."""
        ids = self.tokens(batches)
        try:
            seconds, check, size = getattr(self, f"r_{name}")(ids, out)
        finally:
            shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink(missing_ok=True)
        return {**seconds, "tokens": batches * TOKENS_PER_BATCH, "bytes": size, "check": check}

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -- the bare forward: the bound ----------------------------------------------------------
    def r_bare(self, ids: torch.Tensor, out: Path):
        """The forward alone, cut after block 5 by a forward hook that raises."""
        block = self.model.transformer.h[STOP - 1]
        t = clock()
        with torch.no_grad():
            for x in ids.split(BATCH):
                handle = block.register_forward_hook(_raise_stop)
                try:
                    self.model(x.to(self.device))
                except Stop:
                    pass
                finally:
                    handle.remove()
        self._sync()
        seconds = since(t)
        got = []  # the reference: the same first batch through plain forward hooks
        handles = [self.model.transformer.h[b].register_forward_hook(
            lambda m, i, o: got.append(o[0] if isinstance(o, tuple) else o)) for b in self.blocks]
        handles.append(block.register_forward_hook(_raise_stop))  # after the others: they fire first
        try:
            with torch.no_grad():
                self.model(ids[:BATCH].to(self.device))
        except Stop:
            pass
        finally:
            for h in handles:
                h.remove()
        return seconds, check_of(torch.stack(got, 1).movedim(1, 2)), 0

    # -- hookrun ------------------------------------------------------------------------------
    def _hookrun_cfg(self, path: str, **output) -> dict:
        at = [f"transformer.h.{b}" for b in self.blocks]
        return {"data": {"batch_size": BATCH}, "early_stop": True, "device": str(self.device), "progress": False,
                "hooks": {"res": {"at": at, "type": "forward",
                                  "actions": [{"name": "record", "what": "output", "rows": "token"}]}},
                "output": {"path": path, "overwrite": True, **output}}

    def r_hookrun(self, ids: torch.Tensor, out: Path):
        """hookrun.run: record with rows: token, early_stop, the file written by the writer thread."""
        import h5py

        import hookrun

        out = out.with_suffix(".h5")
        data = torch.utils.data.TensorDataset(ids)
        t = clock()
        hookrun.run(self._hookrun_cfg(str(out)), model=self.model, dataset=data)
        seconds = since(t)
        with h5py.File(out, "r") as f:
            rows = [f[f"captures/res/transformer.h.{b}/output"][:TOKENS_PER_BATCH] for b in self.blocks]
        return seconds, check_of(torch.from_numpy(_stack_rows(rows))), size_of(out)

    def prepare_hookrun_s3(self, folder: Path) -> None:
        import s3fs

        self.s3 = s3fs.S3FileSystem()
        self.s3_runs = 0

    def r_hookrun_s3(self, ids: torch.Tensor, out: Path):
        """hookrun.run to s3://hookrun-bench/...: parts staged locally, uploaded while the next is written."""
        import hookrun

        self.s3_runs += 1
        prefix = f"{BUCKET}/run{os.getpid()}-{self.s3_runs}"
        data = torch.utils.data.TensorDataset(ids)
        out.mkdir(parents=True, exist_ok=True)
        cfg = self._hookrun_cfg(f"s3://{prefix}/cache.h5", staging=str(out), part_bytes=int(os.environ["BENCH_PART_BYTES"]))
        t = clock()
        hookrun.run(cfg, model=self.model, dataset=data)
        seconds = since(t)
        size = sum(self.s3.du(prefix, total=False).values())
        self.s3.rm(prefix, recursive=True)  # moto keeps objects in memory: leave nothing behind
        return seconds, None, size

    # -- TransformerLens 4: the bridge over the same HF model ---------------------------------
    def prepare_transformer_lens(self, folder: Path) -> None:
        from tokenizers import Tokenizer, models
        from transformer_lens.model_bridge import TransformerBridge
        from transformers import PreTrainedTokenizerFast

        with tempfile.TemporaryDirectory(dir=folder) as tok_dir:  # the bridge reloads its tokenizer from a folder
            PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"t0": 0}, unk_token="t0")),
                                    unk_token="t0", pad_token="t0").save_pretrained(tok_dir)
            tok = PreTrainedTokenizerFast.from_pretrained(tok_dir)
            # a copy: the bridge replaces the model's blocks in place and switches its attention to eager
            hf_model = copy.deepcopy(self.model)
            self.wrappers["transformer_lens"] = TransformerBridge.boot_transformers("gpt2", hf_model=hf_model, tokenizer=tok)

    def r_transformer_lens(self, ids: torch.Tensor, out: Path):
        """run_with_cache(names_filter, stop_at_layer=6) + torch.save of the cache per batch."""
        bridge = self.wrappers["transformer_lens"]
        names = [f"blocks.{b}.hook_resid_post" for b in self.blocks]
        out.mkdir()
        t = clock()
        with torch.no_grad():
            for step, x in enumerate(ids.split(BATCH)):
                _, cache = bridge.run_with_cache(x.to(self.device), names_filter=names, stop_at_layer=STOP)
                torch.save({n: cache[n].cpu() for n in names}, out / f"batch{step:05d}.pt")
        seconds = since(t)
        first = torch.load(out / "batch00000.pt")
        return seconds, check_of(torch.stack([first[n] for n in names], -2)), size_of(out)

    # -- nnsight 0.8 ---------------------------------------------------------------------------
    def prepare_nnsight(self, folder: Path) -> None:
        from nnsight import NNsight

        self.wrappers["nnsight"] = NNsight(copy.deepcopy(self.model))  # a copy: nnsight patches the modules' forward

    def r_nnsight(self, ids: torch.Tensor, out: Path):
        """trace + nnsight.save of the blocks' outputs + tracer.stop(), torch.save per batch."""
        # nnsight compiles a `with` block from its source file: the trace lives in nnsight_route.py
        from nnsight_route import trace_blocks

        wrapped = self.wrappers["nnsight"]
        out.mkdir()
        t = clock()
        with torch.no_grad():
            for step, x in enumerate(ids.split(BATCH)):
                outs = trace_blocks(wrapped, x.to(self.device), self.blocks)
                torch.save({f"blocks.{b}": o.cpu() for b, o in zip(self.blocks, outs, strict=True)}, out / f"batch{step:05d}.pt")
        seconds = since(t)
        first = torch.load(out / "batch00000.pt")
        return seconds, check_of(torch.stack([first[f"blocks.{b}"] for b in self.blocks], -2)), size_of(out)

    # -- SAELens 6: its own CacheActivationsRunner over TransformerLens 3's HookedTransformer ---
    def prepare_saelens(self, folder: Path) -> None:
        from sae_lens_route import hooked_gpt2

        if len(self.blocks) != 1:
            raise RuntimeError("SAELens' CacheActivationsRunner caches one hook point: run with --points 1")
        self.wrappers["saelens"] = hooked_gpt2(self.model, SEQ)  # (an environment with SAELens may run the others too)

    def r_saelens(self, ids: torch.Tensor, out: Path):
        """CacheActivationsRunner(cfg, override_dataset=the tokens).run(): Arrow shards of 8 batches."""
        from sae_lens_route import cache_with_runner, read_first, token_dataset

        hook, batches = f"blocks.{STOP - 1}.hook_resid_post", len(ids) // BATCH
        ds = token_dataset(ids)  # the data as SAELens takes it, made before the clock (hookrun's too)
        t = clock()
        cache_with_runner(ds, len(ids), SEQ, hook, D, BATCH, math.gcd(batches, 8), str(self.device), out)
        seconds = since(t)
        return seconds, check_of(read_first(out, hook, BATCH)), size_of(out)


def _stack_rows(rows: list) -> np.ndarray:
    return np.stack(rows, 1)  # (tokens, points, D)
