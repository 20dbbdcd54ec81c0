"""hookrun.similarity: a `similarity:` block on a live model and data set, its matrix returned (notebooks).

    m = hookrun.similarity(model, dataset, at=["layer1", "layer2", "layer3", "layer4"], batch_size=64)
    m.sel(at="layer1", with_at="layer2")     # xarray.DataArray (at, with_at), as run.similarity()
    hookrun.similarity(model, dataset, at=["layer4"], with_={"model": other_model, "at": ["layer4"]})

The same block, checks, pass and estimators as a file run (`similarity:` in a config); `with_` is the
block's `with:` (a second model's node and its `at`). The run is written to a temporary file, read
back and removed (runner/kinds/temporary_run.py); give the block to `hookrun.run` with an `output.path` to keep it.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from hookrun.config import live_node
from hookrun.errors import ConfigError
from hookrun.runner.kinds.similarity.block import LIVE_WITH
from hookrun.runner.kinds.similarity.reader import read_similarity
from hookrun.runner.kinds.temporary_run import temporary_run


def similarity(model: nn.Module, dataset: Any, batch_size: int = 16, inputs: Any = None, with_: Any = None,
               **block: Any) -> Any:
    """The measure between every pair of hook points of `block["at"]` (and `with_["at"]` of a second model).

    Args:
        model: any nn.Module; it stays on its device and comes back in the mode it went in.
        dataset: the items, as a file run's data.
        batch_size, inputs: `data.batch_size` and `data.inputs` of a file run.
        with_: the block's `with:`: {model: MODULE or {_target_: ...}, at: [...]} (a live nn.Module is
            run on its device as it is and handed back in the mode it went in), or None.
        **block: the other keys of the `similarity:` block (at, measure, estimator, sigma, dissimilarity,
            pool, memory): docs/similarity.md.

    Returns:
        xarray.DataArray with dims (at, with_at) (needs xarray, as run.similarity() does).

    Raises:
        ConfigError: a bad block or input, one line, before any batch.
    """
    if with_ is not None and not isinstance(with_, dict):  # (a model given as with_= itself: the block's with: is a mapping)
        raise ConfigError(f"similarity: with_ is the block's with:, a dict {{'model': ..., 'at': [...]}}; got a "
                          f"{type(with_).__name__}: give with_={{'model': other, 'at': ['layer4']}} with the second model's "
                          f"modules in 'at'")
    other = with_.get("model") if isinstance(with_, dict) else None
    if isinstance(other, nn.Module):  # a live second model: the file's config names its class, as for `model`
        with_ = {**with_, "model": live_node(other)}
    if with_ is not None:
        block = {**block, "with": with_}
    return temporary_run("similarity", block, model, dataset, batch_size, inputs, read_similarity,
                         live=(LIVE_WITH, other if isinstance(other, nn.Module) else None))
