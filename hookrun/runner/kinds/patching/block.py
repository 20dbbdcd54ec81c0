"""The `patching:` block, checked: what a patching run (or hookrun.patch_grid) was asked for.

    block = parse_block({"sites": {"resid": {"at": "blocks.*.hook_resid_pre", "over": ["position"]}}})
    block.sites[0].over   # ('position',)

PatchingConfig is the block's keys, types and defaults (the kind plugin's block: hookrun.config.load
types a config's `patching:` into it, and its check() parses it here once, before the model is
built: `cfg.patching.checked()` is that Block). Every key is checked here, before the model runs: a
wrong value is one ConfigError naming the key, what is wrong and the choices (closest matches for names).

The items of a run, as one batch, checked against the block before any forward (load_items, below):
`items = load_items(dataset, block, limit=None, device=device)` gives {"clean": (N, T), "corrupt": (N, T), ...}.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch.utils.data import default_collate

from hookrun.config.param_values import as_bool
from hookrun.errors import ConfigError, close_matches, one_of, parse_bytes
from hookrun.runner.kinds.patching.edges.spec import EDGE_METHODS, FaithSpec, parse_edge_keys
from hookrun.runner.kinds.patching.metrics import PATCH_METRICS

DIRECTIONS, METHODS = ("denoise", "noise"), ("exact", "atp", "atp_ig", *EDGE_METHODS)
SITE_KEYS = ("at", "over", "dims")
METRIC_KEYS = ("name", "answer", "wrong", "position", "normalize")


@dataclass
class PatchingConfig:
    """patching: activation-patching grids (docs/patching.md). A null block is off."""

    input: str = "input_ids"  # the forward argument the clean / corrupted ids go to
    clean: str = "clean"  # item keys of the clean and the corrupted input (same shape)
    corrupt: str = "corrupt"
    direction: str = "denoise"  # denoise: clean activations into the corrupted run; noise: the reverse
    method: str = "exact"  # exact: one patched run per cell (packed); atp: attribution patching's estimate
    metric: Any = field(default_factory=lambda: {"name": "logit_diff", "answer": "answer", "wrong": "wrong", "position": -1,
                                                 "normalize": False})  # or {_target_: fn(logits, items) -> (items,)}
    sites: dict[str, Any] = field(default_factory=dict)  # {NAME: {at, over, dims}}
    cells_per_forward: int | None = None  # null: from `memory`, measured on the first forward
    memory: Any = "1GiB"  # the budget for one packed forward's activations
    verify: int = 0  # atp: recompute exactly the K cells of largest estimated effect |estimate - metric_base|
    graph: str = "auto"  # eap / eap_ig: the residual graph, found from the model
    ig_steps: int | None = None  # eap_ig / atp_ig: interpolation steps m (default 5); eap / atp: 1
    faithfulness: Any = None  # {edges: [10, 50], ablation: corrupt | mean, from: eap_ig}

    def check(self) -> None:
        """Every key checked, once per run (hookrun.config.load): the Block is kept for the run."""
        from hookrun.config.build import build

        object.__setattr__(self, "_checked", parse_block(self, build=build))

    def checked(self) -> Block:
        """The block as parse_block checked it when the config was loaded."""
        if "_checked" not in self.__dict__:
            self.check()
        return self.__dict__["_checked"]


@dataclass(frozen=True)
class SiteSpec:
    name: str
    at: tuple[str, ...]
    over: tuple[str, ...]
    dims: tuple[str, ...] | None  # the tensor's axis names, sample first; None: inferred


@dataclass
class Block:
    input: str
    clean: str
    corrupt: str
    direction: str
    method: str
    metric: str  # a built-in name, or the user function's _target_
    answer: str | None
    wrong: str | None
    position: int | str | None
    normalize: bool
    user_metric: Callable | None
    sites: list[SiteSpec]
    cells_per_forward: int | None
    memory: int
    verify: int
    ig_steps: int = 1  # eap_ig / atp_ig: the interpolated runs (runner/kinds/patching/edges/)
    graph: str = "auto"
    faithfulness: FaithSpec | None = None

    def item_keys(self) -> list[str]:
        """The item keys the block reads (a missing one is refused before any forward)."""
        keys = [self.clean, self.corrupt]
        if self.user_metric is None and self.metric in ("logit_diff", "logprob", "prob", "logit"):
            keys.append(self.answer)
        if self.user_metric is None and self.metric == "logit_diff":
            keys.append(self.wrong)
        if isinstance(self.position, str):
            keys.append(self.position)
        return keys


def parse_block(raw: Any, build: Callable[[Mapping, str], Any] | None = None) -> Block:
    """The checked block; `build` instantiates a user metric's `_target_` node (config/build.py's)."""
    if isinstance(raw, PatchingConfig):
        raw = {f.name: getattr(raw, f.name) for f in fields(raw)}
    defaults = PatchingConfig()
    allowed = [f.name for f in fields(PatchingConfig)]
    raw = dict(raw or {})
    for key in raw:
        if key not in allowed:
            raise ConfigError(f"patching.{key}: no such key; the block's keys: {', '.join(allowed)}"
                              + _did_you_mean(key, allowed))
    get = lambda k: raw.get(k, getattr(defaults, k))  # noqa: E731
    direction, method = get("direction"), get("method")
    if direction not in DIRECTIONS:
        raise ConfigError(f"patching.direction={direction!r}; choose from: {one_of(DIRECTIONS)}"
                          + _did_you_mean(str(direction), DIRECTIONS))
    if method not in METHODS:
        raise ConfigError(f"patching.method={method!r}; choose from: {one_of(METHODS)}" + _did_you_mean(str(method), METHODS))
    metric = get("metric")
    if callable(metric) or isinstance(metric, str):  # patch_grid(metric=fn) or metric="prob": the metric itself
        metric = {"_callable_": metric} if callable(metric) else {"name": metric}
    if not isinstance(metric, Mapping):
        raise ConfigError(f"patching.metric={metric!r}; give {{name: logit_diff, answer: KEY, wrong: KEY, position: -1, "
                          f"normalize: false}}, {{_target_: my_pkg.metric}}, or (in Python) a function (logits, items) -> one value per item")
    metric = dict(metric)
    if callable(metric.get("name")):  # {name: fn, normalize: true}
        metric["_callable_"] = metric.pop("name")
    normalize = bool(as_bool(metric.pop("normalize", False), "normalize", "patching.metric"))
    user = None
    if "_callable_" in metric:
        user = metric.pop("_callable_")
        name = str(getattr(user, "__qualname__", None) or getattr(user, "__name__", None) or type(user).__name__)
        extra = [k for k in metric if k not in METRIC_KEYS or metric[k] != PatchingConfig().metric.get(k)]
        if extra:
            raise ConfigError(f"patching.metric: a function metric takes no keys beside normalize; got {', '.join(extra)} "
                              f"(bind them with functools.partial)")
        answer = wrong = position = None
    elif "_target_" in metric:
        name = str(metric["_target_"])
        default = PatchingConfig().metric  # the schema's defaults merged under a user's node: not its arguments
        metric = {k: v for k, v in metric.items() if not (k in METRIC_KEYS and default.get(k) == v)}
        if build is None:
            raise ConfigError("patching.metric: a _target_ metric needs hookrun's config builder")
        user = build({**metric, "_partial_": True}, "patching.metric")
        answer = wrong = position = None
    else:
        for key in metric:
            if key not in METRIC_KEYS:
                raise ConfigError(f"patching.metric.{key}: no such key; a built-in metric takes: {', '.join(METRIC_KEYS)}, "
                                  f"a user's metric is {{_target_: my_pkg.metric, ...}}" + _did_you_mean(key, METRIC_KEYS))
        name = metric.get("name", "logit_diff")
        if name not in PATCH_METRICS:
            raise ConfigError(f"patching.metric.name={name!r}; choose from: {one_of(PATCH_METRICS)}, or give "
                              f"{{_target_: my_pkg.metric}} (one value per item)" + _did_you_mean(str(name), PATCH_METRICS))
        answer, wrong, position = metric.get("answer", "answer"), metric.get("wrong", "wrong"), metric.get("position", -1)
        if isinstance(position, bool) or not isinstance(position, int | str):
            raise ConfigError(f"patching.metric.position={position!r}; give a token position (-1: the last) or an item key")
        unread = {"position": position != -1, "answer": answer != "answer", "wrong": wrong != "wrong"}
        if name == "ce" and any(unread.values()):  # ce reads every next token: these keys would be ignored
            key = next(k for k, given in unread.items() if given)
            raise ConfigError(f"patching.metric.{key}={metric[key]!r}: metric ce reads the next token at every position "
                              f"and no {key}; drop {key}, or choose logit_diff, logprob, prob, kl or logit to read one position")
    cells = get("cells_per_forward")
    if cells is not None and (isinstance(cells, bool) or not isinstance(cells, int) or cells < 1):
        raise ConfigError(f"patching.cells_per_forward={cells!r}; give a positive integer, or null to choose it from patching.memory")
    verify = get("verify")
    if isinstance(verify, bool) or not isinstance(verify, int) or verify < 0:
        raise ConfigError(f"patching.verify={verify!r}; give how many cells (largest estimated effect) to recompute exactly, 0 for none")
    if verify and method not in ("atp", "atp_ig"):
        raise ConfigError(f"patching.verify={verify}: verify recomputes attribution estimates; it needs method: atp or atp_ig")
    graph, ig_steps, faith = parse_edge_keys(get, method)
    sites = get("sites") or {}
    if not isinstance(sites, Mapping):
        raise ConfigError(f"patching.sites: got a {type(sites).__name__}; give a mapping of site names to sites, e.g. "
                          f"sites={{'resid': {{'at': 'blocks.*.hook_resid_pre', 'over': ['position']}}}}")
    sites = [parse_site(str(n), body) for n, body in sites.items()]
    if not sites and method not in EDGE_METHODS:
        raise ConfigError("patching.sites: empty; name at least one site, e.g. sites: {resid: {at: 'blocks.*.hook_resid_pre', over: [position]}}")
    return Block(str(get("input")), str(get("clean")), str(get("corrupt")), direction, method, name, answer, wrong,
                 position, normalize, user, sites, cells, parse_bytes(get("memory"), "patching.memory"), verify,
                 ig_steps, graph, faith)


def parse_site(name: str, body: Any) -> SiteSpec:
    where = f"patching.sites.{name}"
    if isinstance(body, str):
        body = {"at": body}
    if not isinstance(body, Mapping) or "at" not in body:
        raise ConfigError(f"{where}: expected {{at: MODULE_OR_GLOB, over: [AXIS, ...], dims: [...]}}, got {body!r}")
    for key in body:
        if key not in SITE_KEYS:
            raise ConfigError(f"{where}.{key}: no such key; a site takes: {', '.join(SITE_KEYS)}" + _did_you_mean(key, SITE_KEYS))
    at = body["at"]
    at = (at,) if isinstance(at, str) else tuple(at)
    over = tuple(body.get("over") or ())
    if "sample" in over:
        raise ConfigError(f"{where}.over: 'sample' is the items' axis, patched whole in every cell; cut along the others")
    if len(set(over)) != len(over):
        raise ConfigError(f"{where}.over={list(over)}: an axis named twice")
    dims = body.get("dims")
    dims = tuple(dims) if dims is not None else None
    if dims is not None and (not dims or dims[0] != "sample" or len(set(dims)) != len(dims)):
        raise ConfigError(f"{where}.dims={list(dims)}: name every axis once, the first 'sample' (the items), "
                          f"e.g. [sample, position, head, feature]")
    return SiteSpec(name, at, over, dims)


def _did_you_mean(key: str, choices: Any) -> str:
    close = close_matches(key, list(choices), n=1)
    return f"; did you mean {close[0]}?" if close else ""


def load_items(dataset: Any, block: Block, limit: int | None = None, device: Any = None) -> dict[str, torch.Tensor]:
    n = len(dataset) if limit is None else min(limit, len(dataset))
    if n == 0:
        raise ConfigError("patching: the data set has no items")
    first = dataset[0]
    if not isinstance(first, Mapping):
        raise ConfigError(f"patching: the items are {type(first).__name__}s; patching reads dict items with the keys "
                          f"{', '.join(block.item_keys())} (the clean and corrupted inputs and what the metric needs)")
    for key in block.item_keys():
        if key not in first:
            where = _key_of(block, key)
            close = close_matches(str(key), list(map(str, first)), n=1)
            raise ConfigError(f"{where}={key!r}: the items have no key {key!r}; their keys: {', '.join(map(str, first))}"
                              + (f"; did you mean {close[0]}?" if close else ""))
    rows = [{k: v for k, v in _item(dataset, i, n).items() if isinstance(v, torch.Tensor | int | float)} for i in range(n)]
    for name in ("clean", "corrupt"):
        key = getattr(block, name)
        shapes = [tuple(torch.as_tensor(r[key]).shape) if key in r else None for r in rows]
        j = next((j for j, s in enumerate(shapes) if s != shapes[0]), None)
        if j is not None:
            raise ConfigError(f"patching.{name}: the items' {key!r} differ in shape: item 0 has {shapes[0]}, item {j} "
                              f"{shapes[j]}; patching stacks the items into one batch: pad them to one length (and give "
                              f"each item's position with metric.position: KEY), or make items of one length")
    batch = default_collate(rows)
    clean, corrupt = batch[block.clean], batch[block.corrupt]
    if tuple(clean.shape) != tuple(corrupt.shape):
        raise ConfigError(f"patching.clean / patching.corrupt: the clean input {block.clean!r} has shape {tuple(clean.shape[1:])} "
                          f"per item and the corrupted {block.corrupt!r} {tuple(corrupt.shape[1:])}; patching needs the same "
                          f"shape (pad or cut them to one length)")
    return {k: v.to(device) for k, v in batch.items()}


def _key_of(block: Block, key: str) -> str:
    for name in ("clean", "corrupt"):
        if getattr(block, name) == key:
            return f"patching.{name}"
    for name in ("answer", "wrong", "position"):
        if getattr(block, name) == key:
            return f"patching.metric.{name}"
    return "patching"


def _item(dataset: Any, i: int, n: int) -> Any:
    """Item i of the `n` patching reads; one that raises is one RunError line (data_errors.data_failure)."""
    from hookrun.errors import HookrunError
    from hookrun.runner.data_errors import data_failure

    try:
        return dataset[i]
    except HookrunError:
        raise
    except Exception as exc:
        hint = f" (the dataset's len() is {len(dataset)}: does it have that many items?)" if isinstance(exc, IndexError) else ""
        raise data_failure(exc, f"data: loading item {i} of the {n} patching reads failed:", hint) from exc
