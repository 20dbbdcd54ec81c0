"""A merged view's sources, checked before its rows are read: HDF5 reads a missing source as zeros,
and a shard written again after the view (a later run on the folder that stopped before it wrote
its own view) under the old view's row counts and status.

    check_sources(f, path)   # every shard beside the view, and not more files than may be open
    check_shards(f, path)    # each shard is the one the view was written over
"""

from __future__ import annotations

import resource
from pathlib import Path

import h5py

from hookrun.errors import ConfigError, HookrunError, NotFoundError


def shard_names(f: h5py.File) -> list[str]:
    """The shard files a merged view reads (its `shards` attribute), beside it; [] for any other file."""
    shards = f.attrs.get("shards")
    return [s.decode() if isinstance(s, bytes) else str(s) for s in shards] if shards is not None else []


def check_sources(f: h5py.File, path: Path, datasets: list[h5py.Dataset] = ()) -> None:
    """Refuse a view whose source files are not all there, or cannot be open at once: HDF5 itself
    reads a missing (or unopenable) source as the fill value, zeros, with no error. Checks the file's
    `shards` list, and the sources of each virtual dataset of `datasets` (those about to be read)."""
    names = shard_names(f)
    missing = [n for n in names if not (path.parent / n).is_file()]
    if missing:
        raise HookrunError(f"{path} is a view over {len(names)} shard files and {len(missing)} of them are missing from "
                           f"{path.parent}: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}; keep the "
                           f"captures.rank-*.h5 files beside it (HDF5 would read their rows as zeros)")
    here = Path(path).resolve().parent
    for ds in datasets:
        if ds.is_virtual:
            _check_virtual(path, here, ds)


def _check_virtual(path: Path, here: Path, ds: h5py.Dataset) -> None:
    files = {m.file_name for m in ds.virtual_sources() if m.file_name != "."}
    missing = sorted(name for name in files if not (Path(name) if Path(name).is_absolute() else here / name).is_file())
    if missing:
        raise NotFoundError(f"{path}: the merged view {ds.name} reads {len(missing)} missing source file(s) "
                            f"({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}); HDF5 would return "
                            "zeros for their rows. Restore them or rebuild the view")
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and len(files) > soft - 64:
        raise ConfigError(f"{path}: the merged view {ds.name} has {len(files)} source files but this process may "
                          f"open only {soft} files at once (ulimit -n); HDF5 reads sources it cannot open as zeros. "
                          f"Raise the limit (ulimit -n {len(files) + 256}) or merge fewer files")


def check_shards(f: h5py.File, path: Path) -> None:
    """Refuse a view whose shards are no longer those it was written over: each shard's sample
    count (`shard_samples`) and `created` (`shard_created`, views written since it was added) must
    be the view's, and a view that says `complete` needs complete shards. Otherwise the view maps
    the new shards' rows by the old counts (rows past a shard's end read as zeros, a capture the
    new run does not have fails to read) and calls them complete."""
    names = shard_names(f)
    counts = [int(n) for n in f.attrs.get("shard_samples", [])]
    created = [c.decode() if isinstance(c, bytes) else str(c) for c in f.attrs.get("shard_created", [])]
    complete = str(f.attrs.get("status", "")) == "complete"
    for i, name in enumerate(names):
        try:
            with h5py.File(Path(path).parent / name, "r", locking=False) as shard:
                rows = shard["samples/index"].shape[0] if "samples/index" in shard else -1  # what the view counted
                now = (rows, str(shard.attrs.get("status", "")),
                       str(shard.attrs.get("created", "")))
        except OSError as exc:
            raise HookrunError(f"{path} is a view over {name}, which cannot be read ({exc}); restore it, or run the "
                               f"command that wrote the shards again with resume=true to write the view anew") from None
        changed = (i < len(counts) and now[0] != counts[i]) or (i < len(created) and now[2] != created[i]) or \
            (complete and now[1] != "complete")
        if changed:
            raise HookrunError(
                f"{path} is older than its shard {name}: the view maps {counts[i] if i < len(counts) else '?'} samples of "
                f"a {'complete' if complete else 'stopped'} shard, which now holds {now[0]} samples ({now[1]}, created "
                f"{now[2]}): a later run wrote the shards again and has not written its view (it runs, or it stopped); "
                f"once it has stopped, run its command again with resume=true (without output.overwrite=true) to "
                f"finish it and write the view")
