"""What early_stop costs against the bare body it runs: `python benchmarks/early_stop.py`.

A GPT-2-shaped random-init model (8 blocks of n_embd 256, 4 heads, the real 50257-token vocabulary,
so the LM head costs about 14 blocks a token: benchmarks/peer_routes.py's), 12 batches of 8 x 128
random tokens, hooked after block STOP-1 (`--stop`, default 6: blocks 0-5, as cache_peers.py):

| route | what it computes |
|---|---|
| `bare_body` | a plain loop: `wte + wpe` and blocks 0..STOP-1 called directly, the last one's output kept |
| `bare_cut` | a plain loop of `model(ids)` cut after block STOP-1 by a forward hook that raises (the model's own forward: its mask and position set-up) |
| `early_stop` | `hookrun.run`: `record` on `transformer.h.{STOP-1}`, `early_stop: true`, a local file |
| `full_probe` | the same run with the probe of before issue 34 (one sample through the whole model, the head included): `probe_guard` patched to None for this route only |
| `bare_full` | a plain loop of the whole forward (`model(ids)`), the hidden state of block STOP-1 kept by a hook |
| `full_forward` | `hookrun.run`: the same hook without early_stop (the whole forward, head included) |

The routes run in one process after a warm-up, every round in a shuffled order; each ratio is the
median of the per-round ratios, by wall clock and by the process's CPU time (all threads: the
writer's and the store helper's own process is not counted, its start is).

    python benchmarks/early_stop.py                      # 9 rounds (a few minutes on 2 cores)
    python benchmarks/early_stop.py --no-full            # early_stop's pairs only (the full forward is 5x longer)
    python benchmarks/early_stop.py --quick              # a smoke run: 1 batch, 1 round
    python benchmarks/early_stop.py --markdown docs/benchmarks/early-stop.md
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's hookrun, not an installed one

import harness  # noqa: E402
import torch  # noqa: E402

LAYERS, D, HEADS, VOCAB, SEQ, BATCH = 8, 256, 4, 50257, 128, 8


class Stop(Exception):
    pass


def _raise_stop(module, args, output):
    raise Stop


def build(stop: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=LAYERS, n_embd=D, n_head=HEADS, n_positions=SEQ, vocab_size=VOCAB)
    return GPT2LMHeadModel(cfg).eval()


def routes(a, folder: Path) -> dict:
    import hookrun

    model = build(a.stop)
    ids = torch.randint(0, VOCAB, (a.batches * BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    dataset = torch.utils.data.TensorDataset(ids)
    where = f"transformer.h.{a.stop - 1}"
    hooks = {"h": {"at": where, "type": "forward", "actions": [{"name": "record", "what": "output", "rows": "token"}]}}
    t = model.transformer
    pos = torch.arange(SEQ)

    def bare_body() -> None:
        with torch.no_grad():
            for i in range(0, len(ids), BATCH):
                h = t.wte(ids[i:i + BATCH]) + t.wpe(pos)
                for block in t.h[:a.stop]:
                    out = block(h)
                    h = out[0] if isinstance(out, tuple) else out

    def bare_cut() -> None:
        handle = t.h[a.stop - 1].register_forward_hook(_raise_stop)
        try:
            with torch.no_grad():
                for i in range(0, len(ids), BATCH):
                    try:
                        model(ids[i:i + BATCH])
                    except Stop:
                        pass
        finally:
            handle.remove()

    def bare_full() -> None:
        kept = []
        handle = t.h[a.stop - 1].register_forward_hook(lambda m, i, o: kept.append(o[0] if isinstance(o, tuple) else o))
        try:
            with torch.no_grad():
                for i in range(0, len(ids), BATCH):
                    model(ids[i:i + BATCH])
        finally:
            handle.remove()

    def run(early: bool, full_probe: bool = False):
        def go() -> None:
            # HookSession.probe imports probe_guard from hooks/early_stop.py when it runs: patched there
            from hookrun.hooks import early_stop

            guard = early_stop.probe_guard
            if full_probe:  # the probe as it was: nothing it may stop at
                early_stop.probe_guard = lambda model, targets: None
            cfg = {"data": {"batch_size": BATCH}, "device": "cpu", "progress": False, "early_stop": early,
                   "hooks": hooks, "output": {"path": str(folder / "es.h5"), "overwrite": True}}
            try:
                hookrun.run(cfg, model=model, dataset=dataset)
            finally:
                early_stop.probe_guard = guard
        return go

    full = {} if a.no_full else {"bare_full": bare_full, "full_forward": run(False)}
    return {"bare_body": bare_body, "bare_cut": bare_cut, "early_stop": run(True), "full_probe": run(True, True), **full}


def main() -> None:
    p = harness.parser(__doc__)
    harness.int_options(p, batches=12, rounds=9, stop=6)
    p.add_argument("--no-full", action="store_true", help="leave out the full-forward pair (bare_full, full_forward)")
    harness.quick_and_markdown(p, "1 batch, 1 round: checks that every route runs", "append the results table to this file")
    a = harness.parse(p, batches=1, rounds=1)
    torch.set_num_threads(1)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        r = harness.paired_rounds(routes(a, Path(tmp)), a.rounds, harness.seeded_shuffle())
    targets = harness.Targets()
    pairs = [("early_stop", "bare_body", 1.10), ("full_probe", "bare_body", None), ("bare_cut", "bare_body", None),
             ("early_stop", "bare_cut", None)]
    pairs += [] if a.no_full else [("full_forward", "bare_full", 1.05)]
    for num, den, target in pairs:
        w, c = harness.ratio(r.wall, num, den), harness.ratio(r.cpu, num, den)
        rounds = ", ".join(f"{x / y:.2f}" for x, y in zip(r.wall[num], r.wall[den], strict=True))
        targets.add(f"{num} / {den} (wall)", w, f"<= {target}" if target else "(info)", w <= target if target else None,
                    f"rounds {rounds}; median {statistics.median(r.wall[num]):.2f} / {statistics.median(r.wall[den]):.2f} s; "
                    f"by CPU time {c:.3f} ({statistics.median(r.cpu[num]):.2f} / {statistics.median(r.cpu[den]):.2f} s)")
    env = harness.environment(time.time() - started, *harness.module_versions("torch", "transformers"),
                              threads="1 torch thread")
    print(harness.report("early_stop.py", env, targets.lines(), markdown=a.markdown, append=True))


if __name__ == "__main__":
    main()
