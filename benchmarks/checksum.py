"""What the per-batch checksums cost (issue 23.5): `python benchmarks/checksum.py [--quick]`.

Two measurements, each side by side in one process, in alternating rounds (medians of the
paired per-round ratios):
1. the store alone: H5Store.write of GPT-2-sized token rows (6 captures of 1024 x 256 float32 per
   batch), output.checksum true against false: the writer thread's own time;
2. a whole cache run: hookrun.run on a GPT-2-shaped model (4 blocks of d 256, the residual stream
   of every block, rows: token, early_stop), checksum true against false: what a user waits for.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hookrun.store.h5store import H5Store  # noqa: E402
from hookrun.store.records import Capture, CaptureKey, StepRecord  # noqa: E402


def store_seconds(folder: Path, batches: int, checksum: bool) -> float:
    rng = np.random.default_rng(0)
    rows = [torch.from_numpy(rng.standard_normal((1024, 256), dtype=np.float32)) for _ in range(6)]
    path = folder / f"store_{checksum}.h5"
    t = time.perf_counter()
    with H5Store(path, {}, flush_every=8, checksum=checksum) as store:
        for step in range(batches):
            caps = [Capture(CaptureKey("res", f"h.{i}", "forward", "output"), rows[i], False, "float32") for i in range(6)]
            store.write(StepRecord(step, np.arange(step * 1024, (step + 1) * 1024), None, None, caps))
    harness.sync()
    seconds = time.perf_counter() - t
    path.unlink()
    return seconds


def run_seconds(folder: Path, batches: int, checksum: bool) -> float:
    from transformers import GPT2Config, GPT2LMHeadModel

    import hookrun

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=128, vocab_size=4096)).eval()
    data = torch.utils.data.TensorDataset(torch.randint(0, 4096, (batches * 8, 128), generator=torch.Generator().manual_seed(1)))
    cfg = {"data": {"batch_size": 8}, "device": "cpu", "progress": False, "early_stop": True,
           "hooks": {"res": {"at": "transformer.h.*", "type": "forward", "actions": [{"name": "record", "what": "output", "rows": "token"}]}},
           "output": {"path": str(folder / f"run_{checksum}.h5"), "overwrite": True, "checksum": checksum}}
    t = time.perf_counter()
    hookrun.run(cfg, model=model, dataset=data)
    harness.sync()
    return time.perf_counter() - t


def main() -> None:
    p = harness.parser(__doc__)
    harness.int_options(p, rounds=5, batches=40)
    p.add_argument("--quick", action="store_true", help="1 round of 4 batches: checks that it runs")
    a = harness.parse(p, rounds=1, batches=4)
    ratios: dict[str, list[float]] = {"store": [], "run": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for r in range(a.rounds):
            for name, fn in (("store", store_seconds), ("run", run_seconds)):
                order = [False, True] if r % 2 == 0 else [True, False]
                t = {c: fn(folder, a.batches, c) for c in order}
                ratios[name].append(t[True] / t[False])
                print(f"round {r + 1} {name:5s} off {t[False]:.3f} s  on {t[True]:.3f} s  ratio {t[True] / t[False]:.3f}", flush=True)
    for name, values in ratios.items():
        med = statistics.median(values)
        print(f"{name}: checksum on / off = {med:.3f} (median of {len(values)} paired rounds), cost {100 * (med - 1):+.1f}%")


if __name__ == "__main__":
    main()
