"""One activation-cache scenario per process: `python benchmarks/cache_scenarios.py NAME --batches N --dir D`.

Prints one JSON line ({"name", "seconds", "tokens", "bytes", ...}); the parent (benchmarks/cache.py)
reads the child's peak RSS from os.wait4. The model is GPT-2-shaped with random weights (8 blocks of
d_model 256, 4 heads, the real 50257-token vocabulary, 128-token sequences, batches of 8); every
writing route caches the residual stream after blocks 0-5 (six hook points, float32) and stops the
forward after block 5, as SAELens does with stop_at_layer: no route computes blocks 6-7 or the head.
The timed part starts when the model is built and ends when the last byte is written.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

LAYERS, STOP, BATCH, SEQ, D, VOCAB = 8, 6, 8, 128, 256, 50257
POINTS = [f"transformer.h.{i}" for i in range(STOP)]
MODEL: torch.nn.Module | None = None  # built before the clock starts; hookrun's _target_ returns it


def gpt2() -> torch.nn.Module:
    global MODEL
    if MODEL is None:
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        MODEL = GPT2LMHeadModel(GPT2Config(n_layer=LAYERS, n_embd=D, n_head=4, n_positions=SEQ, vocab_size=VOCAB)).eval()
    return MODEL


def tokens(batches: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(torch.randint(0, VOCAB, (batches * BATCH, SEQ), generator=g))


def batches_of(batches: int):
    ids = tokens(batches).tensors[0]
    return [ids[i : i + BATCH] for i in range(0, len(ids), BATCH)]


class Stop(Exception):
    pass


def _stop(m, i, o):
    raise Stop


def _forward_to_block(model, x, hooks=()):
    """The plain-PyTorch early stop: a forward hook on the last block raises."""
    handle = model.transformer.h[STOP - 1].register_forward_hook(_stop)
    try:
        model(x)
    except Stop:
        pass
    finally:
        handle.remove()


def _result(t: float, batches: int, out: Path) -> dict:
    size = sum(p.stat().st_size for p in out.rglob("*")) if out.is_dir() else out.stat().st_size if out.exists() else 0
    return {"seconds": time.perf_counter() - t, "tokens": batches * BATCH * SEQ, "bytes": size}


# -- writing routes ----------------------------------------------------------------------------
def s_bare(batches: int, out: Path) -> dict:
    """The forward alone, stopped after block 5: what caching is measured against."""
    model, data = gpt2(), batches_of(batches)
    t = time.perf_counter()
    with torch.no_grad():
        for x in data:
            _forward_to_block(model, x)
    return _result(t, batches, out)


def s_hookrun(batches: int, out: Path) -> dict:
    """hookrun.run: record the six blocks' outputs, early_stop, the file written by the writer thread."""
    import hookrun

    gpt2()
    cfg = {"model": {"_target_": "cache_scenarios.gpt2"},
           "data": {"dataset": {"_target_": "cache_scenarios.tokens", "batches": batches}, "batch_size": BATCH},
           "hooks": {"res": {"at": POINTS, "type": "forward", "actions": [{"name": "record", "what": "output"}]}},
           "early_stop": True, "device": "cpu", "progress": False, "output": {"path": str(out), "overwrite": True}}
    t = time.perf_counter()
    hookrun.run(cfg)
    return _result(t, batches, out)


def s_hooks_torch_save(batches: int, out: Path) -> dict:
    """Plain forward hooks into a dict, torch.save of the six tensors per batch (the tutorial way, streamed)."""
    model, data = gpt2(), batches_of(batches)
    out.mkdir()
    got: dict[str, torch.Tensor] = {}
    for name in POINTS:
        model.get_submodule(name).register_forward_hook(
            lambda m, i, o, name=name: got.__setitem__(name, (o[0] if isinstance(o, tuple) else o).detach().clone()))
    t = time.perf_counter()
    with torch.no_grad():
        for step, x in enumerate(data):
            _forward_to_block(model, x)
            torch.save(got, out / f"batch{step}.pt")
    return _result(t, batches, out)


