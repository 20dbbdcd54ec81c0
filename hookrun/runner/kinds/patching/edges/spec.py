"""The edge keys of the `patching:` block, checked: graph, ig_steps and faithfulness.

    graph, ig_steps, faith = parse_edge_keys(get, "eap_ig")   # "auto", 5, None

`get(key)` reads the block with the schema's defaults (runner/kinds/patching/block.py). Each bad value is
one ConfigError naming the key, what is wrong and what would be right, before the model runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hookrun.errors import ConfigError, one_of
from hookrun.store.paths import scheme_of

EDGE_METHODS = ("eap", "eap_ig")
IG_METHODS = ("eap_ig", "atp_ig")
ABLATIONS = ("corrupt", "mean")
FAITH_KEYS = ("edges", "fractions", "ablation", "from")
DEFAULT_STEPS = 5


@dataclass(frozen=True)
class FaithSpec:
    edges: tuple[int, ...]  # the k of each circuit
    ablation: str  # corrupt | mean
    source: str  # eap | eap_ig (this run's scoring) or a run file's path whose edge grid ranks the edges
    fractions: tuple[float, ...] = ()  # MIB's circuits at fractions of the edges (edges/mib.py), ascending


def parse_edge_keys(get: Callable[[str], Any], method: str) -> tuple[str, int, FaithSpec | None]:
    graph = get("graph")
    if graph != "auto":
        raise ConfigError(f"patching.graph={graph!r}; choose from: auto (the residual graph found from the model: "
                          f"TransformerLens HookedTransformer, HF GPT-2, GPT-NeoX, Llama-style)")
    steps = get("ig_steps")
    if steps is None:
        steps = DEFAULT_STEPS if method in IG_METHODS else 1
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"patching.ig_steps={steps!r}; give the number of interpolation steps m >= 1 "
                          f"(the runs e_corrupt + (k/m)(e_clean - e_corrupt), k = 0..m-1; m = 1 is plain eap / atp)")
    if steps != 1 and method not in IG_METHODS:
        raise ConfigError(f"patching.ig_steps={steps} with method {method}: interpolation steps need method eap_ig "
                          f"(edges) or atp_ig (sites); " + (f"{method} takes the gradient at the corrupted run alone"
                          if method in ("eap", "atp") else f"{method} takes no gradient: set patching.ig_steps=null"))
    if method in EDGE_METHODS and get("sites"):
        raise ConfigError(f"patching.sites: method {method} scores the edges of the model's residual graph and patches no "
                          f"site; drop patching.sites, or use method exact, atp or atp_ig for sites")
    return graph, steps, parse_faithfulness(get("faithfulness"), method)


def parse_faithfulness(raw: Any, method: str) -> FaithSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"patching.faithfulness={raw!r}; expected {{edges: [10, 50], fractions: mib, ablation: corrupt, from: eap_ig}}")
    for key in raw:
        if key not in FAITH_KEYS:
            raise ConfigError(f"patching.faithfulness.{key}: no such key; it takes: {', '.join(FAITH_KEYS)}")
    if method not in EDGE_METHODS:
        raise ConfigError(f"patching.faithfulness with method {method}: faithfulness ablates edges; use method "
                          f"{one_of(EDGE_METHODS)} (it scores the edges; faithfulness.from may rank them by another scoring)")
    fractions = parse_fractions(raw.get("fractions"))
    edges = raw.get("edges", [] if fractions else [10, 50, 200])
    if edges is None or (isinstance(edges, Sequence) and not isinstance(edges, str)):
        edges = list(edges or [])
    else:  # one size (10), or a value that is not one (10.5, "a"): refused below by its value
        edges = [edges]
    if (not edges and not fractions) or any(isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in edges):
        raise ConfigError(f"patching.faithfulness.edges={raw.get('edges')!r}; give circuit sizes, a list of "
                          f"non-negative integers such as [10, 50, 200]")
    ablation = raw.get("ablation", "corrupt")
    if ablation not in ABLATIONS:
        raise ConfigError(f"patching.faithfulness.ablation={ablation!r}; choose from: {one_of(ABLATIONS)}")
    source = str(raw.get("from", method))
    check_source(source)
    return FaithSpec(tuple(int(k) for k in edges), ablation, source, fractions)


FROM_FORMS = (f"{one_of(EDGE_METHODS)} (this run's scoring), or the path of an edges run's file (.h5), an EAP-IG graph "
              f"JSON (.json) or a MIB folder whose scores rank the edges")


def check_source(source: str) -> None:
    """faithfulness.from: a method's name (eap, eap_ig: the method, even where a file or folder of that name
    exists; ./eap names such a folder), or a path, checked by its form here and by its content before any
    forward (edges/run.py). A bare name that is neither a method nor an existing file or folder, or a .pt
    circuit (EAP-IG's Graph.to_pt, which MIB also reads), is one line."""
    from pathlib import Path

    from hookrun.store.paths import local_path

    if source in EDGE_METHODS:
        return
    if source.endswith((".pt", ".pth")):
        raise ConfigError(f"patching.faithfulness.from={source!r}: a .pt circuit (EAP-IG's Graph.to_pt) is not read; "
                          f"save the graph with EAP-IG's Graph.to_json and give that JSON (the other forms: {FROM_FORMS})")
    remote = scheme_of(source).remote
    if remote or "/" in source or source.endswith((".h5", ".hdf5", ".json")) or Path(local_path(source)).expanduser().exists():
        return
    raise ConfigError(f"patching.faithfulness.from={source!r}: no method and no file or folder of that name; choose from: "
                      f"{FROM_FORMS}")


def parse_fractions(raw: Any) -> tuple[float, ...]:
    """faithfulness.fractions: `mib` (MIB's ten fractions), one fraction or a list, each in (0, 1]; sorted."""
    from hookrun.runner.kinds.patching.edges.mib import MIB_FRACTIONS

    if raw is None:
        return ()
    if raw == "mib":
        return MIB_FRACTIONS
    values = [raw] if isinstance(raw, int | float) and not isinstance(raw, bool) else raw
    ok = isinstance(values, Sequence) and not isinstance(values, str) and len(values) > 0 and all(
        isinstance(f, int | float) and not isinstance(f, bool) and 0 < f <= 1 for f in values)
    if not ok:
        raise ConfigError(f"patching.faithfulness.fractions={raw!r}; give mib (MIB's fractions of the edges "
                          f"{', '.join(map(str, MIB_FRACTIONS))}) or a list of fractions in (0, 1] such as [0.01, 0.1, 1]")
    fractions = tuple(sorted({float(f) for f in values}))
    if len(fractions) < 2:
        raise ConfigError(f"patching.faithfulness.fractions={raw!r}; CPR and CMD are areas under the faithfulness curve, "
                          f"which need at least two fractions: give mib or a list such as [0.01, 0.1, 1]")
    return fractions


def check_not_own_output(faith: FaithSpec | None, output: str) -> None:
    """faithfulness.from naming the run's own output.path: the run would truncate the scores it ranks the
    edges by (output.overwrite, on the bounded route the file opens before they are read). Before anything opens."""
    from pathlib import Path

    from hookrun.store.paths import local_path

    source = None if faith is None else faith.source
    if source is None or source in EDGE_METHODS or scheme_of(source).remote or scheme_of(output).remote:
        return
    if Path(local_path(source)).expanduser().resolve() == Path(local_path(output)).expanduser().resolve():
        raise ConfigError(f"output.path {output!r} is patching.faithfulness.from: the run would overwrite the file whose "
                          f"scores rank the edges; write this run to another output.path")


def check_circuits(faith: FaithSpec | None, edges: int) -> None:
    """k larger than the graph's edge count: one line, before any forward."""
    if faith is None:
        return
    big = [k for k in faith.edges if k > edges]
    if big:
        raise ConfigError(f"patching.faithfulness.edges: {big[0]} is more than the model's {edges} edges; give "
                          f"circuit sizes of at most {edges}")
