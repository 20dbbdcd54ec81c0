"""`sae.evaluate`: after training, the trained SAE spliced into the model on held-out items. References:
the evaluate kind run separately on the saved SAE folder (experiment=sae_eval, same items), and the
same figures computed here with transformers' GPT-2, a raw forward hook and SAELens' own SAE
(the spliced model's next-token CE against the clean and the zero-ablated CE)."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import h5py
import pytest
import torch
from conftest import ROOT

import hookrun
from hookrun.errors import ConfigError

transformers = pytest.importorskip("transformers")
sae_lens = pytest.importorskip("sae_lens")

CACHE = ("data.dataset.limit=16", "data.dataset.max_length=16", "data.batch_size=8", "progress=false")
HELD_OUT = "{data: {dataset: {start: 4096, max_length: 16}, batch_size: 8}, limit: 16}"
TRAIN = ("sae.shuffle=false", "sae.rows=256", "sae.batch_rows=32", "sae.d_sae=256", "sae.k=16", "sae.checkpoints=0",
         "sae.lr_schedule.warmup=2", "progress=false")  # (8 steps: a warmup within them)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A cache of 16 texts, an SAE trained on it with sae.evaluate on 16 held-out texts."""
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("sae_evaluate")
    cache = hookrun.run(hookrun.compose("experiment=sae_cache", *CACHE, f"hydra.run.dir={tmp / 'cache'}")).path
    cfg = hookrun.compose("experiment=sae_train", f"sae.from={cache}", f"sae.out={tmp / 'sae'}",
                          f"sae.evaluate={HELD_OUT}", *TRAIN, f"hydra.run.dir={tmp / 'run'}")
    path = hookrun.run(cfg).path
    return tmp, cache, path


def test_values_equal_the_evaluate_kind_on_the_saved_folder(trained, tmp_path):
    tmp, _, path = trained
    with hookrun.open_run(path) as run:
        got = run.sae_evaluation
    assert got["items"] == 16 and got["module"] == "transformer.h.3"
    cfg = hookrun.compose("experiment=sae_eval", f"params.sae={tmp / 'sae'}", "data.dataset.start=4096",
                          "data.dataset.max_length=16", "data.dataset.limit=16", "data.batch_size=8", "progress=false",
                          f"output.path={tmp_path / 'eval.h5'}")
    table = hookrun.open_run(hookrun.run(cfg).path).evaluation().to_pandas().set_index("module").loc["transformer.h.3"]
    for name in ("ce_clean", "ce_intervened", "ce_ablated", "ce_loss_score", "kl_div_score"):
        assert got["model"][name] == pytest.approx(table[name], rel=1e-9), name
    for name in ("l0", "mse", "explained_variance", "dead_fraction"):
        assert got["splice"][name] == pytest.approx(table[name], rel=1e-9), name


def test_values_equal_a_raw_hook_on_the_spliced_model(trained):
    tmp, _, path = trained
    with hookrun.open_run(path) as run:
        got = run.sae_evaluation
    with h5py.File(got["file"]) as f:  # the held-out items the evaluation read
        ids = torch.from_numpy(f["samples/input_ids"][:])
        mask = torch.from_numpy(f["samples/attention_mask"][:])
    assert ids.shape == (16, 16)
    model = transformers.GPT2LMHeadModel.from_pretrained(ROOT / "hookrun/models/tiny_lm", attn_implementation="eager").eval()
    sae = sae_lens.SAE.load_from_disk(str(tmp / "sae"))
    seen: list[torch.Tensor] = []

    def forward(replace):
        def hook(module, inputs, output):
            h = output[0] if isinstance(output, tuple) else output
            new = replace(h)
            return (new, *output[1:]) if isinstance(output, tuple) else new

        handle = model.transformer.h[3].register_forward_hook(hook)
        try:
            with torch.no_grad():
                return model(input_ids=ids, attention_mask=mask).logits.double().log_softmax(-1)
        finally:
            handle.remove()

    def splice(h):
        seen.append(h)
        return sae.decode(sae.encode(h))

    clean, spliced, zero = forward(lambda h: h), forward(splice), forward(torch.zeros_like)
    pairs = (mask[:, 1:] * mask[:, :-1]).bool()  # next-token pairs of real tokens
    target = ids[:, 1:]

    def ce(lp):
        return float(-lp[:, :-1].gather(-1, target[..., None])[..., 0][pairs].mean())

    def kl(lp):
        return float((clean.exp() * (clean - lp)).sum(-1)[mask.bool()].mean())

    want_ce = (ce(zero) - ce(spliced)) / (ce(zero) - ce(clean))
    assert got["model"]["ce_clean"] == pytest.approx(ce(clean), rel=1e-5)
    assert got["model"]["ce_loss_score"] == pytest.approx(want_ce, rel=1e-4)
    assert got["model"]["kl_div_score"] == pytest.approx((kl(zero) - kl(spliced)) / kl(zero), rel=1e-4)
    x = seen[0][mask.bool()].double()
    with torch.no_grad():
        latents = sae.encode(seen[0][mask.bool()])
        x_hat = sae.decode(latents).double()
    var = x.pow(2).sum(1).mean() - x.mean(0).pow(2).sum()
    assert got["splice"]["l0"] == pytest.approx(float((latents > 0).sum(1).double().mean()), rel=1e-6)
    assert got["splice"]["explained_variance"] == pytest.approx(
        float(1 - (x - x_hat).pow(2).sum(1).mean() / var), rel=1e-4)