def s_transformer_lens(batches: int, out: Path) -> dict:
    """TransformerLens' TransformerBridge.run_with_cache(names_filter, stop_at_layer=6) + torch.save per batch."""
    from tokenizers import Tokenizer, models
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import PreTrainedTokenizerFast

    model, data = gpt2(), batches_of(batches)
    with tempfile.TemporaryDirectory() as tok_dir:  # the bridge reloads its tokenizer from a folder
        PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"t0": 0}, unk_token="t0")),
                                unk_token="t0", pad_token="t0").save_pretrained(tok_dir)
        tok = PreTrainedTokenizerFast.from_pretrained(tok_dir)
        bridge = TransformerBridge.boot_transformers("gpt2", hf_model=model, tokenizer=tok)
    names = {f"blocks.{i}.hook_resid_post" for i in range(STOP)}
    out.mkdir()
    t = time.perf_counter()
    with torch.no_grad():
        for step, x in enumerate(data):
            _, cache = bridge.run_with_cache(x, names_filter=lambda n: n in names, stop_at_layer=STOP)
            torch.save({k: v for k, v in cache.items()}, out / f"batch{step}.pt")
    return _result(t, batches, out)


def s_nnsight(batches: int, out: Path) -> dict:
    """nnsight: trace + nnsight.save of the six outputs, tracer.stop(), torch.save per batch."""
    from nnsight import NNsight
    from nnsight_route import trace_batch  # the trace body must live in a file nnsight can read

    model, data = gpt2(), batches_of(batches)
    wrapped = NNsight(model)
    out.mkdir()
    t = time.perf_counter()
    with torch.no_grad():
        for step, x in enumerate(data):
            torch.save(dict(zip(POINTS, trace_batch(wrapped, x, STOP), strict=True)), out / f"batch{step}.pt")
    return _result(t, batches, out)


def s_datasets(batches: int, out: Path, shard_batches: int = 8) -> dict:
    """SAELens' format: plain hooks, rows buffered per shard, Dataset.from_dict(Array2D).save_to_disk."""
    import datasets

    model, data = gpt2(), batches_of(batches)
    features = datasets.Features({n: datasets.Array2D(shape=(SEQ, D), dtype="float32") for n in POINTS})
    got: dict[str, torch.Tensor] = {}
    for name in POINTS:
        model.get_submodule(name).register_forward_hook(
            lambda m, i, o, name=name: got.__setitem__(name, (o[0] if isinstance(o, tuple) else o).detach().clone()))
    datasets.disable_progress_bars()
    out.mkdir()
    buffer: dict[str, list] = {n: [] for n in POINTS}
    t = time.perf_counter()
    with torch.no_grad():
        for step, x in enumerate(data):
            _forward_to_block(model, x)
            for n in POINTS:
                buffer[n].append(got[n].numpy())
            if len(buffer[POINTS[0]]) == shard_batches or step == len(data) - 1:
                shard = datasets.Dataset.from_dict({n: np.concatenate(v) for n, v in buffer.items()}, features=features)
                shard.save_to_disk(str(out / f"shard{step // shard_batches:05d}"))
                buffer = {n: [] for n in POINTS}
    return _result(t, batches, out)


def main() -> None:
    from cache_reads import READERS

    p = argparse.ArgumentParser()
    p.add_argument("name")
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--rows", type=int, default=0, help="reader scenarios: token rows in the file")
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    if a.name in READERS:
        result = READERS[a.name](a.rows, a.dir)
    else:
        out = a.dir / f"{a.name}_{os.getpid()}"
        out = out.with_suffix(".h5") if a.name == "hookrun" else out
        try:
            result = globals()[f"s_{a.name}"](a.batches, out)
        finally:
            shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink(missing_ok=True)
    print(json.dumps({"name": a.name, "batches": a.batches, **result}))


if __name__ == "__main__":
    main()
