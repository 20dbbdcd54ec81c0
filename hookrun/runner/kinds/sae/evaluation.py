"""`sae.evaluate`: after training, the trained SAE spliced into the run's model and evaluated on
held-out items by the evaluate kind itself (its forwards, metrics and table: experiment=sae_eval's run).

    sae: {..., evaluate: {data: {dataset: {start: 4096, max_length: 64}, batch_size: 32}, limit: 256}}

    spec = parse(block.evaluate)                       # None (off) or {data, limit}; one ConfigError line
    check_items(cfg, spec)                             # loss=lm (the default) needs the items' input_ids
    check_model(cfg, cache_config, "outputs/h3_cache")  # the cache's model is the one evaluate splices into
    result = evaluate_sae(cfg, spec, "saes/h3", "transformer.h.3", "saes/h3.evaluation.h5")
    result["model"]["ce_loss_score"], result["splice"]["explained_variance"]

`data` is merged onto the run's own `data:` (the same keys: dataset, batch_size, ...) and `limit`
is the number of held-out items, set as the data set's own `limit` (data=text's: texts read after
`start`). The run is the evaluate kind's: a clean, a spliced (modify_output with op: splice, as
experiment=sae_eval) and a zero-ablated forward per batch, loss=lm unless the run names its loss;
each latent's 20 strongest tokens are kept too (top_examples on `MODULE.sae.latents`, as
experiment=sae_eval), so `python -m hookrun.report OUT.evaluation.h5` shows them. Its file is kept
beside the SAE and its totals (evaluate's definitions: ce_loss_score, kl_div_score; the splice's
l0, mse, explained_variance, dead_fraction) are returned for the run's file (the root attribute
`sae_evaluation`, JSON).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hookrun.errors import ConfigError

KEYS = ("data", "limit")
TOP_K = 20  # each latent's strongest tokens kept (top_examples, as experiment=sae_eval)
LM_LOSS = {"_target_": "hookrun.runner.losses.lm", "_partial_": True, "output_key": None}


def parse(value: Any) -> dict[str, Any] | None:
    """`sae.evaluate` as {data: mapping, limit: int | None}, or None where it is off (null / false)."""
    if value is None or value is False:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(f"sae.evaluate: {value!r}; give {{data: {{...the run's data keys...}}, limit: ITEMS}} "
                          "(held-out items the trained SAE is evaluated on) or null")
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise ConfigError(f"sae.evaluate.{unknown[0]}: not a key of sae.evaluate (it has: data, the held-out items' "
                          "data keys merged onto the run's data; limit, how many items)")
    data = value.get("data") or {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"sae.evaluate.data: {data!r}; give a mapping of data keys (e.g. {{dataset: {{start: 4096}}, "
                          "batch_size: 32}}), merged onto the run's data")
    limit = value.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"sae.evaluate.limit: {limit!r}; give the number of held-out items, at least 1")
    return {"data": dict(data), "limit": limit}


def eval_data(run_data: Mapping, spec: Mapping) -> dict[str, Any]:
    """The run's data with the block's keys merged on, and `limit` as the data set's own limit."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(OmegaConf.merge(OmegaConf.create(dict(run_data)), OmegaConf.create(spec["data"])))
    assert isinstance(data, dict)
    if isinstance(data.get("dataset"), dict) and "live" in data["dataset"]:  # (hookrun.run(..., dataset=...)'s object)
        given = spec["data"].get("dataset")
        if not (isinstance(given, Mapping) and "_target_" in given):
            raise ConfigError("sae.evaluate: the run's data set is the object given to hookrun.run (dataset=...), which "
                              "the evaluation cannot rebuild; give the held-out items' data set as "
                              "sae.evaluate.data.dataset (a node with _target_)")
        data["dataset"] = dict(given)
    if spec["limit"] is not None:
        dataset = data.get("dataset")
        if not isinstance(dataset, dict) or "limit" not in dataset:
            target = dataset.get("_target_") if isinstance(dataset, dict) else dataset
            raise ConfigError(f"sae.evaluate.limit: the data set {target} has no `limit` of items (data=text has); "
                              "give its size in sae.evaluate.data (e.g. {dataset: {size: 256}}) and drop limit")
        dataset["limit"] = spec["limit"]
    return data


def check_items(cfg: Any, spec: Mapping) -> None:
    """The held-out items' data keys (types, ranges) and data set, before any step, named as sae.evaluate's
    (they were found after the training, as data.*); loss=lm (the run names none) reads their input_ids."""
    from hookrun.config import check_config, load

    base = to_dict(cfg)
    data = eval_data(base["data"], spec)
    dataset = data.get("dataset")
    with _as_evaluate():
        check_config(load({"model": base["model"], "data": data}))
    if base.get("loss") or not isinstance(dataset, Mapping) or "live" in dataset:
        return
    from hookrun.config.build import build_dataset

    with _as_evaluate():
        items = build_dataset(dataset)
    item = items[0] if len(items) else None
    if item is not None and not (isinstance(item, Mapping) and "input_ids" in item):
        raise ConfigError(f"sae.evaluate: the held-out items ({dataset.get('_target_')}) have no input_ids for the "
                          "default loss=lm (next-token cross-entropy); name the run's loss (loss=cross_entropy for a "
                          "classifier) or drop sae.evaluate")


