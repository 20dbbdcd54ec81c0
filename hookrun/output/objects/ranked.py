"""Many ranks writing one cache in an object store: each rank's manifest, and the top one listing them.

    check_ranked_output(url, world=2, overwrite=False, resume=False)  # every rank, before any batch
    begin_ranks(url, world=2, attrs={...}, resume=False)             # rank 0, once every rank checked
    state = finish_ranks(url, world=2, attrs={...})                  # rank 0, once every rank ended
    state.status, state.incomplete                                   # 'complete', [] (or the ranks that are not)

Rank r of a torchrun / submitit / srun run writes its block of batches exactly as one process
writes a whole run (parts.py), under the same URL: its parts as `rank-RRRRR/part-KKKKK.h5`,
listed in `manifest.rank-RRRRR.json`. The top `manifest.json` lists the ranks' manifests in rank
order, which is batch order; rank 0 writes it when the run starts (status `running`) and again once
every rank has ended (`complete`, or `incomplete` naming the ranks that are not). Readers do not
trust the top's status alone: `combined_status` derives the run's from the ranks' own manifests, so
the cache reads the same whatever order the ranks finished in, and a rank 0 killed before its last
write leaves a cache that says `running`, never one that claims rows it does not have.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from hookrun.errors import ConfigError, HookrunError, NotFoundError
from hookrun.output.objects.manifest import MANIFEST, Manifest, PartEntry, rank_manifest
from hookrun.output.objects.object_folder import RemoteFolder, reason
from hookrun.output.objects.upload import retrying

RANK_MANIFEST = re.compile(r"^manifest\.rank-(\d{5})\.json$")
RANK_ATTRS_SKIP = {"rank", "first_batch", "last_batch"}  # one rank's, not the run's


@dataclass
class RanksState:
    """What the ranks' manifests say together."""

    status: str  # complete | running | incomplete
    incomplete: list[str] = field(default_factory=list)  # 'rank 1 (running, 2 batches)', 'rank 2 (missing)'
    manifests: list[Manifest | None] = field(default_factory=list)  # in rank order; None: not written

    @property
    def samples(self) -> int:
        return sum(p.samples for m in self.manifests if m is not None for p in m.parts)


def check_ranked_output(url: str, world: int, overwrite: bool, resume: bool) -> None:
    """Before any batch, on every rank (and before any rank writes): the store is reachable, nothing
    is overwritten unless asked, and a resume keeps the number of processes the cache was written with."""
    folder = RemoteFolder.open(url)  # ConfigError where it cannot be used
    try:
        names = folder.names()
        text = folder.read_text(MANIFEST) if resume and MANIFEST in names else None
    except Exception as exc:
        raise ConfigError(f"{url}: the object store cannot be used ({reason(exc)})") from None
    ranks = sorted(int(m.group(1)) for n in names if (m := RANK_MANIFEST.match(n)))
    if resume:
        try:
            top = Manifest.from_json(text, f"{url}/{MANIFEST}") if text is not None else None
        except HookrunError as exc:
            raise ConfigError(f"resume: {exc}; move it away to start again") from None
        worlds = ({len(top.ranks) or 1} if top is not None else set()) | ({ranks[-1] + 1} if ranks else set())
        if worlds - {world}:
            was = max(worlds)
            raise ConfigError(f"resume: {url} was written by {was} process(es) and this run has {world}; resume with "
                              f"{was} (torchrun --nproc_per_node, or tasks), or start a new run")
        return
    if (MANIFEST in names or ranks) and not overwrite:
        found = MANIFEST if MANIFEST in names else rank_manifest(ranks[0])
        raise ConfigError(f"output.path: {url} exists (it has a {found}); set output.overwrite=true, resume=true, "
                          f"or choose another path")


def begin_ranks(url: str, world: int, attrs: dict, resume: bool) -> None:
    """Rank 0, once every rank has checked: clear what no rank of this run replaces (a one-process
    run's parts, ranks beyond `world`), then write the top manifest, status running."""
    folder = RemoteFolder.open(url, check=False)
    if not resume:
        this_run = re.compile(r"^(manifest\.json|manifest\.rank-(\d{5})\.json|rank-(\d{5})/.*)$")

        def keep(name: str) -> bool:  # each rank clears its own (parts.py: ObjectStoreOutput.owns)
            m = this_run.match(name)
            rank = m and (m.group(2) or m.group(3))
            return bool(m) and (rank is None or int(rank) < world)

        retrying(f"clearing {url}", lambda: folder.remove_all(keep=keep))
    top = Manifest(url, "running", dict(attrs), ranks=[rank_manifest(r) for r in range(world)])
    text = top.to_json()
    retrying(f"writing {url}/{MANIFEST}", lambda: folder.write_text(MANIFEST, text))


