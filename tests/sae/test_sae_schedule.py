"""sae.lr_schedule as SAELens' scheduler reads it, and what SAELens cannot honour refused in one line.

The reference is SAELens' own `get_lr_scheduler` (sae_lens.training.optim), called here directly on an
Adam optimizer and stepped once per training step, as its SAETrainer steps it: the lr after each step
is what the run's `sae/curves/lr` must hold. SAELens' constant schedule ignores `lr_end` (checked here
on that same function), so `end` is refused there; with `scheduler: cosineannealing` the curve ends at
`end`. A warmup longer than the run, and windows below 1 step (SAELens counts a latent dead once silent
for more than dead_feature_window steps; it divides by feature_sampling_window), are refused too.
"""

from __future__ import annotations

import pytest
import torch
from test_sae_kind import BATCH, ROWS, bad, config
from test_sae_train import make_cache

import hookrun

sae_lens = pytest.importorskip("sae_lens")
from sae_lens.training.optim import get_lr_scheduler  # noqa: E402

STEPS = ROWS // BATCH  # 20
LR = 1e-3


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return make_cache(tmp_path_factory.mktemp("sae_schedule_cache"))


def saelens_lrs(name: str, warmup: int, decay_steps: int, end: float, steps: int = STEPS) -> list[float]:
    """The lr after each step of SAELens' own scheduler (its trainer: optimizer.step, then scheduler.step)."""
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    sched = get_lr_scheduler(name, opt, training_steps=steps, lr=LR, warm_up_steps=warmup, decay_steps=decay_steps,
                             lr_end=end, num_cycles=1)
    out = []
    for _ in range(steps):
        opt.step()
        sched.step()
        out.append(opt.param_groups[0]["lr"])
    return out


@pytest.mark.parametrize(("schedule", "decay_steps"), [
    ({"warmup": 2, "decay": 0.0, "scheduler": "cosineannealing", "end": 1e-5}, 0),
    ({"warmup": 3, "decay": 0.2, "scheduler": "cosineannealing", "end": 2e-4}, 4),
])
def test_cosine_schedule_lr_curve_is_saelens_and_reaches_end(cache, tmp_path, schedule, decay_steps):
    torch.set_num_threads(1)
    result = hookrun.run(config(cache, tmp_path / "run", lr=LR, lr_schedule=schedule))
    with hookrun.open_run(result.path) as run:
        got = run.sae_curves().column("lr")
    want = saelens_lrs("cosineannealing", schedule["warmup"], decay_steps, schedule["end"])
    assert got == pytest.approx(want, rel=1e-6, abs=1e-12)
    # (without decay the curve ends at `end`; with it, SAELens' decay falls from `end` to 0)
    assert got[-1] == pytest.approx(schedule["end"] if not decay_steps else 0.0, abs=1e-12)
    if decay_steps:
        assert got[STEPS - decay_steps - 1] == pytest.approx(schedule["end"], rel=1e-6)


def test_what_saelens_cannot_honour_is_one_line(cache, tmp_path):
    # SAELens' constant schedule: the same curve whatever lr_end (so `end` there would be a no-op)
    assert saelens_lrs("constant", 2, 4, 1e-5) == saelens_lrs("constant", 2, 4, 5e-4)
    for end in (-1.0, 1e-5):
        msg = bad(cache, tmp_path, lr_schedule={"warmup": 2, "end": end})
        assert msg.startswith("sae.lr_schedule.end: SAELens' constant schedule has no end lr") and "\n" not in msg
        assert "sae.lr_schedule.scheduler=cosineannealing" in msg
    assert "must lie in [0, lr 0.001]" in bad(cache, tmp_path, lr=LR, lr_schedule={"scheduler": "cosineannealing",
                                                                                    "end": -1})
    # a warmup longer than the run: SAELens' own scheduler ends it still warming up
    assert saelens_lrs("constant", 2 * STEPS, 0, 1e-4)[-1] < 0.6 * LR
    msg = bad(cache, tmp_path, lr_schedule={"warmup": STEPS + 1})
    assert msg == (f"sae.lr_schedule.warmup: {STEPS + 1} warmup steps is longer than the {STEPS} steps SAELens' schedule "
                   f"spans (rows // batch_rows; a last, smaller batch is one step more): the run would end still warming "
                   f"up; give warmup <= {STEPS}")
    assert "leave no step of the 20 SAELens' schedule spans for the cosine" in bad(
        cache, tmp_path, lr_schedule={"warmup": 16, "decay": 0.2, "scheduler": "cosineannealing"})
    assert "choose constant (lr held) or cosineannealing" in bad(cache, tmp_path, lr_schedule={"scheduler": "cosine"})
    msg = bad(cache, tmp_path, dead_feature_window=0)
    assert msg.startswith("sae.dead_feature_window: 0; SAELens counts a latent dead once it has been silent for more "
                          "than this many steps") and "give a whole number of steps >= 1" in msg
    assert bad(cache, tmp_path, feature_sampling_window=0).startswith("sae.feature_sampling_window: 0; SAELens takes")


def test_a_capture_of_one_number_per_row_gets_advice_that_fits(cache, tmp_path):
    """An SAE run's own file (sae/curves/l0: a number per step) as `from`: no row layout applies."""
    torch.set_num_threads(1)
    trained = hookrun.run(config(cache, tmp_path / "trained", rows=64)).path
    msg = bad(str(trained), tmp_path, capture="sae/curves/l0")
    assert msg.startswith("sae.capture: sae/curves/l0 holds one number per row (shape (2,)), not a vector")
    assert "rows=channel" not in msg and "rows: token" in msg and "holds none" in msg



def test_a_warmup_the_constant_schedules_decay_would_cut_short_is_one_line(cache, tmp_path):
    """SAELens' constant schedule starts its decay at step steps - decay whatever the warmup: where that comes before
    the warmup's last step, the warmup is cut short and the lr jumps to lr (here on SAELens' own scheduler: a warmup of
    16 steps with 10 of decay over 20 went to 10/16 of lr, then lr; one of 12, to 10/12, then lr). Such a block was
    run as given; it is refused in one line. A warmup that ends where the decay starts (warmup + decay = steps + 1)
    is whole and runs, its lr curve SAELens'."""
    torch.set_num_threads(1)
    jumps = {w: max(b - a for a, b in zip(lrs, lrs[1:], strict=False))
             for w in (16, 12, 11) for lrs in [saelens_lrs("constant", w, 10, 1e-4)]}
    assert jumps[16] == pytest.approx(LR * 6 / 16) and jumps[12] == pytest.approx(LR * 2 / 12)  # (cut short)
    assert jumps[11] == pytest.approx(LR / 11)  # (a whole warmup: no step larger than its own)
    for warmup in (16, 12):
        assert bad(cache, tmp_path, lr_schedule={"warmup": warmup, "decay": 0.5}) == (
            f"sae.lr_schedule: warmup {warmup} + decay 10 steps overlap in the 20 steps SAELens' schedule spans: its "
            "decay from step 10 cuts the warmup short, the lr jumping to lr; give warmup + decay x steps <= 21")
    result = hookrun.run(config(cache, tmp_path / "run", lr=LR, lr_schedule={"warmup": 11, "decay": 0.5}))
    with hookrun.open_run(result.path) as run:
        assert run.sae_curves().column("lr") == pytest.approx(saelens_lrs("constant", 11, 10, 1e-4), rel=1e-6, abs=1e-12)
