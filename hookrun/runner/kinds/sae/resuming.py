"""What a resumed SAE run may take over: the SAE in `sae.out`, the cache it trains on, its checkpoints.

    old = old_sae(cfg)                       # the run at output.path to resume: its `sae` attribute, or None
    check_out(out, old, cfg.resume)          # sae.out holds an SAE: only the resumed run's own (else sae.overwrite)
    check_cache(old, cache_identity(rows), "outputs/run/captures.h5")    # the same cache's rows, or one line
    check_sweep_out(out)                     # sae.out holds the SAE another job of this multirun wrote: one line
    checkpoints_before(folder, samples)      # SAELens' checkpoint folders to resume from, newest first

A run records its cache's identity in the root attribute `sae` (`cache`: the capture's rows, the cache
file's `created` time and a digest of the capture's `/checksums` rows where the file holds them). A
resume compares it with the cache `sae.from` names now: a cache recorded again at the same path is
another cache, and training on it after the checkpoint would mix two caches' rows in one SAE.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

from hookrun.config.schema import HookrunConfig
from hookrun.errors import ConfigError, NotFoundError
from hookrun.store.paths import flushing_path, scheme_of
from hookrun.store.reading import open_read
from hookrun.store.verify import table_of

log = logging.getLogger("hookrun")


def old_sae(cfg: HookrunConfig) -> dict[str, Any] | None:
    """The `sae` attribute (with the run's `status`) of the run resume=true would continue: a local file's, or
    an object-store run's manifest's (nothing fetched); None where output.path holds no SAE run."""
    if scheme_of(str(cfg.output.path)).remote:
        return _remote_sae(cfg)
    path = Path(str(cfg.output.path))
    for source in (path, flushing_path(path)):  # (a kill inside a flush leaves it at <name>.flushing)
        if source.exists():
            try:  # (open_read waits for a killed run's flush helper: its last message written)
                with open_read(source) as f:
                    text, status = f.attrs.get("sae"), f.attrs.get("status")
            except OSError:
                return None
            if text is None:
                return None
            return {**json.loads(text), "status": str(status), "file": str(path)}
    return None


def _remote_sae(cfg: HookrunConfig) -> dict[str, Any] | None:
    """old_sae of a run in an object store: its manifest's attributes, or, where no part was uploaded yet, those
    of the parts in its staging folder (was None: a resume after a kill during sae.evaluate was refused as if
    no SAE run were at output.path, the SAE it had written to sae.out taken for another run's)."""
    import h5py

    from hookrun.analysis.opening import open_run
    from hookrun.output.objects.upload import ObjectStoreOutput

    url = str(cfg.output.path)
    try:
        with open_run(url) as run:
            text, status = run.attrs.get("sae"), run.status
    except NotFoundError:  # (no run there yet: the destination's own checks say so)
        text, status = None, None
    staged = ObjectStoreOutput.of(url, cfg.output.staging).parts_dir
    for part in sorted(staged.glob("part-*.h5*"), reverse=True) if text is None and staged.is_dir() else []:
        try:
            with h5py.File(part, "r", locking=False) as f:
                text, status = f.attrs.get("sae"), "interrupted"  # (a part not uploaded: the run did not end)
        except OSError:  # (a part cut short by the kill: the one before it)
            continue
        if text is not None:
            break
    if text is None:
        return None
    return {**json.loads(text.decode() if isinstance(text, bytes) else text), "status": str(status), "file": url}


def check_out(out: Path, old: dict[str, Any] | None, resume: bool) -> None:
    """sae.out holds an SAE and sae.overwrite is off: refused unless resume=true continues the run that
    trained into `out` (its file is there and names `out`): any other SAE would be replaced at the end."""
    if old is not None and resume and old.get("out") and Path(old["out"]).resolve() == out.resolve():
        return
    why = ""
    if resume:
        why = (f"; resume=true continues only the run whose SAE it is, and {old['file']} trained into {old['out']}"
               if old is not None else "; resume=true finds no SAE run to continue at output.path")
    raise ConfigError(f"sae.out: {out} already holds an SAE (cfg.json or sae_weights.safetensors){why}; give "
                      "another folder, or sae.overwrite=true to replace it")


def cache_identity(rows: Any) -> dict[str, Any]:
    """The cache's rows, its file's `created` time and a digest of the capture's checksums (a local file
    written with output.checksum=true): what tells one cache from another recorded at the same path."""
    ident: dict[str, Any] = {"rows": int(rows.n_rows)}
    run = rows.run
    created = (getattr(run, "attrs", None) or {}).get("created")
    if created is not None:
        ident["created"] = str(created)
    if scheme_of(rows.source).remote:  # (its checksums are in every part: not fetched for this)
        return ident
    ds = run.file[rows.info.path]
    ref = ds.attrs.get("digest")
    if ref:  # (store/writer.py's table of the capture's checksums: a batch's end row and its xxh3 per row)
        try:
            ident["digest"] = hashlib.sha1(table_of(ds, ref.decode() if isinstance(ref, bytes) else str(ref)).tobytes()).hexdigest()[:16]
        except (KeyError, OSError, ValueError):  # (a table the file lacks: the rows and time say what they can)
            pass
    return ident


def check_cache(old: dict[str, Any] | None, now: dict[str, Any] | None, source: str) -> None:
    """The resumed run's cache is the one it started on (an older file without `cache` passes unchecked)."""
    was = (old or {}).get("cache")
    if not was or now is None:
        return
    differ = [k for k in ("rows", "created", "digest") if k in was and k in now and was[k] != now[k]]
    if differ:
        said = lambda c: ", ".join(f"{k} {c[k]}" for k in differ)  # noqa: E731
        raise ConfigError(f"resume: sae.from {source} is not the cache {old['file']} started on ({said(was)}; now "
                          f"{said(now)}); resume on that cache, or start a new run (output.overwrite=true)")


SWEEP_MARK = ".hookrun-sweep.json"  # in sae.out, beside the SAE a multirun's job wrote: {"sweep": its folder, "job": its number}


def multirun_job_folder() -> Path | None:
    """This job's folder where the run is one job of a Hydra multirun (python -m hookrun -m ...), else None."""
    hc = _multirun()
    return Path(hc.runtime.output_dir).resolve() if hc is not None else None


def _multirun() -> Any:
    hydra_config = sys.modules.get("hydra.core.hydra_config")  # (not loaded: no Hydra job is running)
    if hydra_config is None or not hydra_config.HydraConfig.initialized():
        return None
    from hydra.types import RunMode

    hc = hydra_config.HydraConfig.get()
    return hc if hc.mode == RunMode.MULTIRUN else None


def _sweep_job() -> dict[str, Any] | None:
    hc = _multirun()
    return {"sweep": str(Path(hc.sweep.dir).resolve()), "job": int(hc.job.num)} if hc is not None else None


def check_sweep_out(out: Path) -> None:
    """sae.out (an absolute folder every job of a sweep shares) holds the SAE another job of this multirun
    wrote: with sae.overwrite each job replaced the one before, so one SAE was left of the sweep's; refused."""
    job = _sweep_job()
    try:
        old = json.loads((out / SWEEP_MARK).read_text()) if job is not None else None
    except (OSError, ValueError):
        return
    if isinstance(old, dict) and old.get("sweep") == job["sweep"] and old.get("job") != job["job"]:
        raise ConfigError(f"sae.out: {out} holds the SAE job {old.get('job')} of this sweep trained, and job {job['job']} "
                          f"would replace it; give each job its own folder: a relative sae.out (in each job's folder) "
                          f"or one holding ${{hydra:job.num}}")


def mark_sweep_out(out: Path) -> None:
    """Beside the SAE just written: the sweep and job that wrote it (a multirun's job only)."""
    job = _sweep_job()
    if job is not None:
        (out / SWEEP_MARK).write_text(json.dumps(job))


def clear_checkpoints(folder: Path) -> None:
    """Remove the SAELens checkpoint folders (named by samples seen, with a trainer_state.pt) an earlier run
    left in `folder`; nothing else there is touched."""
    old = checkpoints_before(folder, sys.maxsize)
    for path in old:
        shutil.rmtree(path)
    if old:
        log.info("sae: %d checkpoint(s) of an earlier run removed from %s", len(old), folder)


def checkpoints_before(folder: Path, samples: int) -> list[Path]:
    """SAELens' checkpoint folders (named by samples seen) at or before `samples`, newest first."""
    if not folder.is_dir():
        return []
    found = [(int(p.name), p) for p in folder.iterdir() if p.name.isdigit() and (p / "trainer_state.pt").exists()]
    return [p for n, p in sorted(found, reverse=True) if n <= samples]
