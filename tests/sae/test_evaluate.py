"""evaluate: every metric against its definition computed here with plain torch on the same weights
and tokens (raw forward hooks for the intervened and ablated forwards), per batch and for the run;
a classifier; the splice seam; mean ablation; resume; the sweep table; bad input."""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import run_cli
from lm_runs import GPT, lm_cfg, scaled_block
from torch import nn
from torch.utils.data import DataLoader

import hookrun
from hookrun.errors import ConfigError
from hookrun.hooks.ops import register_op

pytest.importorskip("transformers")

RTOL = 1e-5


def reference_lm():
    """The model hookrun builds (seed 0) and the same batches, built here."""
    from hookrun.models import hf
    from hookrun.runner.prepare import seed_everything

    seed_everything(0)
    model = hf(config=GPT).eval()
    return model


def lm_batches(tmp_path: Path):
    from hookrun.data import text

    return list(DataLoader(text(files=str(tmp_path / "lines.txt"), max_length=16), batch_size=3))


def logits_with(model, batch, edit=None) -> torch.Tensor:
    handle = model.transformer.h[0].register_forward_hook(edit) if edit is not None else None
    try:
        with torch.no_grad():
            return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    finally:
        if handle is not None:
            handle.remove()


def token_ce(logits, ids, mask) -> torch.Tensor:
    """Per predicted token (pairs without padding): the cross-entropy terms."""
    per = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none")
    keep = (mask[:, 1:].bool() & mask[:, :-1].bool()).reshape(-1)
    return per[keep]


def token_kl(clean, other, mask) -> torch.Tensor:
    """Per real token: KL(clean || other), summed over the vocabulary."""
    kl = F.kl_div(F.log_softmax(other, -1), F.log_softmax(clean, -1), log_target=True, reduction="none").sum(-1)
    return kl[mask.bool()]


def reference_metrics(model, batches, ablate=None, factor=0.5):
    """Per batch and for the run, by the definitions (SAELens' get_recons_loss, padding left out)."""
    ablate = ablate or (lambda m, a, o: torch.zeros_like(o))
    per_batch, terms = [], {k: [] for k in ("ce_clean", "ce_intervened", "ce_ablated", "kl_intervened", "kl_ablated")}
    for b in batches:
        ids, mask = b["input_ids"], b["attention_mask"]
        clean = logits_with(model, b)
        inter = logits_with(model, b, lambda m, a, o: o * factor)
        abl = logits_with(model, b, ablate)
        t = {"ce_clean": token_ce(clean, ids, mask), "ce_intervened": token_ce(inter, ids, mask),
             "ce_ablated": token_ce(abl, ids, mask), "kl_intervened": token_kl(clean, inter, mask),
             "kl_ablated": token_kl(clean, abl, mask)}
        per_batch.append(with_scores({k: v.double().mean().item() for k, v in t.items()}))
        for k, v in t.items():
            terms[k].append(v.double())
    run = with_scores({k: torch.cat(v).mean().item() for k, v in terms.items()})
    return per_batch, run


def with_scores(m: dict) -> dict:
    m["ce_loss_score"] = (m["ce_ablated"] - m["ce_intervened"]) / (m["ce_ablated"] - m["ce_clean"])
    m["kl_div_score"] = (m["kl_ablated"] - m["kl_intervened"]) / m["kl_ablated"]
    return m


def check_file(path: Path, per_batch: list[dict], run: dict) -> None:
    with h5py.File(path) as f:
        g = f["evaluation"]
        np.testing.assert_array_equal(g["step"][:], np.arange(len(per_batch)))
        for name in run:
            np.testing.assert_allclose(g["model"][name][:], [b[name] for b in per_batch], rtol=RTOL, err_msg=name)
            np.testing.assert_allclose(g["model"].attrs[name], run[name], rtol=RTOL, err_msg=name)


