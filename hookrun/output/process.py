"""This process: which rank of a launch it is, when its run started, and its clean stops on signals.

    r = detect()        # Ranks(rank=1, world=2, local_rank=1, launcher='torchrun', ...); Ranks() for one process

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; submitit (Hydra's submitit launchers) and srun set
SUBMITIT_LOCAL_* or SLURM_* per task. One process (world 1) is the ordinary run; what many ranks
share (their key-value store: output/ranks.py; their shards of the batches: output/shards.py) is
loaded only then. An error every rank raises alike is marked so (every_rank). share_start names
the default run folder, outputs/DATE/TIME, the same on every rank.

Clean stops: within the block, SIGINT or SIGTERM asks the loop to stop after the batch in flight.

    with StopSignals() as stop:
        for batch in ...:
            ...
            if stop.requested():
                break
    if stop.signum: raise Interrupted(stop.signum, path, steps)

A second signal stops at once: it raises KeyboardInterrupt (SIGTERM too), and the caller closes
the file after the writer thread has ended. Within `stop.shielded()` (closing the file) a signal
only says to wait. Handlers are only installed from the main thread (Python's rule); elsewhere
the block does nothing.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hookrun.errors import ConfigError, HookrunError

log = logging.getLogger("hookrun")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


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


def every_rank(exc: Exception) -> Exception:
    """Mark an error that every rank raises alike (the CLI prints it on rank 0 only)."""
    exc.every_rank = True  # type: ignore[attr-defined]
    return exc


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
        from hookrun.output.ranks import agree_on_start

        started = agree_on_start(r, free_start(sweep) if r.rank == 0 else None)
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


class Interrupted(HookrunError):
    """The run stopped on a signal; exit status 128 + signal number. `path` is None where it stopped
    before the output file was created (nothing was written); `unit` is what the kind calls a step."""

    def __init__(self, signum: int, path: Path | None, steps: int, resumed_from: Path | None = None,
                 unit: str = "batches") -> None:
        name = signal.Signals(signum).name
        if path is not None:
            text = (f"interrupted by {name} after {steps} {unit}; {path} is marked 'interrupted': "
                    f"run the same command with resume=true (and the same {_folder_key()}) to go on")
        elif resumed_from is not None:
            text = f"interrupted by {name} before the run began; {resumed_from} is as it was (resume=true goes on from it)"
        else:
            text = f"interrupted by {name} before the output file was created; nothing was written"
        super().__init__(text)
        self.signum = signum
        self.exit_code = 128 + signum


def _folder_key() -> str:
    """The key that names the run's folder again: a job of a sweep (any launcher) is found by its sweep's."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return "hydra.sweep.dir" if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN \
            else "hydra.run.dir"
    except Exception:  # (no Hydra run: hookrun.run from Python)
        return "hydra.run.dir"


class StoreAway(Interrupted):
    """The object store stayed away past the upload retries: the run stopped `interrupted`, its
    parts kept in the staging folder; exit status 143, as for SIGTERM (a stop from outside)."""

    def __init__(self, message: str) -> None:
        HookrunError.__init__(self, message)
        self.signum = signal.SIGTERM
        self.exit_code = 128 + signal.SIGTERM


class _Stopped(KeyboardInterrupt):
    """SIGTERM before the loop, raised as Ctrl-C is (with the signal's number)."""

    def __init__(self, signum: int) -> None:
        super().__init__()
        self.signum = signum


@contextmanager
def setup_stops() -> Iterator[None]:
    """Before the loop, SIGTERM stops as Ctrl-C does: KeyboardInterrupt carrying `signum`, so the lock
    is released and the run says why it ended (Python's default for SIGTERM ends the process at once,
    with no word and the lock left behind). A handler someone else installed is left alone."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def handle(signum: int, frame: object) -> None:
        raise _Stopped(signum)

    signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def stopped_by(exc: KeyboardInterrupt) -> int:
    """The signal behind a KeyboardInterrupt: SIGTERM where `setup_stops` raised it, else SIGINT."""
    return getattr(exc, "signum", signal.SIGINT)


class StopSignals:
    def __init__(self) -> None:
        self.signum: int | None = None
        self.now = False  # a second signal came: stop at once
        self._old: dict[int, object] = {}
        self._shielded = False

    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if self._shielded:
            log.warning("%s: closing the file; it takes a moment", name)
            self.signum = self.signum or signum
            return
        if self.signum is None:
            self.signum = signum
            log.warning("%s: finishing the batch in flight, then stopping (send it again to stop at once)", name)
            return
        self.now = True
        log.warning("%s: stopping at once", name)
        raise KeyboardInterrupt

    @contextmanager
    def shielded(self) -> Iterator[None]:
        """Signals only wait within the block (the file is being closed)."""
        was, self._shielded = self._shielded, True
        try:
            yield
        finally:
            self._shielded = was

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)
        self._old.clear()


def after_close(exc: KeyboardInterrupt, dest: object, resume: bool) -> dict:
    """A Ctrl-C / SIGTERM outside the run's batches (setup_stops' KeyboardInterrupt): before the file was
    created, Interrupted saying nothing was written; once the run closed it (`dest.closed`, set by
    execute), what the file is: a complete one stays complete (warned; RunResult's steps, samples, signum),
    any other is named as kept."""
    signum = stopped_by(exc)
    status, steps, samples, unit = getattr(dest, "closed", None) or (None, 0, 0, "batches")
    if status is None:
        raise Interrupted(signum, None, 0, resumed_from=dest.resumed_from(resume)) from None
    if status != "complete":
        raise Interrupted(signum, dest.result, steps, unit=unit) from None
    log.warning("%s after the run ended: %s is complete", signal.Signals(signum).name, dest.result)
    return {"steps": steps, "samples": samples, "signum": signum}