def read_ranks(folder: RemoteFolder, names: list[str], patience: float | None = 0) -> list[Manifest | None]:
    """Each rank's manifest (None where that rank has not written one); reads are retried for
    `patience` seconds (None: RETRY_SECONDS)."""

    def text(name: str) -> str | None:
        try:
            return folder.read_text(name)
        except FileNotFoundError:
            return None

    texts = [retrying(f"reading {folder.url}/{n}", lambda n=n: text(n), patience) for n in names]
    return [Manifest.from_json(t, f"{folder.url}/{n}") if t is not None else None for n, t in zip(names, texts, strict=True)]


def combined_status(top: Manifest, manifests: list[Manifest | None]) -> RanksState:
    """The run's status from its ranks' manifests: complete where every rank's is; else running while
    the top says so (the run goes on, or rank 0 was killed), else incomplete."""
    incomplete = [f"rank {r} ({m.status}, {m.steps} batches)" if m is not None else f"rank {r} (missing)"
                  for r, m in enumerate(manifests) if m is None or m.status != "complete"]
    status = "complete" if not incomplete else ("running" if top.status == "running" else "incomplete")
    return RanksState(status, incomplete, manifests)


def merged(top: Manifest, manifests: list[Manifest | None]) -> Manifest:
    """The top manifest with the run's attributes (rank 0's, less what is one rank's) and every
    rank's captures filled in: what a reader needs besides the parts."""
    first = next((m for m in manifests if m is not None), None)
    attrs = {k: v for k, v in (first.attrs if first is not None else {}).items() if k not in RANK_ATTRS_SKIP}
    out = Manifest(top.url, top.status, {**attrs, **top.attrs}, dict(top.captures), [], list(top.ranks), top.updated)
    for m in manifests:
        for path, schema in (m.captures if m is not None else {}).items():
            out.captures.setdefault(path, schema)
    return out


def finish_ranks(url: str, world: int, attrs: dict) -> RanksState:
    """Rank 0, once every rank has ended (or was taken for dead): the top manifest, final."""
    folder = RemoteFolder.open(url, check=False)
    names = [rank_manifest(r) for r in range(world)]
    manifests = read_ranks(folder, names, patience=None)
    state = combined_status(Manifest(url, "incomplete"), manifests)
    top = merged(Manifest(url, state.status, dict(attrs), ranks=names), manifests)
    top.attrs["incomplete_ranks"] = ", ".join(state.incomplete)
    text = top.to_json()
    retrying(f"writing {url}/{MANIFEST}", lambda: folder.write_text(MANIFEST, text))
    return state


def open_ranked(folder: RemoteFolder, top: Manifest) -> tuple[Manifest, RanksState, list[PartEntry]]:
    """For a reader: the run's manifest (merged), its ranks' state, and every rank's parts in rank
    order (batch order), their rows as the run has them (capped_rows); NotFoundError where the top
    manifest names no rank (not a many-rank cache)."""
    if not top.ranks:
        raise NotFoundError(f"{folder.url}/{MANIFEST} lists no ranks")
    manifests = read_ranks(folder, top.ranks)
    state = combined_status(top, manifests)
    run = merged(top, manifests)
    run.status = state.status
    return run, state, capped_rows([p for m in manifests if m is not None for p in m.parts], run.captures)


def capped_rows(entries: list[PartEntry], captures: dict[str, dict]) -> list[PartEntry]:
    """Each rank recorded the first `limit` rows of a capture with `record limit=N`; the run's are the
    first N of them all, in rank order (as the merged view of local shards has them, store/merge.py):
    the entries' rows of such captures are cut to those (a reader reads each part's first rows)."""
    out = [dataclasses.replace(e, rows=dict(e.rows)) for e in entries]
    for path, schema in captures.items():
        left = schema.get("limit")
        if left is None:
            continue
        for e in out:
            if path in e.rows:
                e.rows[path] = min(e.rows[path], left)
                left -= e.rows[path]
    return out
