"""An sae run under many processes is refused in one line before anything is written: SAELens' trainer
runs in one process, so two torchrun ranks each trained the whole SAE into the same sae.out, and the
merged view held every training step twice (64 curve rows for a 32-step run)."""

from __future__ import annotations

import pytest
from test_sae_kind import config
from test_sae_train import CAPTURE, make_cache

from hookrun.config import load
from hookrun.errors import ConfigError
from hookrun.runner.kinds import check_config

pytest.importorskip("sae_lens")

LINE = ("sae with 2 processes (torchrun): SAELens' trainer runs in one process, so every rank would train the "
        "whole SAE again into the same sae.out; run it in one process (python -m hookrun)")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return make_cache(tmp_path_factory.mktemp("sae_ranks_cache"))


def test_an_sae_config_under_two_torchrun_ranks_is_refused_by_the_checks(cache, tmp_path, monkeypatch):
    """The checks every rank runs before any batch (the CLI's path): ConfigError, its one line."""
    cfg = load(config(cache, tmp_path / "run"))
    check_config(cfg)  # one process: accepted
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "t"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError) as info:
        check_config(cfg)
    assert str(info.value) == LINE and getattr(info.value, "every_rank", False)


@pytest.mark.slow
def test_torchrun_sae_training_is_one_line_and_leaves_no_file(cache, tmp_path):
    """The shipped experiment (data.dataset.limit: 1) under two torchrun ranks: the sae line, printed once,
    not the batch count's, and no shard, view or SAE."""
    from rank_runs import TORCHRUN, cli

    proc = cli("experiment=sae_train", f"sae.from={cache}", f"sae.capture={CAPTURE}", "sae.d_sae=32", "sae.k=4",
               "sae.rows=640", "sae.batch_rows=32", "sae.lr_schedule.warmup=2", "sae.out=run/sae", "hydra.run.dir=run",
               "device=cpu", "progress=false", cwd=tmp_path, launcher=TORCHRUN)
    assert proc.returncode != 0
    assert proc.stderr.count("hookrun: error:") == 1, proc.stderr[-3000:]
    assert f"hookrun: error: {LINE}\n" in proc.stderr
    assert not list((tmp_path / "run").glob("captures*")) and not (tmp_path / "run" / "sae").exists()