def test_inspect_and_report_show_the_evaluation(trained):
    _, _, path = trained
    with hookrun.open_run(path) as run:
        got = run.sae_evaluation
        text = "\n".join(run.kind_lines())
        columns = {k: v for r in run.kind_readers() for k, v in r.columns(run.file).items()}
    assert f"ce_loss_score {got['model']['ce_loss_score']:.6g}" in text
    assert columns["ce_loss_score"] == got["model"]["ce_loss_score"]
    with h5py.File(path) as f:
        assert json.loads(f.attrs["sae_evaluation"]) == got


def test_a_cache_of_another_model_is_one_line_before_any_step(trained, tmp_path):
    _, cache, _ = trained
    cfg = hookrun.compose("experiment=sae_train", "model.attn_implementation=sdpa", f"sae.from={cache}",
                          f"sae.out={tmp_path / 'sae'}", f"sae.evaluate={HELD_OUT}", *TRAIN,
                          f"hydra.run.dir={tmp_path / 'run'}")
    with pytest.raises(ConfigError, match=r"sae.evaluate: the cache .* was written by the model hookrun.models.tiny_lm"):
        hookrun.run(cfg)
    assert not (tmp_path / "sae").exists() and not (tmp_path / "run" / "captures.h5").exists()


@pytest.mark.parametrize(("value", "match"), [
    ("{limit: 0}", "sae.evaluate.limit: 0"),
    ("{size: 3}", "sae.evaluate.size: not a key"),
    # (found after the training, named as the run's data.batch_size / data.dataset.files)
    ("{data: {batch_size: 0}, limit: 8}", r"^sae.evaluate: sae.evaluate.data.batch_size must be at least 1, got 0$"),
    ("{data: {dataset: {start: 99999999}}, limit: 8}", r"^sae.evaluate: sae.evaluate.data.dataset.start=99999999: past the end: sae.evaluate.data.dataset.files: .* holds? \d+ text"),
])
def test_bad_evaluate_values_are_one_line(trained, tmp_path, value, match):
    _, cache, _ = trained
    cfg = hookrun.compose("experiment=sae_train", f"sae.from={cache}", f"sae.out={tmp_path / 'sae'}",
                          f"sae.evaluate={value}", *TRAIN, f"hydra.run.dir={tmp_path / 'run'}")
    with pytest.raises(ConfigError, match=match):
        hookrun.run(cfg)
    assert not (tmp_path / "sae").exists()  # before any step


def test_evaluate_of_a_channel_sae_is_one_line_before_any_step(tmp_path):
    cfg = hookrun.compose("experiment=sae_shapes", "sae.evaluate={data: {dataset: {seed: 3}}}", "progress=false",
                          f"hydra.run.dir={tmp_path}")
    with pytest.raises(ConfigError, match=r"sae.evaluate: the evaluation measures an SAE on token rows, .* \(rows: channel\); drop sae.evaluate"):
        hookrun.run(cfg)
    assert not any(tmp_path.iterdir())


def test_a_limit_for_a_data_set_without_one_is_one_line():
    from hookrun.runner.kinds.sae.evaluation import eval_data

    with pytest.raises(ConfigError, match="hookrun.data.shapes has no `limit` of items"):
        eval_data({"dataset": {"_target_": "hookrun.data.shapes", "size": 8}}, {"data": {}, "limit": 4})
    got = eval_data({"dataset": {"_target_": "hookrun.data.text", "limit": None, "start": 0}, "batch_size": 4},
                    {"data": {"dataset": {"start": 4096}}, "limit": 16})
    assert got == {"dataset": {"_target_": "hookrun.data.text", "limit": 16, "start": 4096}, "batch_size": 4}


def test_report_section_and_sweep_show_ce_loss_score(trained):
    from types import SimpleNamespace

    from hookrun.analysis.kind_readers import Table
    from hookrun.runner.kinds.sae import reader

    _, _, path = trained
    with hookrun.open_run(path) as run:
        got = run.sae_evaluation
        (section,) = reader.sections(run)
    tables = [i for i in section["items"] if i["type"] == "table" and "ce_loss_score" in i["columns"]]
    assert tables and tables[0]["rows"][0][tables[0]["columns"].index("ce_loss_score")] == pytest.approx(
        got["model"]["ce_loss_score"], rel=1e-5)
    rows = [{"job": 0, "k": 8, "l0": 8.0, "explained_variance": 0.5, "ce_loss_score": 0.7},
            {"job": 1, "k": 16, "l0": 16.0, "explained_variance": 0.8, "ce_loss_score": 0.9}]
    sweep = SimpleNamespace(swept=["k"], table=lambda captures: Table(list(rows[0]), rows))
    (section,) = reader.sweep_sections(sweep)
    table = next(i for i in section["items"] if i["type"] == "table")
    assert "ce_loss_score" in table["columns"]
    scored = [i["figure"] for i in section["items"] if i["type"] == "figure" and "ce_loss_score" in json.dumps(i["figure"])]
    assert len(scored) == 1
    trace = scored[0]["data"][0]
    assert list(trace["x"]) == [8.0, 16.0] and list(trace["y"]) == [0.7, 0.9]


