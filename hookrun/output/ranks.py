"""Many ranks: the key-value store they share, each rank's device and its shard file's name.

    r = detect()                      # Ranks(rank=1, world=2, local_rank=1, launcher='torchrun', ...): output/process.py
    shard_path(Path("captures.h5"), r.rank)   # captures.rank-00001.h5 (which batches: shards.py's shard_batches)

Loaded only where a run has many ranks (one process needs only output/process.py's Ranks, the `r`
below; this module never imports it, as process.py asks it for the start only with many ranks: agree_on_start). The ranks
talk through a torch.distributed key-value store (torchrun's TCP store, or a FileStore in the run
folder for submitit and srun): no process group and no collective is needed, so a rank that dies
never leaves the others stuck inside a collective call.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hookrun.errors import RunError

HANDSHAKE_SECONDS = 900  # how long a rank waits for the others to start


def shard_path(path: Path, rank: int) -> Path:
    """captures.h5 -> captures.rank-00001.h5 (rank 1's file, beside the merged view)."""
    return path.with_name(f"{path.stem}.rank-{rank:05d}{path.suffix}")


def agree_on_start(r: Any, mine: str | None) -> str | None:
    """Rank 0's start time (`mine` on rank 0: output/process.py's free_start), 'YYYY-mm-dd/HH-MM-SS', the same
    on every rank of torchrun or of an srun step: the default run folder outputs/DATE/TIME does not split across
    ranks that start a second apart (an srun step's ranks agree through a FileStore in the working folder, which
    they share); None where an srun step's folder cannot be written."""
    try:
        store = open_store(r, Path("."))
    except (RuntimeError, OSError):
        if r.launcher == "torchrun":
            raise
        return None  # srun from a folder it cannot write: no outputs/DATE/TIME there either (hydra.run.dir is)
    return share_from_rank0(store, "start", mine)


def rank_device(name: str, local_rank: int) -> str:
    """`auto` and `cuda` mean this rank's own GPU, cuda:LOCAL_RANK, where there are GPUs (modulo the
    GPUs this process sees: a Slurm task bound to one GPU sees it as cuda:0)."""
    name = str(name).strip()
    if name in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{local_rank % torch.cuda.device_count()}"
    if name == "auto":
        return "cpu"
    return name


def open_store(r: Any, folder: Path) -> dist.Store:
    """The key-value store the ranks share: torchrun's own TCP store, else a FileStore in `folder`
    (the shared run folder: a file system every task sees)."""
    timeout = dt.timedelta(seconds=HANDSHAKE_SECONDS)
    if r.launcher == "torchrun":
        host, port = os.environ.get("MASTER_ADDR", "localhost"), int(os.environ.get("MASTER_PORT", "29500"))
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        try:
            store = dist.TCPStore(host, port, r.world, is_master=(r.rank == 0 and not agent), timeout=timeout,
                                  wait_for_workers=False)
        except (RuntimeError, OSError) as exc:
            raise RunError(f"torchrun: cannot reach the rendezvous store at {host}:{port}: {exc}") from None
    else:
        folder.mkdir(parents=True, exist_ok=True)
        store = dist.FileStore(str(folder / f".hookrun-ranks-{r.job}"), r.world)
        store.set_timeout(timeout)
    return dist.PrefixStore(f"hookrun/{r.job}/", store)


def share_from_rank0(store: dist.Store, key: str, value: str | None) -> str:
    """Rank 0 passes `value`; every rank gets rank 0's value (waits for it up to HANDSHAKE_SECONDS)."""
    if value is not None:
        store.set(key, value)
    try:
        return store.get(key).decode()
    except RuntimeError:
        raise RunError(f"rank 0 did not send {key!r} within {HANDSHAKE_SECONDS} s: did it start?") from None


def gather(store: dist.Store, r: Any, key: str, value: str) -> list[str]:
    """Every rank's `value`, in rank order (waits for each up to HANDSHAKE_SECONDS)."""
    store.set(f"{key}/{r.rank}", value)
    out = []
    for other in range(r.world):
        try:
            out.append(store.get(f"{key}/{other}").decode())
        except RuntimeError:
            raise RunError(f"rank {other} of {r.world} did not start within {HANDSHAKE_SECONDS} s") from None
    return out
