"""Resume of an object-store run: its verified parts are kept as they are, and the part being
written when it stopped is replayed (a Resume, output/resume.py).

    state = open_parts_resume(out, cfg_yaml)  # None where the object store holds no run
    steps = state.replay(store)               # the kept parts' batches, plus the partial part's

The destination for an object-store URL (output/store_parts.py) opens it; a local file's resume
is ResumeState (output/resume.py), whose replay this one uses for the partial part.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import h5py
import yaml

from hookrun.errors import ConfigError
from hookrun.output.resume import ResumeState, config_differences, open_resume
from hookrun.store.parts import ObjectStoreOutput, ResumePoint, prepare_resume
from hookrun.store.records import RunStore


@dataclass
class PartsResume:
    """A run in an object store to continue: its verified parts (store/parts.py), and the part that
    was being written when it stopped, whose whole batches are replayed."""

    point: ResumePoint
    partial: ResumeState | None
    status: str

    @property
    def steps(self) -> int:
        return self.point.manifest.steps + (self.partial.steps if self.partial is not None else 0)

    @property
    def attrs(self) -> Mapping:
        return self.partial.attrs if self.partial is not None else self.point.manifest.attrs

    @property
    def file(self) -> h5py.File | None:
        return self.partial.file if self.partial is not None else None

    def replay(self, store: RunStore) -> int:
        """The verified parts stay as they are; the part being written is replayed into `store`,
        then removed (its batches are in the new part)."""
        kept = self.point.manifest.steps
        if self.partial is not None:
            kept += self.partial.replay(store)
            self.partial.close()
            self.partial.path.unlink(missing_ok=True)
            self.partial = None
        return kept

    def close(self) -> None:
        if self.partial is not None:
            self.partial.close()


def open_parts_resume(out: ObjectStoreOutput, config_yaml: str) -> PartsResume | None:
    """The run in the object store to continue (its finished local parts uploaded now), None where
    there is none; ConfigError where the config changed."""
    point = prepare_resume(out, out.folder(check=False))
    if point is None:
        return None
    old = point.manifest.attrs.get("config")
    if old is not None:
        changed = config_differences(yaml.safe_load(old), yaml.safe_load(config_yaml))
        if changed:
            raise ConfigError(f"resume: the config differs from the one {out.url} was written with, in "
                              f"{', '.join(changed)}; resume with the same settings (or start a new run)")
    partial = open_resume(point.partial, config_yaml) if point.partial is not None else None
    status = point.manifest.status if partial is None else "interrupted"
    return PartsResume(point, partial, status)