def test_lm_metrics_equal_their_definitions_per_batch_and_for_the_run(tmp_path):
    path = hookrun.run(lm_cfg(tmp_path, scaled_block(0.5), {"ablation": "zero"})).path
    batches = lm_batches(tmp_path)
    assert any((b["attention_mask"] == 0).any() for b in batches)  # padded batches
    per_batch, run = reference_metrics(reference_lm(), batches)
    check_file(path, per_batch, run)
    with h5py.File(path) as f:
        mask = np.concatenate([b["attention_mask"].numpy() for b in batches])
        assert f["evaluation/model"].attrs["kl_count"] == mask.sum()
        assert f["evaluation/model"].attrs["ce_count"] == (mask[:, 1:] * mask[:, :-1]).sum()
        assert f["evaluation"].attrs["ablation"] == "zero"
    table = hookrun.open_run(path).evaluation()
    assert table.columns == ["module", "ce_clean", "ce_intervened", "ce_ablated", "ce_loss_score", "kl_intervened",
                             "kl_ablated", "kl_div_score"]
    (row,) = table.rows
    assert row["module"] == "transformer.h.0"
    for name, value in run.items():
        assert math.isclose(row[name], value, rel_tol=RTOL), name
    df = table.to_pandas() if _has_pandas() else None
    if df is not None:
        assert list(df["module"]) == ["transformer.h.0"]
    per = hookrun.open_run(path).evaluation(batches=True)
    assert [r["step"] for r in per] == list(range(len(batches)))


def _has_pandas() -> bool:
    try:
        import pandas  # noqa: F401
    except ImportError:
        return False
    return True


def test_without_ablation_only_clean_and_intervened(tmp_path):
    path = hookrun.run(lm_cfg(tmp_path, scaled_block(0.5), {})).path
    per_batch, run = reference_metrics(reference_lm(), lm_batches(tmp_path))
    keep = ("ce_clean", "ce_intervened", "kl_intervened")
    check_file(path, [{k: b[k] for k in keep} for b in per_batch], {k: run[k] for k in keep})
    with h5py.File(path) as f:
        assert sorted(f["evaluation/model"]) == ["ce_clean", "ce_count", "ce_intervened", "kl_count", "kl_intervened"]


def test_records_come_from_the_intervened_forward_only(tmp_path):
    hooks = {**scaled_block(0.5), "logits": {"at": "lm_head", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
             "resid": {"at": "transformer.h.1", "type": "forward", "actions": [{"name": "record", "what": "output", "rows": "token"}]}}
    with_eval = hookrun.run(lm_cfg(tmp_path, hooks, {"ablation": "zero"}, "a.h5")).path
    without = hookrun.run(lm_cfg(tmp_path, hooks, None, "b.h5")).path
    model = reference_lm()
    expected = torch.cat([logits_with(model, b, lambda m, a, o: o * 0.5) for b in lm_batches(tmp_path)])
    with h5py.File(with_eval) as a, h5py.File(without) as b:
        assert a["captures/logits/lm_head/output"].shape == b["captures/logits/lm_head/output"].shape
        np.testing.assert_array_equal(a["captures/logits/lm_head/output"][:], b["captures/logits/lm_head/output"][:])
        np.testing.assert_array_equal(a["captures/resid/transformer.h.1/output"][:], b["captures/resid/transformer.h.1/output"][:])
        np.testing.assert_allclose(a["captures/logits/lm_head/output"][:], expected.numpy(), rtol=1e-5, atol=1e-6)
        assert "evaluation" not in b


def test_mean_ablation_uses_the_mean_of_an_earlier_runs_rows(tmp_path):
    record = {"resid": {"at": "transformer.h.0", "type": "forward", "actions": [{"name": "record", "what": "output", "rows": "token"}]}}
    source = hookrun.run(lm_cfg(tmp_path, record, None, "source.h5")).path
    with h5py.File(source) as f:
        mean = torch.from_numpy(f["captures/resid/transformer.h.0/output"][:].astype(np.float64).mean(0)).float()
    path = hookrun.run(lm_cfg(tmp_path, scaled_block(0.5), {"ablation": "mean", "mean": str(source)})).path
    per_batch, run = reference_metrics(reference_lm(), lm_batches(tmp_path),
                                       ablate=lambda m, a, o: mean.expand_as(o).clone())
    check_file(path, per_batch, run)
    with h5py.File(path) as f:
        assert f["evaluation"].attrs["mean"] == str(source)


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh())
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        return self.head(self.body(x))


