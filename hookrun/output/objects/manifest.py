"""The manifest of a cache in an object store: which parts it has, their rows, sizes and checksums.

    m = Manifest.new(url="s3://bucket/cache/captures.h5", attrs=...)
    m.add(PartEntry("part-00000.h5", bytes=..., md5=..., steps=[0, 12], samples=96, tokens=0, rows={...}))
    folder.write_text(MANIFEST, m.to_json())        # only after the part's upload was verified
    Manifest.from_json(folder.read_text(MANIFEST))

One JSON object per cache (`<url>/manifest.json`; with many ranks one per rank,
`manifest.rank-NNNNN.json`, and a top `manifest.json` that lists them). A part is listed only once
the store holds it verified, so whatever the manifest lists can be read; a part on the store that
the manifest does not list is not part of the cache. docs/format.md "Parts and the manifest" is
the full description.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

from hookrun.errors import HookrunError

MANIFEST = "manifest.json"
KIND = "hookrun-parts"
VERSION = 1


def rank_manifest(rank: int) -> str:
    return f"manifest.rank-{rank:05d}.json"


def part_name(k: int, rank: int | None = None) -> str:
    return f"part-{k:05d}.h5" if rank is None else f"rank-{rank:05d}/part-{k:05d}.h5"


@dataclass
class PartEntry:
    name: str  # the object's name under the cache's URL
    bytes: int
    md5: str  # of the object's bytes (what S3's ETag is, for a one-PUT upload)
    steps: list[int]  # [first, stop): the run's batch numbers the part holds
    samples: int  # rows of /samples/index
    tokens: int  # token rows (rows: token captures), 0 where none
    rows: dict[str, int] = field(default_factory=dict)  # rows per capture dataset path


@dataclass
class Manifest:
    url: str
    status: str = "running"  # running | complete | interrupted | failed (of the run; each listed part is whole)
    attrs: dict = field(default_factory=dict)  # the run's root attributes (config, versions, model_class, ...)
    captures: dict[str, dict] = field(default_factory=dict)  # dataset path -> its schema (shape of a row, dtype, attrs)
    parts: list[PartEntry] = field(default_factory=list)
    ranks: list[str] = field(default_factory=list)  # a top manifest of many ranks: their manifests, in rank order
    updated: str = ""

    def add(self, part: PartEntry, captures: dict[str, dict]) -> None:
        """List a verified part (replacing an entry of the same name) and learn its captures."""
        self.parts = [p for p in self.parts if p.name != part.name] + [part]
        self.parts.sort(key=lambda p: p.steps[0])
        for path, schema in captures.items():
            self.captures.setdefault(path, schema)

    @property
    def steps(self) -> int:
        return sum(p.steps[1] - p.steps[0] for p in self.parts)

    @property
    def next_step(self) -> int | None:
        return self.parts[-1].steps[1] if self.parts else None

    def to_json(self) -> str:
        self.updated = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        out = {"kind": KIND, "version": VERSION, **asdict(self)}
        return json.dumps(out, indent=1, sort_keys=False)

    @classmethod
    def from_json(cls, text: str, where: str = "manifest") -> Manifest:
        try:
            data = json.loads(text)
            if data.get("kind") != KIND:
                raise ValueError(f"kind is {data.get('kind')!r}, not {KIND!r}")
            if int(data.get("version", 0)) > VERSION:
                raise ValueError(f"version {data['version']} is newer than this hookrun reads ({VERSION})")
            parts = [PartEntry(**p) for p in data.get("parts", [])]
            return cls(str(data["url"]), str(data.get("status", "running")), dict(data.get("attrs", {})),
                       dict(data.get("captures", {})), parts, list(data.get("ranks", [])), str(data.get("updated", "")))
        except (ValueError, KeyError, TypeError) as exc:
            raise HookrunError(f"{where} is not a hookrun manifest ({exc})") from None
