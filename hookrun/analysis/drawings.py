"""What hook actions and capture pairs draw, beside the kinds' readers: one registry that `plot` and
`report` iterate, as they iterate the kinds' readers (kind_readers.py), naming none.

    register_drawing(Drawing("mine", pictures="my_pkg.draw:pictures", sections="my_pkg.draw:sections",
                             roles=("mine.",)))
    for stem, spec in drawn_pictures(run, samples=2): ...    # plot: (file stem, figure spec)
    early, late = drawn_sections(run, budget)               # report: the sections before / after the captures'

A Drawing's `pictures(run, samples)` gives plot's (file stem, spec) pairs (figure_specs.py: a
Heatmap, Lines, MapRow, ...), `sections(run, budget)` the report's sections; both are [] for a run
that holds nothing of theirs, and either may be a "module:function" string, imported when first
asked. `roles`: the capture roles it shows itself, left out of the generic capture sections.
`first`: drawn before the kind's own pictures (plot) and before the captures' section (report).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Drawing:
    name: str
    pictures: Any = None  # function(run, samples) -> [(file stem, spec)], or "module:function"
    sections: Any = None  # function(run, budget) -> [section], or "module:function"
    roles: tuple[str, ...] = ()  # capture roles it shows itself (role prefixes: "lens.")
    first: bool = False  # before the kind's pictures and the captures' section


DRAWINGS: dict[str, Drawing] = {}


def register_drawing(drawing: Drawing) -> Drawing:
    DRAWINGS[drawing.name] = drawing
    return drawing


def _resolve(target: Any) -> Any:
    """A drawing's function, given as itself or as "module:function"."""
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)
    return target


def _call(target: Any, *args: Any) -> list:
    return [] if target is None else list(_resolve(target)(*args))


def drawn_pictures(run: Any, samples: int | None, first: bool | None = None) -> list[tuple[str, Any]]:
    """plot's pictures of every drawing (only the `first` ones, or the others, where `first` is given),
    each of `samples` samples (None: the drawing's own default)."""
    return [p for d in DRAWINGS.values() if first is None or d.first == first for p in _pictures(d.pictures, run, samples)]


def _pictures(target: Any, run: Any, samples: int | None) -> list:
    """A drawing's pictures: of `samples` samples, or where none was asked, of its function's own
    default (Grad-CAM's 4), else plot's 2."""
    if samples is None and target is not None:
        import inspect

        fn = _resolve(target)
        params = list(inspect.signature(fn).parameters.values())
        return _call(fn, run) if len(params) > 1 and params[1].default is not inspect.Parameter.empty else _call(fn, run, 2)
    return _call(target, run, samples)


def drawn_sections(run: Any, budget: Any) -> tuple[list[dict], list[dict]]:
    """The report's sections of every drawing: (those before the captures' section, those after)."""
    early = [s for d in DRAWINGS.values() if d.first for s in _call(d.sections, run, budget)]
    late = [s for d in DRAWINGS.values() if not d.first for s in _call(d.sections, run, budget)]
    return early, late


def drawn_roles() -> tuple[str, ...]:
    """The capture roles the drawings show themselves."""
    return tuple(r for d in DRAWINGS.values() for r in d.roles)


# hookrun's own: Grad-CAM (a layer's maps and their gradient), the logit lens and top examples
# (hook actions), an SAE's latents (the splice op)
for _drawing in (
    Drawing("gradcam", pictures="hookrun.analysis.gradcam:pictures",
            sections="hookrun.analysis.report.gradcam_section:gradcam", first=True),
    Drawing("lens", pictures="hookrun.analysis.report.lens_figures:lens_pictures",
            sections="hookrun.analysis.report.lens_figures:lens", roles=("lens.",)),
    Drawing("latents", sections="hookrun.analysis.report.latents:latents"),
    Drawing("top_examples", roles=("top.",)),
):
    register_drawing(_drawing)
