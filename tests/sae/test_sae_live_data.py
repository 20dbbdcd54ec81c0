"""The `sae:` kind on the fly reads the data a run is given: `data.limit` bounds each pass (the
reference: SAELens' trainer on a raw forward hook's rows of only the first data.limit batches), and an
item that raises is one line naming its batch. Before: LiveRows iterated the whole loader, so
data.limit=1 of 20 shapes in batches of 8 trained on all 20 (the log said 2 passes, not 5), and an
IndexError of the data set came out as a traceback."""

from __future__ import annotations

import pytest
import torch
from conftest import ENV, run_cli

import hookrun
from hookrun.errors import ConfigError

sae_lens = pytest.importorskip("sae_lens")
from sae_lens import TopKTrainingSAE, TopKTrainingSAEConfig  # noqa: E402
from saelens_reference import saelens_fit  # noqa: E402


def test_data_limit_bounds_each_pass_on_the_fly(tmp_path):
    from hookrun.data import shapes
    from hookrun.models import tiny_cnn

    torch.set_num_threads(1)
    data = shapes(size=20, seed=0)
    images = torch.stack([data[i][0] for i in range(8)])  # data.limit=1 batch of 8: images 0..7 only
    model, seen = tiny_cnn().eval(), []
    model.block3.register_forward_hook(lambda m, i, o: seen.append(o))
    with torch.no_grad():
        model(images)
    rows = torch.cat(seen).movedim(1, -1).reshape(-1, 32)  # 512 rows
    cfg = hookrun.compose("experiment=sae_shapes", "data.dataset.size=20", "data.batch_size=8", "data.limit=1",
                          "sae.budget=1280", "sae.batch_rows=128", "sae.shuffle=false", "sae.d_sae=64",
                          "sae.lr_schedule.warmup=2", "progress=false", f"hydra.run.dir={tmp_path / 'run'}")
    result = hookrun.run(cfg)
    torch.manual_seed(0)
    ref = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=32, d_sae=64, k=8))
    logs = saelens_fit(ref, rows, 1280, 128, lr_warm_up_steps=2, lr_decay_steps=2)  # 10 steps: 2.5 passes
    with hookrun.open_run(result.path) as run:
        got = [r["mse_loss"] for r in run.sae_curves().rows]
    assert len(got) == 10
    assert got == pytest.approx([w["losses/mse_loss"] for w in logs], rel=1e-5)


def test_an_item_that_raises_on_the_fly_is_one_line(tmp_path):
    proc = run_cli("hydra.run.dir=run", "model=custom", "model._target_=odd_items.Net", "data=custom",
                   "data.dataset._target_=odd_items.Items", "+data.dataset.form=short", "data.batch_size=2",
                   "+sae={at: fc, architecture: topk, d_sae: 8, k: 2, batch_rows: 4, rows: 64, shuffle: false, "
                   "checkpoints: 0}", "progress=false", "device=cpu", cwd=tmp_path, env=ENV)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hookrun: error:")]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1 and "data: loading batch 2 (items 4..5) failed: IndexError" in lines[0], lines
    assert "the dataset's len() is 8" in lines[0]


class TwoRelu(torch.nn.Module):
    """One ReLU called twice in a forward, as torchvision's BasicBlock calls its `relu`."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1, self.conv2 = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Conv2d(4, 4, 3, padding=1)
        self.relu = torch.nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.conv2(self.relu(self.conv1(x)))).mean((1, 2, 3))


def test_on_the_fly_at_a_module_called_twice_is_one_line_before_any_step(tmp_path):
    """LiveRows cut each forward short at the module's first call: an SAE at a BasicBlock's relu trained on
    the first call's maps only, and nothing said so."""
    data = torch.utils.data.TensorDataset(torch.randn(8, 3, 4, 4, generator=torch.Generator().manual_seed(0)))
    sae = {"at": "relu", "from": None, "rows": "channel", "budget": 256, "d_sae": 8, "architecture": "standard",
           "batch_rows": 16, "checkpoints": 0, "shuffle": False, "out": str(tmp_path / "sae")}
    cfg = {"data": {"batch_size": 4}, "progress": False, "output": {"path": str(tmp_path / "c.h5")}, "sae": sae}
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg, model=TwoRelu().eval(), dataset=data)
    assert str(err.value) == ("sae.at: relu runs 2 times in one forward (a shared module, or one called in a loop): "
                              "which call's output to train on is not defined; name a module that runs once per "
                              "forward (python -m hookrun.modules shows the calls)")
    assert not (tmp_path / "sae").exists()
    hookrun.run({**cfg, "sae": {**sae, "at": "conv2"}}, model=TwoRelu().eval(), dataset=data)  # once a forward: trains