def test_the_evaluation_keeps_each_latents_top_examples_for_the_report(trained):
    """One further command after training: `python -m hookrun.report OUT.evaluation.h5` (docs/sae.md)
    shows each latent's top examples; they are SAELens' latents of the clean layer-3 output here."""
    tmp, _, path = trained
    with hookrun.open_run(path) as run:
        file = run.sae_evaluation["file"]
    with h5py.File(file) as f:
        ids = torch.from_numpy(f["samples/input_ids"][:])
        mask = torch.from_numpy(f["samples/attention_mask"][:])
        index = f["samples/index"][:]
    model = transformers.GPT2LMHeadModel.from_pretrained(ROOT / "hookrun/models/tiny_lm", attn_implementation="eager").eval()
    sae = sae_lens.SAE.load_from_disk(str(tmp / "sae"))
    seen = []
    handle = model.transformer.h[3].register_forward_hook(lambda m, i, o: seen.append(o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        latents = sae.encode(seen[0]) * mask[..., None]  # (sample, position, latent); padding 0
    handle.remove()
    best = latents.flatten(0, 1).max(0).values
    run = hookrun.open_run(file)
    assert run.top_example_modules == {"transformer.h.3.sae.latents": 256}
    for feature in best.argsort(descending=True)[:5].tolist():
        top = run.top_examples("transformer.h.3.sae.latents", feature)
        flat = int(latents[..., feature].argmax())
        assert top[0]["value"] == pytest.approx(float(best[feature]), rel=1e-3)
        assert (top[0]["sample"], top[0]["position"]) == (int(index[flat // ids.shape[1]]), flat % ids.shape[1])
    assert "latents" in " ".join(run.report().sections)


def test_items_without_input_ids_for_the_default_lm_loss_are_one_line(tmp_path):
    """A classifier's SAE (tiny_cnn's fc input rows) with evaluate but no loss: refused before training."""
    over = ("experiment=sae_shapes", "sae.at=fc", "sae.rows=token", "sae.evaluate={data: {dataset: {seed: 3}}}",
            "progress=false", f"hydra.run.dir={tmp_path}")
    with pytest.raises(ConfigError, match=r"held-out items \(hookrun.data.shapes\) have no input_ids"):
        hookrun.run(hookrun.compose(*over))
    assert not any(tmp_path.iterdir())


def test_evaluate_refuses_a_random_init_model_built_under_another_seed(tmp_path):
    """The same `model:` block (random init) under seed=1 is another network than the seed-0 one that
    wrote the cache: evaluate spliced the SAE into it and wrote ce_loss_score 6.41 (0.62 explained variance
    fell to 0.04), silently. Reference: the two models' weights, compared directly."""
    torch.set_num_threads(1)
    hf = ("model=hf", "hooks.res.at=[transformer.h.1]")
    cache = hookrun.run(hookrun.compose("experiment=sae_cache", *hf, *CACHE, f"hydra.run.dir={tmp_path / 'cache'}")).path
    train = ("experiment=sae_train", "model=hf", f"sae.from={cache}", "sae.capture=res/transformer.h.1/output",
             f"sae.evaluate={HELD_OUT}", *TRAIN)
    with pytest.raises(ConfigError, match=r"sae.evaluate: this run's model does not have the weights of the model that "
                                          r"wrote the cache .* \(the cache's run had seed=0, this one seed=1: .*\); give seed=0"):
        hookrun.run(hookrun.compose(*train, "seed=1", f"sae.out={tmp_path / 'sae1'}", f"hydra.run.dir={tmp_path / 'r1'}"))
    assert not (tmp_path / "sae1").exists()
    torch.manual_seed(0)
    a = hookrun.models.hf("GPT2LMHeadModel", {"n_layer": 2, "n_head": 4, "n_embd": 64, "n_positions": 128, "vocab_size": 259})
    torch.manual_seed(1)
    b = hookrun.models.hf("GPT2LMHeadModel", {"n_layer": 2, "n_head": 4, "n_embd": 64, "n_positions": 128, "vocab_size": 259})
    assert not torch.equal(a.transformer.h[0].attn.c_attn.weight, b.transformer.h[0].attn.c_attn.weight)
    result = hookrun.run(hookrun.compose(*train, "seed=0", f"sae.out={tmp_path / 'sae0'}", f"hydra.run.dir={tmp_path / 'r0'}"))
    with hookrun.open_run(result.path) as run:
        assert run.sae_evaluation["items"] == 16