@contextlib.contextmanager
def _as_evaluate() -> Iterator[None]:
    """A ConfigError about the held-out items' data keys, named as sae.evaluate.data's."""
    try:
        yield
    except ConfigError as exc:
        raise ConfigError("sae.evaluate: " + re.sub(r"(?<![\w.])data\.", "sae.evaluate.data.", str(exc))) from None


def check_model(cfg: Any, cache_config: Mapping, source: str) -> None:
    """The cache's rows come from the model evaluate splices into (the run's `model:`), or one line."""
    from omegaconf import OmegaConf

    mine = OmegaConf.to_container(OmegaConf.create(to_dict(cfg)["model"]))
    theirs = cache_config.get("model")
    if theirs is not None and mine != theirs:
        raise ConfigError(f"sae.evaluate: the cache {source} was written by the model {_name(theirs)}, but evaluate "
                          f"splices the SAE into this run's model {_name(mine)}; give the cache's model "
                          f"(model=... as its run had) or drop sae.evaluate")


def check_weights(cfg: Any, model: Any, cache: Any, source: str) -> None:
    """The run's model has the weights of the model that wrote the cache (its file's model_fingerprint;
    a random-init model built under another seed is another network, though its `model:` block is the same)."""
    from hookrun.config.build import same_weights, weights_digest

    theirs = cache.attrs.get("model_fingerprint")
    if not theirs or not (mine := weights_digest(model)) or same_weights(str(theirs), mine):
        return
    seed, their_seed = cfg.seed, (cache.config or {}).get("seed")
    hint = (f" (the cache's run had seed={their_seed}, this one seed={seed}: a random-init model is another one "
            f"under another seed); give seed={their_seed}" if their_seed is not None and their_seed != seed
            else "; give the cache's model and weights")
    raise ConfigError(f"sae.evaluate: this run's model does not have the weights of the model that wrote the cache "
                      f"{source}{hint}, or drop sae.evaluate")


def _name(node: Any) -> str:
    if isinstance(node, Mapping):
        rest = {k: v for k, v in node.items() if k != "_target_"}
        return f"{node.get('_target_', node.get('live', '?'))}" + (f" {json.dumps(rest, default=str)}" if rest else "")
    return repr(node)


def to_dict(cfg: Any) -> dict[str, Any]:
    """The run's resolved config as a plain mapping (its stored YAML), kind blocks included."""
    from omegaconf import OmegaConf

    from hookrun.config.schema import to_yaml

    out = OmegaConf.to_container(OmegaConf.create(to_yaml(cfg)))
    assert isinstance(out, dict)
    return out


def eval_config(cfg: Any, spec: Mapping, sae: str | Path, module: str, path: str | Path,
                arg: int | str | None = None) -> dict[str, Any]:
    """experiment=sae_eval's run, on this run's model and the block's data: a plain config mapping (`arg`:
    the part of a tuple output the SAE was trained on)."""
    base = to_dict(cfg)
    keep = ("model", "device", "seed", "params", "imports", "progress")
    out = {k: base[k] for k in keep if k in base}
    out.update(data=eval_data(base["data"], spec), loss=base.get("loss") or LM_LOSS, mode="eval",
               evaluate={"enabled": True, "ablation": "zero"},
               hooks={"sae": {"at": module, "type": "forward",
                              "actions": [{"name": "modify_output", "op": "splice", "path": str(sae),
                                           "error_term": False, **({} if arg is None else {"arg": arg})}]},
                      "latents": {"at": f"{module}.sae.latents", "type": "forward",  # as experiment=sae_eval
                                  "actions": [{"name": "top_examples", "k": TOP_K, "context": 12}]}},
               output={"path": str(path), "overwrite": True})
    return out


def evaluate_sae(cfg: Any, spec: Mapping, sae: str | Path, module: str, path: str | Path,
                 model: Any = None, arg: int | str | None = None) -> dict[str, Any]:
    """Run the evaluate kind on the trained SAE; its totals: {file, items, model: {...}, splice: {...}}."""
    import h5py

    from hookrun.runner import run
    from hookrun.runner.kinds.evaluate.table import read_evaluation

    result = run(eval_config(cfg, spec, sae, module, path, arg), model=model)
    with h5py.File(result.path, "r") as f:
        rows, _ = read_evaluation(f)
        totals = rows[max(rows)].totals or {}
    return {"file": str(result.path), "items": int(result.samples), "module": module,
            "model": dict(totals.get("", {})), "splice": dict(totals.get(module, {}))}
