"""Ranks: which process of a data-parallel run this is, its shard of the batches, and a shared store.

    r = detect()                      # Ranks(rank=1, world=2, local_rank=1, launcher='torchrun', ...)
    shard_batches(10, r.world, r.rank)  # range(5, 10): a contiguous block of whole batches

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; submitit (Hydra's submitit launchers) and srun set
SUBMITIT_LOCAL_* or SLURM_* per task. One process (world 1) is the ordinary run. The ranks talk
through a torch.distributed key-value store (torchrun's TCP store, or a FileStore in the run folder
for submitit and srun): no process group and no collective is needed, so a rank that dies never
leaves the others stuck inside a collective call.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from hookrun.errors import ConfigError, RunError

HANDSHAKE_SECONDS = 900  # how long a rank waits for the others to start


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    launcher: str = "single"  # single | torchrun | submitit | slurm
    job: str = ""  # the launch's id: keys and rendezvous files are unique to it

    @property
    def many(self) -> bool:
        return self.world > 1


def detect(environ: Mapping[str, str] = os.environ) -> Ranks:
    """The rank of this process, from the launcher's environment variables."""
    e = environ
    if "RANK" in e and "WORLD_SIZE" in e and ("TORCHELASTIC_RUN_ID" in e or "MASTER_ADDR" in e):
        job = f"{e.get('TORCHELASTIC_RUN_ID', 'torchrun')}.{e.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        return _ranks(e, "RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun", job)
    if "SUBMITIT_LOCAL_JOB_ID" in e and "SUBMITIT_LOCAL_NTASKS" in e:
        return _ranks(e, "SUBMITIT_LOCAL_GLOBALID", "SUBMITIT_LOCAL_NTASKS", "SUBMITIT_LOCAL_LOCALID", "submitit",
                      "local-" + e["SUBMITIT_LOCAL_JOB_ID"])
    if "SLURM_PROCID" in e and "SLURM_STEP_NUM_TASKS" in e:  # a task of an srun step (submitit_slurm runs one)
        # a requeued job keeps its id and numbers its steps from 0 again: its restart count tells the launches apart
        job = f"{e.get('SLURM_JOB_ID', '')}.{e.get('SLURM_STEP_ID', '')}.{e.get('SLURM_RESTART_COUNT', '0')}"
        return _ranks(e, "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "slurm", job)
    return Ranks()


def _ranks(e: Mapping[str, str], rank: str, world: str, local: str, launcher: str, job: str) -> Ranks:
    try:
        r = Ranks(int(e[rank]), int(e[world]), int(e.get(local, "0")), launcher, job)
    except ValueError:
        raise ConfigError(f"{launcher}: {rank}={e.get(rank)!r}, {world}={e.get(world)!r} are not whole numbers") from None
    if not 0 <= r.rank < r.world:
        raise ConfigError(f"{launcher}: rank {r.rank} is outside the world size {r.world}")
    return r


def shard_batches(n_batches: int, world: int, rank: int) -> range:
    """The contiguous block of batches rank `rank` of `world` runs (where the batches do not divide
    evenly, the last ranks get one more: 5 batches over 2 ranks are 0-1 and 2-4). Whole batches, so every batch is the batch a one-process
    run has: the same samples together, the same numbers bit for bit."""
    if world > n_batches:
        raise every_rank(ConfigError(
            f"the run has {world} processes (--nproc_per_node x nodes, or tasks) but only {n_batches} "
            f"batch(es) of data.batch_size: each process needs at least one; run at most {n_batches} "
            f"processes, or more batches (data.limit, a smaller data.batch_size)"
        ))
    return range(rank * n_batches // world, (rank + 1) * n_batches // world)


def every_rank(exc: Exception) -> Exception:
    """Mark an error that every rank raises alike (the CLI prints it on rank 0 only)."""
    exc.every_rank = True  # type: ignore[attr-defined]
    return exc


def shard_path(path: Path, rank: int) -> Path:
    """captures.h5 -> captures.rank-00001.h5 (rank 1's file, beside the merged view)."""
    return path.with_name(f"{path.stem}.rank-{rank:05d}{path.suffix}")


def rank_device(name: str, local_rank: int) -> str:
    """`auto` and `cuda` mean this rank's own GPU, cuda:LOCAL_RANK, where there are GPUs (modulo the
    GPUs this process sees: a Slurm task bound to one GPU sees it as cuda:0)."""
    name = str(name).strip()
    if name in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{local_rank % torch.cuda.device_count()}"
    if name == "auto":
        return "cpu"
    return name


def open_store(r: Ranks, folder: Path) -> dist.Store:
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


def gather(store: dist.Store, r: Ranks, key: str, value: str) -> list[str]:
    """Every rank's `value`, in rank order (waits for each up to HANDSHAKE_SECONDS)."""
    store.set(f"{key}/{r.rank}", value)
    out = []
    for other in range(r.world):
        try:
            out.append(store.get(f"{key}/{other}").decode())
        except RuntimeError:
            raise RunError(f"rank {other} of {r.world} did not start within {HANDSHAKE_SECONDS} s") from None
    return out


def agree_on_start(r: Ranks, sweep: bool = False) -> str | None:
    """Rank 0's start time, 'YYYY-mm-dd/HH-MM-SS', the same on every rank of torchrun or of an srun
    step: the default run folder outputs/DATE/TIME does not split across ranks that start a second
    apart (an srun step's ranks agree through a FileStore in the working folder, which they share)."""
    mine = free_start(sweep) if r.rank == 0 else None
    try:
        store = open_store(r, Path("."))
    except (RuntimeError, OSError):
        if r.launcher == "torchrun":
            raise
        return None  # srun from a folder it cannot write: no outputs/DATE/TIME there either (hydra.run.dir is)
    return share_from_rank0(store, "start", mine)


def free_start(sweep: bool = False, claim: bool = False) -> str:
    """The default run folder's name, 'YYYY-mm-dd/HH-MM-SS', or 'HH-MM-SS-2', '-3', ... where a run that
    started in the same second has it (outputs/DATE/TIME, or outputs/multirun/DATE/TIME for -m): two
    runs a second apart, one after the other, would otherwise share the folder and the second be refused
    ('output.path ... exists'). With `claim` the folder is made here (os.mkdir: one process wins a name),
    so two commands started in the same second side by side take two folders; a folder that cannot be
    made for another reason is left to Hydra's mkdir and its one line."""
    stamp = dt.datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
    base, n = Path("outputs", *(["multirun"] if sweep else [])), 1
    while True:
        folder = base / (name := stamp if n == 1 else f"{stamp}-{n}")
        if not claim:
            if not folder.exists():
                return name
        else:
            try:
                folder.parent.mkdir(parents=True, exist_ok=True)
                folder.mkdir()
                return name
            except FileExistsError:
                pass
            except OSError:
                return name
        n += 1


def share_start(r: Ranks, sweep: bool, claim: bool = False) -> bool:
    """Sets HOOKRUN_STARTED, the DATE/TIME of conf/config.yaml's default run folder, unless it is set:
    every rank (of torchrun, or an srun step) takes rank 0's, even when they start seconds apart; one
    process takes free_start's (with `claim`, made there). Returns whether it set it (the caller unsets
    it after the run, and removes a claimed folder the run left empty)."""
    if "HOOKRUN_STARTED" in os.environ:
        return False
    if r.launcher in ("torchrun", "slurm") and r.many:
        started = agree_on_start(r, sweep)
        if started is None:  # an srun step in a folder it cannot write
            return False
    else:
        started = free_start(sweep, claim)
    os.environ["HOOKRUN_STARTED"] = started
    return True


def release_start(sweep: bool, claimed: bool) -> None:
    """After the run: HOOKRUN_STARTED unset (the next run of this process, a notebook's or a test's, picks
    its own folder), and a folder free_start claimed that the run left empty (a config's hydra.run.dir, a
    refused or dry run) removed, with the date folders above it while they are empty."""
    started = os.environ.pop("HOOKRUN_STARTED", None)
    if not (claimed and started):
        return
    folder, top = Path("outputs", *(["multirun"] if sweep else []), started), Path("outputs")
    for f in [folder, *folder.parents]:
        try:
            f.rmdir()  # (refused while the folder holds anything)
        except OSError:
            return
        if f == top:
            return