class Points(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10  # batches of 4, 4, 2: the run's mean weights them by their samples

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(6, generator=g), i % 5


def test_a_classifier_is_evaluated_with_the_configured_loss(tmp_path):
    torch.manual_seed(3)
    model = Classifier().eval()
    hooks = {"damp": {"at": "body", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": 0.3}]}}
    cfg = {"hooks": hooks, "evaluate": {"ablation": "zero"}, "device": "cpu", "progress": False,
           "loss": {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True},
           "data": {"batch_size": 4}, "output": {"path": str(tmp_path / "c.h5")}}
    path = hookrun.run(cfg, model=model, dataset=Points()).path
    per_batch, terms = [], {k: [] for k in ("ce_clean", "ce_intervened", "ce_ablated", "kl_intervened", "kl_ablated")}
    for x, y in DataLoader(Points(), batch_size=4):
        with torch.no_grad():
            clean = model(x)
            inter = model.head(model.body(x) * 0.3)
            abl = model.head(torch.zeros(len(x), 16))
        t = {"ce_clean": F.cross_entropy(clean, y, reduction="none"), "ce_intervened": F.cross_entropy(inter, y, reduction="none"),
             "ce_ablated": F.cross_entropy(abl, y, reduction="none"), "kl_intervened": token_kl(clean, inter, torch.ones(len(x))),
             "kl_ablated": token_kl(clean, abl, torch.ones(len(x)))}
        per_batch.append(with_scores({k: v.double().mean().item() for k, v in t.items()}))
        for k, v in t.items():
            terms[k].append(v.double())
    run = with_scores({k: torch.cat(v).mean().item() for k, v in terms.items()})
    check_file(path, per_batch, run)
    with h5py.File(path) as f:
        np.testing.assert_array_equal(f["evaluation/model/ce_count"][:], [4, 4, 2])


class FakeStats:
    """The splice statistics' interface (the splice op registers one): counts what it saw."""

    def __init__(self) -> None:
        self.calls, self.resets = 0, 0
        self.sq, self.n, self.b_sq, self.b_n = 0.0, 0, 0.0, 0

    def see(self, x, y) -> None:
        self.calls += 1
        d = float(((x - y) ** 2).sum())
        self.sq, self.n, self.b_sq, self.b_n = self.sq + d, self.n + x.numel(), self.b_sq + d, self.b_n + x.numel()

    def reset_batch(self) -> None:
        self.resets += 1
        self.b_sq, self.b_n = 0.0, 0

    def batch(self) -> dict:
        return {"mse": self.b_sq / self.b_n, "l0": 3.0}

    def totals(self) -> dict:
        return {"mse": self.sq / self.n, "l0": 3.0, "dead_fraction": 0.25}

    def state(self) -> dict:
        return {"sq": np.array(self.sq), "n": np.array(self.n)}

    def load_state(self, state: dict) -> None:
        self.sq, self.n = float(state["sq"]), int(state["n"])


class FakeSplice:
    def __init__(self, module: str) -> None:
        self.module, self.stats = module, FakeStats()


SPLICES: list[FakeSplice] = []


@register_op("fake_splice_for_tests")
def fake_splice(factor: float = 0.5, *, build):
    splice = FakeSplice(build.point.module)
    build.env.splices.append(splice)
    SPLICES.append(splice)

    def op(x, ctx):
        y = x * factor
        splice.stats.see(x, y)
        return y

    return op


def splice_hooks() -> dict:
    return {"sae": {"at": "transformer.h.0", "type": "forward",
                    "actions": [{"name": "modify_output", "op": "fake_splice_for_tests", "factor": 0.5}]}}


def test_a_splice_adds_its_metrics_to_its_modules_row(tmp_path):
    SPLICES.clear()
    path = hookrun.run(lm_cfg(tmp_path, splice_hooks(), {"ablation": "zero"})).path
    batches = lm_batches(tmp_path)
    (splice,) = SPLICES
    assert splice.stats.calls == len(batches) == splice.stats.resets  # the intervened forward only; reset before each
    per_batch, run = reference_metrics(reference_lm(), batches)  # a splice is ablated like any op
    check_file(path, per_batch, run)
    model = reference_lm()
    mses, out = [], []
    h = model.transformer.h[0].register_forward_hook(lambda m, a, o: out.append(o))
    for b in batches:
        with torch.no_grad():
            model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
        mses.append(((out.pop() * 0.5) ** 2).mean().item())
    h.remove()
    with h5py.File(path) as f:
        g = f["evaluation/splices/transformer.h.0"]
        assert g.attrs["module"] == "transformer.h.0"
        np.testing.assert_allclose(g["mse"][:], mses, rtol=1e-5)
        np.testing.assert_array_equal(g["l0"][:], 3.0)
        assert g.attrs["dead_fraction"] == 0.25 and "state" in g
    table = hookrun.open_run(path).evaluation()
    assert table.columns[-3:] == ["l0", "mse", "dead_fraction"]
    assert table[0]["l0"] == 3.0 and math.isclose(table[0]["ce_clean"], run["ce_clean"], rel_tol=RTOL)
    summary = hookrun.open_run(path).summary(stats=False)
    assert "evaluation (3 batches; ablation zero, loss lm)" in summary and "dead_fraction" in summary


def joint_logits(model, batch, edits: dict) -> torch.Tensor:
    """The logits with a raw forward hook on each block in `edits` (block -> hook), all at once."""
    handles = [model.transformer.h[i].register_forward_hook(e) for i, e in edits.items()]
    try:
        with torch.no_grad():
            return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    finally:
        for h in handles:
            h.remove()


def test_two_modified_modules_are_one_joint_row_not_a_row_each(tmp_path):
    hooks = {"half": {"at": "transformer.h.0", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": 0.5}]},
             "one": {"at": "transformer.h.1", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": 1.0}]}}
    path = hookrun.run(lm_cfg(tmp_path, hooks, {"ablation": "zero"})).path
    model, batches = reference_lm(), lm_batches(tmp_path)
    scale = {0: lambda m, a, o: o * 0.5, 1: lambda m, a, o: o * 1.0}
    zero = {i: (lambda m, a, o: torch.zeros_like(o)) for i in (0, 1)}
    terms = {k: [] for k in ("ce_clean", "ce_intervened", "ce_ablated")}
    for b in batches:
        for name, edits in (("ce_clean", {}), ("ce_intervened", scale), ("ce_ablated", zero)):
            terms[name].append(token_ce(joint_logits(model, b, edits), b["input_ids"], b["attention_mask"]).double())
    joint = {k: torch.cat(v).mean().item() for k, v in terms.items()}
    # h.1 times 1.0 alone changes nothing: the joint effect is h.0's, and is no row of h.1's own
    assert not math.isclose(joint["ce_intervened"], joint["ce_clean"], rel_tol=1e-4)
    label = "transformer.h.0 + transformer.h.1 (joint)"
    run = hookrun.open_run(path)
    (row,) = run.evaluation().rows  # one intervention, one row
    assert row["module"] == label
    for name, value in joint.items():
        assert math.isclose(row[name], value, rel_tol=RTOL), name
    per = run.evaluation(batches=True)
    assert [r["step"] for r in per] == list(range(len(batches))) and {r["module"] for r in per} == {label}
    assert sum(r["ce_count"] for r in per) == sum(len(t) for t in terms["ce_clean"])  # each batch's tokens once
    lines = run.summary(stats=False).splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("  evaluation ("))
    assert label in lines[head + 3] and "transformer.h." not in "".join(lines[head + 4:])  # inspect: the one row


def test_resume_keeps_the_rows_and_the_totals_of_an_uninterrupted_run(tmp_path):
    from toy_models import STOP_AT

    from hookrun.output.process import Interrupted

    hooks = {**splice_hooks(), "stop": {"at": "transformer.h.1", "type": "forward",
                                        "actions": [{"_target_": "toy_models.signal_when_told", "_partial_": True}]}}
    full = hookrun.run(lm_cfg(tmp_path, hooks, {"ablation": "zero"}, "full.h5")).path
    cfg = lm_cfg(tmp_path, hooks, {"ablation": "zero"}, "part.h5", output={"path": str(tmp_path / "part.h5"), "flush_every": 1})
    STOP_AT[:] = [1]
    with pytest.raises(Interrupted):
        hookrun.run(cfg)
    with h5py.File(tmp_path / "part.h5") as f:
        assert f["evaluation/step"].shape == (2,)
    cfg["resume"] = True
    assert hookrun.run(cfg).status == "complete"
    per_batch, run = reference_metrics(reference_lm(), lm_batches(tmp_path))
    check_file(tmp_path / "part.h5", per_batch, run)
    with h5py.File(full) as a, h5py.File(tmp_path / "part.h5") as b:
        for name in ("mse", "l0"):
            np.testing.assert_array_equal(a[f"evaluation/splices/transformer.h.0/{name}"][:],
                                          b[f"evaluation/splices/transformer.h.0/{name}"][:])
        # the splice's run totals carried over through its state (state() / load_state())
        assert math.isclose(a["evaluation/splices/transformer.h.0"].attrs["mse"],
                            b["evaluation/splices/transformer.h.0"].attrs["mse"], rel_tol=1e-12)


def test_a_sweep_table_has_a_column_per_metric(tmp_path):
    sweep = tmp_path / "sweep"
    for num, factor in enumerate((0.0, 1.0)):
        job = sweep / str(num)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- params.factor={factor}\n")
        hookrun.run(lm_cfg(tmp_path, scaled_block(factor), {"ablation": "zero"}, f"{num}.h5",
                           output={"path": str(job / "captures.h5")}))
    table = hookrun.open_sweep(sweep).table()
    for col in ("params.factor", "ce_clean", "ce_intervened", "ce_ablated", "kl_intervened", "kl_div_score"):
        assert col in table.columns, col
    rows = {r["params.factor"]: r for r in table}
    assert rows[1.0]["kl_intervened"] == 0.0 and rows[1.0]["ce_intervened"] == rows[1.0]["ce_clean"]
    assert math.isclose(rows[0.0]["ce_intervened"], rows[0.0]["ce_ablated"], rel_tol=1e-12)  # factor 0 is the zero ablation
    assert rows[0.0]["kl_div_score"] == pytest.approx(0.0, abs=1e-9)


def _refused(tmp_path, match: str, **over) -> None:
    cfg = lm_cfg(tmp_path, over.pop("hooks", scaled_block(0.5)), over.pop("evaluate", {"ablation": "zero"}), **over)
    with pytest.raises(ConfigError, match=match) as info:
        hookrun.run(cfg)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "run.h5").exists()  # before any batch: no file


@pytest.mark.parametrize("over, match", [
    ({"loss": None}, r"evaluate has no loss for ce: add loss=lm"),
    ({"evaluate": {"ablation": "mean"}}, r"evaluate.ablation=mean without a mean to use: set evaluate.mean="),
    ({"early_stop": True}, r"evaluate with early_stop=true: the clean forward needs the whole model"),
    ({"mode": "grad"}, r"evaluate needs mode=eval"),
    ({"evaluate": {"ablation": "ones"}}, r"evaluate.ablation='ones'; choose mean, zero or null"),
    ({"evaluate": {"ablation": "zero", "mean": "x.h5"}}, r"evaluate.mean='x.h5' is read by evaluate.ablation=mean only"),
    ({"evaluate": {"ablation": "mean", "mean": "/nonexistent/x.h5"}}, r"evaluate.mean: no file '/nonexistent/x.h5'"),
    ({"hooks": {"r": {"at": "transformer.h.0", "type": "forward", "actions": ["record"]}}},
     r"evaluate.ablation=zero: no hook modifies anything"),
])
def test_bad_input_is_one_line_before_any_batch(tmp_path, over, match):
    _refused(tmp_path, match, **over)


def test_a_mean_file_without_the_modules_capture_is_refused(tmp_path):
    record = {"r": {"at": "transformer.h.1", "type": "forward", "actions": [{"name": "record", "what": "output", "rows": "token"}]}}
    source = hookrun.run(lm_cfg(tmp_path, record, None, "source.h5")).path
    _refused(tmp_path, r"has no capture of transformer.h.0 output \(it has transformer.h.1 output\)",
             evaluate={"ablation": "mean", "mean": str(source)})


def test_a_mean_file_with_the_module_from_two_hooks_is_refused(tmp_path):
    """(the first hook's rows were taken in silence: a scaled copy beside them changed nothing)"""
    rec = {"name": "record", "what": "output", "rows": "token"}
    record = {"z": {"at": "transformer.h.0", "type": "forward", "actions": [rec]},
              "a": {"at": "transformer.h.0", "type": "forward", "actions": [rec]}}
    source = hookrun.run(lm_cfg(tmp_path, record, None, "source.h5")).path
    _refused(tmp_path, r"holds transformer.h.0 output from 2 hooks \(a, z\): which one's mean is meant cannot be told",
             evaluate={"ablation": "mean", "mean": str(source)})


@pytest.mark.slow
def test_the_cli_refuses_evaluate_without_a_loss_with_exit_2(tmp_path):
    proc = run_cli("model=hf", "data=text", "evaluate.enabled=true", "device=cpu", "progress=false",
                   f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert lines[-1].endswith("evaluate has no loss for ce: add loss=lm (a language model's next-token cross-entropy), "
                              "loss=cross_entropy (a classifier) or loss=custom"), proc.stderr


def saelens_folder(tmp_path: Path, d: int = 32, d_sae: int = 48) -> tuple[Path, dict]:
    """An SAELens folder with random weights (as tests/sae/test_splice.py writes one), and the weights."""
    import json

    from safetensors.torch import save_file

    folder = tmp_path / "sae"
    folder.mkdir()
    g = torch.Generator().manual_seed(1)
    w = {"W_enc": torch.randn(d, d_sae, generator=g) * 0.3, "W_dec": torch.randn(d_sae, d, generator=g) * 0.3,
         "b_enc": torch.randn(d_sae, generator=g) * 0.1 - 0.35, "b_dec": torch.randn(d, generator=g) * 0.1}
    save_file(w, str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps({
        "architecture": "standard", "d_in": d, "d_sae": d_sae, "dtype": "float32", "apply_b_dec_to_input": True,
        "normalize_activations": "none", "metadata": {"hook_name": "transformer.h.0"}}))
    return folder, w


def test_a_spliced_sae_is_evaluated_with_saelens_definitions(tmp_path):
    """The real op splice: the model metrics against raw hooks returning the SAE's reconstruction
    (computed here from the saved tensors), the splice metrics by their definitions over the real
    tokens, per batch and for the run; the run's totals survive an interruption and resume."""
    from toy_models import STOP_AT

    from hookrun.output.process import Interrupted

    pytest.importorskip("safetensors")
    folder, w = saelens_folder(tmp_path)
    encode = lambda x: torch.relu((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"])  # noqa: E731
    hooks = {"sae": {"at": "transformer.h.0", "type": "forward",
                     "actions": [{"name": "modify_output", "op": "splice", "path": str(folder)}]},
             "stop": {"at": "transformer.h.1", "type": "forward",
                      "actions": [{"_target_": "toy_models.signal_when_told", "_partial_": True}]}}
    cfg = lm_cfg(tmp_path, hooks, {"ablation": "zero"}, output={"path": str(tmp_path / "run.h5"), "flush_every": 1})
    STOP_AT[:] = [1]
    with pytest.raises(Interrupted):
        hookrun.run(cfg)
    cfg["resume"] = True
    path = hookrun.run(cfg).path

    model, batches = reference_lm(), lm_batches(tmp_path)
    recon = lambda m, a, o: encode(o) @ w["W_dec"] + w["b_dec"]  # noqa: E731
    per_batch, terms = [], {k: [] for k in ("ce_clean", "ce_intervened", "ce_ablated", "kl_intervened", "kl_ablated")}
    xs, fs, splice_rows, seen = [], [], [], []
    for b in batches:
        ids, mask = b["input_ids"], b["attention_mask"]
        clean, inter, abl = logits_with(model, b), logits_with(model, b, recon), logits_with(model, b, lambda m, a, o: torch.zeros_like(o))
        t = {"ce_clean": token_ce(clean, ids, mask), "ce_intervened": token_ce(inter, ids, mask), "ce_ablated": token_ce(abl, ids, mask),
             "kl_intervened": token_kl(clean, inter, mask), "kl_ablated": token_kl(clean, abl, mask)}
        per_batch.append(with_scores({k: v.double().mean().item() for k, v in t.items()}))
        for k, v in t.items():
            terms[k].append(v.double())
        h = model.transformer.h[0].register_forward_hook(lambda m, a, o: seen.append(o))
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
        h.remove()
        out = seen.pop()
        x = out[mask.bool()].double()
        f = encode(out)[mask.bool()].double()
        xs.append(x), fs.append(f)
        splice_rows.append(splice_metrics(torch.cat(xs[-1:]), torch.cat(fs[-1:]), w, fired=torch.cat(fs) > 0))
    run = with_scores({k: torch.cat(v).mean().item() for k, v in terms.items()})
    check_file(path, per_batch, run)
    total = splice_metrics(torch.cat(xs), torch.cat(fs), w, fired=torch.cat(fs) > 0)
    assert 0 < total["dead_fraction"] < 1 and 0 < total["l0"] < 48
    with h5py.File(path) as f:
        g = f["evaluation/splices/transformer.h.0"]
        for name in ("l0", "mse", "explained_variance", "dead_fraction"):
            np.testing.assert_allclose(g[name][:], [r[name] for r in splice_rows], rtol=1e-5, err_msg=name)
            np.testing.assert_allclose(g.attrs[name], total[name], rtol=1e-5, err_msg=name)
    row = hookrun.open_run(path).evaluation()[0]
    assert row["module"] == "transformer.h.0" and math.isclose(row["explained_variance"], total["explained_variance"], rel_tol=1e-5)


def splice_metrics(x: torch.Tensor, f: torch.Tensor, w: dict, fired: torch.Tensor) -> dict:
    """SAELens' definitions over rows x (real tokens) and their latents f."""
    err = x - (f @ w["W_dec"].double() + w["b_dec"].double())
    n, d = x.shape
    var = (x.pow(2).sum() / n - (x.sum(0) / n).pow(2).sum()).item()
    return {"l0": (f > 0).sum().item() / n, "mse": err.pow(2).sum().item() / (n * d),
            "explained_variance": 1 - (err.pow(2).sum().item() / n) / var,
            "dead_fraction": (~fired.any(0)).double().mean().item()}


def test_mean_ablation_refuses_a_source_run_that_did_not_complete(tmp_path):
    """evaluate.mean read an interrupted run (killed after 1 of its 3 batches) and ablated with the mean of
    the rows it had, silently. Reference: the mean of all three batches' rows, read with h5py."""
    record = {"resid": {"at": "transformer.h.0", "type": "forward", "actions": [{"name": "record", "what": "output", "rows": "token"}]}}
    source = hookrun.run(lm_cfg(tmp_path, record, None, "source.h5")).path
    with h5py.File(source) as f:
        rows, steps = f["captures/resid/transformer.h.0/output"][:].astype(np.float64), f["samples/step"][:]
        first = int((steps == 0).sum())  # samples of batch 0
        tokens = f["samples/token_sample"][:]
    part = rows[tokens < first].mean(0)
    assert not np.allclose(part, rows.mean(0), atol=1e-3)  # the two means differ: a cut run's is the wrong one
    with h5py.File(source, "a") as f:
        f.attrs.update(status="interrupted", steps_complete=1)
        f["captures/resid/transformer.h.0/output"].resize(int((tokens < first).sum()), axis=0)
    with pytest.raises(ConfigError, match=r"^evaluate.mean: '.*source\.h5' is a run whose status is 'interrupted', not "
                                          r"complete: its mean would be that of the batches it wrote; finish it \(resume=true\) "
                                          r"or point evaluate.mean at a complete run$"):
        hookrun.run(lm_cfg(tmp_path, scaled_block(0.5), {"ablation": "mean", "mean": str(source)}))


def forgets_the_mean(output, target):  # a loss that returns nothing (its last line lost its `return`)
    F.cross_entropy(output, target)


def test_a_loss_that_returns_no_scalar_is_one_line_naming_the_loss(tmp_path):
    """It said 'evaluate: the loss returned NoneType (), expected a scalar tensor', naming no function (the
    reference: this module's function and its name)."""
    cfg = {"evaluate": {"ablation": "zero"}, "device": "cpu", "progress": False, "data": {"batch_size": 4},
           "hooks": {"damp": {"at": "body", "type": "forward", "actions": [{"name": "modify_output", "op": "scale",
                                                                            "factor": 0.3}]}},
           "loss": {"_target_": f"{__name__}.{forgets_the_mean.__name__}", "_partial_": True},
           "output": {"path": str(tmp_path / "c.h5")}}
    with pytest.raises(hookrun.errors.RunError) as info:
        hookrun.run(cfg, model=Classifier().eval(), dataset=Points())
    assert str(info.value) == ("evaluate: loss: forgets_the_mean(output, target) returned NoneType; evaluate's ce needs a "
                               "scalar tensor (the batch's mean loss, e.g. a .mean() over the batch)")
