"""`sae.rows` as the issue writes it: a number is the training budget, `token | channel` the row
layout (then `budget:` is the budget); `vectors:` stays a synonym. The channel layout's training is
checked against SAELens' SAETrainer on a raw forward hook's rows by tests/sae/test_sae_shapes.py,
whose runs take experiment=sae_shapes as shipped (`rows: channel`, `budget:`)."""

from __future__ import annotations

import pytest

import hookrun
from hookrun.errors import ConfigError
from hookrun.runner.kinds.sae.block import SaeBlock

pytest.importorskip("sae_lens")


def checked(**keys) -> SaeBlock:
    block = SaeBlock(at="block3", batch_rows=128, **keys)
    block.check()
    return block


@pytest.mark.parametrize(("keys", "budget", "layout"), [
    ({"rows": 2560}, 2560, "auto"),
    ({"rows": "token", "budget": 2560}, 2560, "auto"),
    ({"rows": "channel", "budget": 2560}, 2560, "channel"),
    ({"rows": 2560, "vectors": "channel"}, 2560, "channel"),
    ({"rows": "channel", "budget": 2560, "vectors": "channel"}, 2560, "channel"),
    ({"budget": 2560}, 2560, "auto"),
    ({"rows": 2560.0}, 2560, "auto"),
])
def test_rows_is_the_budget_or_the_layout(keys, budget, layout):
    block = checked(**keys)
    assert (block.rows, block.vectors) == (budget, layout)


@pytest.mark.parametrize(("keys", "match"), [
    ({"rows": "chanel", "budget": 2560}, r"sae.rows: 'chanel'; give the training budget .* did you mean 'channel'\?"),
    ({"rows": "channel"}, r"sae.budget: rows: channel names the row layout"),
    ({"rows": "token", "budget": 2560, "vectors": "channel"}, r"sae.rows: token and sae.vectors: channel disagree"),
    ({"rows": 1000, "budget": 2560}, r"sae.budget: 2560 and sae.rows: 1000 are both a budget"),
    ({"rows": True}, r"sae.rows: True; the training budget is a whole number"),
    ({"rows": "channel", "budget": 64}, r"sae.rows: the training budget \(64 rows\) is smaller than one batch"),
    ({"rows": 2560, "vectors": "pixel"}, r"sae.vectors: 'pixel'"),
])
def test_a_wrong_rows_value_is_one_line(keys, match):
    with pytest.raises(ConfigError, match=match) as err:
        checked(**keys)
    assert "\n" not in str(err.value)


def test_a_wrong_rows_value_from_the_command_line_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="sae.rows: 'pixel'"):
        hookrun.run(hookrun.compose("experiment=sae_shapes", "sae.rows=pixel", "progress=false",
                                    f"hydra.run.dir={tmp_path}"))
    assert not any(tmp_path.iterdir())

