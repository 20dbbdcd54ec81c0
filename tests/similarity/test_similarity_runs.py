"""Similarity runs (issue 48, item 2): the matrix in the file equals numpy on the features recorded by
raw PyTorch forward hooks on the same models and items (the definitions written in
test_similarity_engine.py), by both exact routes, the minibatch estimator, rbf CKA, RSA and a second
model; token rows are averaged over their real tokens; bad input is one line before any batch."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch
from conftest import ROOT
from test_similarity_engine import cka, dissim, gram_rbf, spearman, unbiased
from warm_python import python as warm

import hookrun
from hookrun.analysis.kind_readers import kind_figures, kind_lines, kind_sections
from hookrun.errors import ConfigError, HookrunError

MODEL = {"_target_": "hookrun.models.tiny_cnn"}
SECOND = {"_target_": "similarity_models.seeded_cnn", "seed": 1}


def cfg(path, n: int = 24, batch: int = 5, model=MODEL, data=None, **block) -> dict:
    data = data or {"dataset": {"_target_": "hookrun.data.shapes", "size": n}, "batch_size": batch}
    return {"model": model, "data": data, "device": "cpu", "progress": False, "output": {"path": str(path)},
            "similarity": block}


def recorded(model: torch.nn.Module, names: list[str], x: torch.Tensor, pool: str) -> list[np.ndarray]:
    """Every module's output for all items at once, by raw forward hooks (a copy, as the hook sees it),
    pooled in numpy."""
    feats = [t.double().numpy() for t in _raw(model, names, x)]
    return [f.reshape(len(f), -1) if pool == "flatten" else f.reshape(*f.shape[:2], -1).mean(-1) if f.ndim > 2 else f
            for f in feats]


def images(n: int) -> torch.Tensor:
    from hookrun.data.shapes import shapes

    data = shapes(n)
    return torch.stack([data[i][0] for i in range(n)])


def file_matrix(path) -> tuple[np.ndarray, dict]:
    import json

    with h5py.File(path) as f:
        meta = json.loads(f.attrs["similarity"])
        return f[f"captures/similarity/__model__/{meta['measure']}"][()], meta


def grams(feats: list[np.ndarray]) -> list[np.ndarray]:
    return [f @ f.T for f in feats]


@pytest.fixture(scope="module")
def cnn():
    from hookrun.models.tiny_cnn import tiny_cnn

    return tiny_cnn()


@pytest.mark.parametrize(("at", "pool", "n", "route"), [
    (["block1", "block2", "block3", "fc"], "flatten", 24, "gram"),  # 16384 + ... features, 24 items
    (["block3", "fc"], "mean", 40, "feature"),  # 36 features, 40 items
])
def test_exact_linear_cka_equals_numpy(tmp_path, cnn, at, pool, n, route) -> None:
    path = hookrun.run(cfg(tmp_path / "s.h5", n=n, at=at, pool=pool)).path
    got, meta = file_matrix(path)
    assert meta["route"] == route and meta["rows"] == at == meta["cols"]
    k = grams(recorded(cnn, at, images(n), pool))
    want = np.array([[cka(a, b) for b in k] for a in k])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert want.min() < 0.999  # the layers differ: the comparison can fail


@pytest.mark.parametrize(("pool", "estimator", "route"), [("flatten", "exact", "gram"), ("mean", "exact", "feature"),
                                                      ("flatten", "minibatch", "minibatch")])
def test_an_output_the_forward_changes_in_place_after_its_hook_is_taken_as_the_hook_saw_it(tmp_path, pool, estimator,
                                                                                        route) -> None:
    """A conv followed by ReLU(inplace=True) (torchvision's stems and VGG): the rows are the conv's output,
    not what the ReLU makes of it once the hook has returned (linear CKA 0.657 where it is 0.615 was
    written for conv and conv before). Reference: raw hooks that copy the output, numpy's CKA."""
    import similarity_models

    model = {"_target_": "similarity_models.rectified_cnn"}
    path = hookrun.run(cfg(tmp_path / "r.h5", n=24, batch=8, model=model, at=["0", "2"], pool=pool,
                           estimator=estimator)).path
    got, meta = file_matrix(path)
    a, b = recorded(similarity_models.rectified_cnn(), ["0", "2"], images(24), pool)
    assert meta["route"] == route and (a < 0).any()  # (the conv's output has negatives; the ReLU's has none)
    if estimator == "exact":
        assert got[0, 1] == pytest.approx(cka(a @ a.T, b @ b.T), rel=1e-6)
    else:
        def mean_hsic(x, y):
            return np.mean([unbiased(x[s:s + 8] @ x[s:s + 8].T, y[s:s + 8] @ y[s:s + 8].T) for s in range(0, 24, 8)])

        assert got[0, 1] == pytest.approx(mean_hsic(a, b) / np.sqrt(mean_hsic(a, a) * mean_hsic(b, b)), rel=1e-6)


def test_data_limit_sizes_the_route_by_the_rows_run(tmp_path, cnn) -> None:
    """4,000 items would need 256 MB of Gram matrices; data.limit=2 runs 10 of them, which fit in 20 MB:
    the run takes the gram route and equals numpy on those 10 items (it was refused for the 4,000)."""
    at = ["block1", "fc"]
    data = {"dataset": {"_target_": "hookrun.data.shapes", "size": 4000}, "batch_size": 5, "limit": 2}
    path = hookrun.run(cfg(tmp_path / "s.h5", data=data, at=at, memory="20MB")).path
    got, meta = file_matrix(path)
    assert meta["route"] == "gram"
    k = grams(recorded(cnn, at, images(10), "flatten"))  # (each image drawn from its index alone)
    want = np.array([[cka(a, b) for b in k] for a in k])
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_second_model_gives_the_rectangle(tmp_path, cnn) -> None:
    import similarity_models

    at, other = ["block2", "fc"], ["block1", "block2", "block3"]
    path = hookrun.run(cfg(tmp_path / "w.h5", at=at, pool="mean", **{"with": {"model": SECOND, "at": other}})).path
    got, meta = file_matrix(path)
    assert (meta["rows"], meta["cols"], meta["with"]) == (at, other, SECOND["_target_"])
    x = images(24)
    k, l_ = grams(recorded(cnn, at, x, "mean")), grams(recorded(similarity_models.seeded_cnn(1), other, x, "mean"))
    np.testing.assert_allclose(got, [[cka(a, b) for b in l_] for a in k], rtol=1e-6)
    with h5py.File(path, "r") as f:  # inspect says which model is which, as the picture's axes do
        lines = kind_lines(f)
    assert lines[1:3] == ["  rows: at (tiny_cnn); columns: with.at (seeded_cnn)",
                          "          block1  block2  block3"], lines
    assert lines[3].split()[1:] == [format(v, ".4f") for v in got[0]] and lines[3].split()[0] == "block2"


def test_a_live_second_model_in_the_notebook_function(cnn) -> None:
    """hookrun.similarity(model, data, with_={"model": MODULE, ...}): the live module runs as it is
    (numpy on its raw hooks' features agrees) and comes back as it went in: train mode, no hook left.
    A config cannot name a live model: one line."""
    import similarity_models

    from hookrun.data.shapes import shapes

    other = similarity_models.seeded_cnn(2).train()
    at, cols = ["block2", "fc"], ["block1", "block3"]
    got = hookrun.similarity(cnn, shapes(24), at=at, pool="mean", batch_size=5, with_={"model": other, "at": cols})
    assert other.training and not any(m._forward_hooks for m in other.modules())
    x = images(24)
    k, l_ = grams(recorded(cnn, at, x, "mean")), grams(recorded(other.eval(), cols, x, "mean"))
    np.testing.assert_allclose(got.values, [[cka(a, b) for b in l_] for a in k], rtol=1e-6)
    assert list(got.coords["with_at"].values) == cols
    with pytest.raises(ConfigError, match=r"similarity.with.model=\{'live': 'x.Y'\} names a live model"):
        hookrun.similarity(cnn, shapes(24), at=at, with_={"model": {"live": "x.Y"}, "at": cols})


def test_minibatch_equals_the_unbiased_estimator_on_the_same_batches(tmp_path, cnn) -> None:
    at = ["block1", "block3", "fc"]
    path = hookrun.run(cfg(tmp_path / "m.h5", n=24, batch=5, at=at, estimator="minibatch")).path
    got, meta = file_matrix(path)
    assert meta["route"] == "minibatch"
    feats = recorded(cnn, at, images(24), "flatten")
    batches = [slice(s, s + 5) for s in range(0, 20, 5)]  # 24 items: the last batch of 4 is left out

    def mean_hsic(a, b):
        return np.mean([unbiased(a[s] @ a[s].T, b[s] @ b[s].T) for s in batches])

    want = [[mean_hsic(a, b) / np.sqrt(mean_hsic(a, a) * mean_hsic(b, b)) for b in feats] for a in feats]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_the_items_the_minibatch_estimator_leaves_out_are_said(tmp_path, cnn, caplog) -> None:
    """24 items in batches of 10: the matrix is over the 20 of the two full batches (numpy's mean unbiased
    HSIC of those, on raw hooks' features), and nothing said so: the log said 24 samples, the report 'over
    every item of the run'. Now a warning, the file's attribute, inspect and the report's note name the 4 left
    out; with batches that divide the items, nothing is said."""
    from hookrun.runner.kinds.similarity.reader import lines, sections

    at = ["block3", "fc"]
    path = hookrun.run(cfg(tmp_path / "m.h5", n=24, batch=10, at=at, pool="mean", estimator="minibatch")).path
    got, meta = file_matrix(path)
    a, b = recorded(cnn, at, images(24), "mean")

    def mean_hsic(x, y):
        return np.mean([unbiased(x[s:s + 10] @ x[s:s + 10].T, y[s:s + 10] @ y[s:s + 10].T) for s in (0, 10)])

    np.testing.assert_allclose(got[0, 1], mean_hsic(a, b) / np.sqrt(mean_hsic(a, a) * mean_hsic(b, b)), rtol=1e-6)
    assert meta["left_out"] == 4
    assert [r.message for r in caplog.records if r.levelname == "WARNING"] == [
        "similarity: the minibatch estimator takes full batches of 10 items: the last batch's 4 are left out of the "
        "matrix (a data.batch_size that divides the items takes them all)"]
    with hookrun.open_run(path) as run:
        assert "  over the run's full batches, averaged (the last batch's 4 item(s) left out)" in lines(run.file)
        assert "over the run's full batches, averaged (the last batch's 4 item(s) left out)" in sections(run)[0]["note"]
    caplog.clear()
    whole = hookrun.run(cfg(tmp_path / "w.h5", n=20, batch=10, at=at, pool="mean", estimator="minibatch")).path
    assert "left_out" not in file_matrix(whole)[1] and not [r for r in caplog.records if r.levelname == "WARNING"]


@pytest.mark.parametrize(("at", "pool", "n", "route", "bias"), [
    (["block1", "block3", "fc"], "flatten", 24, "gram", 0.05),  # 16384 features and fewer, 24 items
    (["block3", "fc"], "mean", 60, "feature", 5e-4),  # 36 features, 60 items: from the sums; less bias
])
def test_unbiased_equals_songs_hsic_over_every_item_and_is_drawn_on_a_signed_scale(tmp_path, cnn, at, pool, n,
                                                                                    route, bias) -> None:
    """estimator: unbiased by both exact routes: CKA from Song et al.'s unbiased HSIC of the whole data
    (the biased CKA of these layers is far higher), on the -1 to 1 scale it can take."""
    from hookrun.runner.kinds.similarity.reader import spec

    path = hookrun.run(cfg(tmp_path / "u.h5", n=n, batch=5, at=at, pool=pool, estimator="unbiased")).path
    got, meta = file_matrix(path)
    assert meta["route"] == route and meta["estimator"] == "unbiased"
    k = [a @ a.T for a in recorded(cnn, at, images(n), pool)]
    want = [[unbiased(a, b) / np.sqrt(unbiased(a, a) * unbiased(b, b)) for b in k] for a in k]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert (np.array([[cka(a, b) for b in k] for a in k]) - got).max() > bias  # the bias it removes
    with h5py.File(path) as f:
        drawn = spec(f)
    assert drawn.range == (-1.0, 1.0) and drawn.centre == 0.0 and drawn.title.startswith("linear CKA (unbiased HSIC)")


@pytest.mark.parametrize(("measure", "key", "value", "reads"), [
    ("linear_cka", "sigma", 0.2, "rbf_cka"), ("rsa", "sigma", 0.8, "rbf_cka"),
    ("linear_cka", "dissimilarity", "euclidean", "rsa"), ("rbf_cka", "dissimilarity", "correlation", "rsa")])
def test_a_key_the_measure_does_not_read_is_one_line_and_left_out_its_default(tmp_path, cnn, measure, key, value,
                                                                             reads) -> None:
    """sigma beside linear_cka or rsa, dissimilarity beside a CKA, were ignored with no word (sigma=0.2 with
    linear_cka wrote the same matrix as sigma=0.8: the width read as part of the run); now one line naming the
    measure that reads it, also where the value is the default, and no file. Left out, the measure's default is
    used: numpy's gram_rbf with 0.8, and Spearman of 1 - Pearson correlation (scipy) on raw hooks' features."""
    with pytest.raises(ConfigError) as err:
        hookrun.run(cfg(tmp_path / "k.h5", n=12, at=["block3", "fc"], measure=measure, pool="mean", **{key: value}))
    what = "the rbf kernel's width" if key == "sigma" else "RSA's dissimilarity between items"
    assert str(err.value) == (f"similarity.{key}={value!r}: {what}, read by measure={reads} only, not by "
                              f"measure={measure}; remove {key}, or set measure: {reads} (a -m sweep over "
                              f"similarity.measure gives it to its {reads} jobs)")
    assert not (tmp_path / "k.h5").exists()
    got, meta = file_matrix(hookrun.run(cfg(tmp_path / "d.h5", n=12, at=["block3", "fc"], measure=measure, pool="mean")).path)
    a, b = recorded(cnn, ["block3", "fc"], images(12), "mean")
    iu = np.triu_indices(12, k=1)
    want = {"linear_cka": lambda x, y: cka(x @ x.T, y @ y.T), "rbf_cka": lambda x, y: cka(gram_rbf(x, 0.8), gram_rbf(y, 0.8)),
            "rsa": lambda x, y: spearman(dissim(x, "correlation")[iu], dissim(y, "correlation")[iu])}[measure]
    np.testing.assert_allclose(got[0, 1], want(a, b), rtol=1e-6)
    assert (meta["sigma"], meta["dissimilarity"]) == (0.8, "correlation")


@pytest.mark.parametrize("measure", ["rbf_cka", "rsa"])
def test_rbf_cka_and_rsa_equal_their_definitions(tmp_path, cnn, measure) -> None:
    at = ["block2", "block3", "fc"]
    width = {"sigma": 0.5} if measure == "rbf_cka" else {}
    path = hookrun.run(cfg(tmp_path / "r.h5", n=20, at=at, measure=measure, pool="mean", **width)).path
    got, _ = file_matrix(path)
    feats = recorded(cnn, at, images(20), "mean")
    if measure == "rbf_cka":
        want = [[cka(gram_rbf(a, 0.5), gram_rbf(b, 0.5)) for b in feats] for a in feats]
    else:
        iu = np.triu_indices(20, k=1)
        want = [[spearman(dissim(a, "correlation")[iu], dissim(b, "correlation")[iu]) for b in feats] for a in feats]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_token_rows_average_the_real_tokens_only(tmp_path) -> None:
    from toy_lm import Prompts, tiny_gpt2

    data = {"dataset": {"_target_": "toy_lm.Prompts", "n": 9}, "batch_size": 4}
    at = ["transformer.h.0", "transformer.ln_f"]  # hidden_states[1] and [2] (the last is after ln_f)
    path = hookrun.run(cfg(tmp_path / "t.h5", model={"_target_": "toy_lm.tiny_gpt2"}, data=data, at=at,
                           pool="mean")).path
    got, _ = file_matrix(path)
    items = Prompts(n=9).items
    ids, mask = torch.stack([i["input_ids"] for i in items]), torch.stack([i["attention_mask"] for i in items])
    with torch.no_grad():
        hidden = tiny_gpt2().forward(input_ids=ids, attention_mask=mask, output_hidden_states=True,  # (positions as
                                     position_ids=(mask.cumsum(1) - 1).clamp(min=0)).hidden_states   # generate() counts them)
    m = mask.double().unsqueeze(-1).numpy()
    feats = [(h.double().numpy() * m).sum(1) / m.sum(1) for h in hidden[1:3]]
    k = grams(feats)
    np.testing.assert_allclose(got, [[cka(a, b) for b in k] for a in k], rtol=1e-6)
    with pytest.raises(ConfigError, match="pool=flatten over token rows with padding"):
        hookrun.run(cfg(tmp_path / "f.h5", model={"_target_": "toy_lm.tiny_gpt2"}, data=data, at=at))


@pytest.mark.parametrize(("block", "named"), [({"measure": "rbf_cka", "sigma": 0.3}, "RBF CKA (sigma 0.3) · tiny_cnn"),
                                              ({"measure": "rsa", "dissimilarity": "euclidean"},
                                               "RSA (Spearman, Euclidean distance) · tiny_cnn"),
                                              ({"measure": "rsa"}, "RSA (Spearman, 1 - Pearson r) · tiny_cnn")])
def test_the_picture_and_inspect_name_the_width_and_the_dissimilarity(tmp_path, cnn, block, named) -> None:
    """Runs of rbf CKA at sigma 0.3 and 0.8, or of RSA by Euclidean and by correlation distances, were drawn and
    printed under one title ('RBF CKA · tiny_cnn'), their matrices told apart by nothing shown. The title names
    them; the matrix is the one numpy gives with the width or distance the title names (raw hooks' features)."""
    from hookrun.runner.kinds.similarity.reader import lines, spec

    path = hookrun.run(cfg(tmp_path / "t.h5", n=12, at=["block3", "fc"], pool="mean", **block)).path
    got, _ = file_matrix(path)
    a, b = recorded(cnn, ["block3", "fc"], images(12), "mean")
    iu = np.triu_indices(12, k=1)
    kind = block.get("dissimilarity", "correlation")
    want = cka(gram_rbf(a, 0.3), gram_rbf(b, 0.3)) if block["measure"] == "rbf_cka" else \
        spearman(dissim(a, kind)[iu], dissim(b, kind)[iu])
    np.testing.assert_allclose(got[0, 1], want, rtol=1e-6)
    with h5py.File(path) as f:
        assert spec(f).title == named and lines(f)[0].startswith(f"similarity: {named}; estimator exact")


def test_a_model_of_hookruns_generic_builder_is_named_by_what_it_built(tmp_path) -> None:
    """`_target_: hookrun.models.hf` builds any transformers class: the file, and so the picture's title,
    names the class (it named `hf`)."""
    from toy_lm import VOCAB

    model = {"_target_": "hookrun.models.hf", "model_class": "GPT2LMHeadModel",
             "config": {"n_layer": 2, "n_embd": 16, "n_head": 2, "vocab_size": VOCAB, "n_positions": 16}}
    data = {"dataset": {"_target_": "toy_lm.Prompts", "n": 8}, "batch_size": 4}
    path = hookrun.run(cfg(tmp_path / "hf.h5", model=model, data=data, at=["transformer.h.*"], pool="mean")).path
    assert file_matrix(path)[1]["model"] == "GPT2LMHeadModel"
    from hookrun.runner.kinds.similarity.reader import spec

    with h5py.File(path) as f:
        drawn = spec(f)
    assert drawn.title == "linear CKA · GPT2LMHeadModel" and drawn.ylabel == "at (GPT2LMHeadModel)"


def test_readers_show_the_labelled_matrix(tmp_path) -> None:
    at = ["block1", "block2", "fc"]
    path = hookrun.run(cfg(tmp_path / "v.h5", at=at, pool="mean")).path
    got, _ = file_matrix(path)
    run = hookrun.open_run(path)
    da = run.similarity()
    assert da.dims == ("at", "with_at") and list(da.coords["at"].values) == at
    np.testing.assert_array_equal(da.values, got)
    [(stem, spec)] = kind_figures(run)
    assert stem == "similarity" and spec.range == (0.0, 1.0) and list(spec.x) == at and list(spec.y) == at
    np.testing.assert_array_equal(spec.z, got)
    assert "linear CKA" in spec.title and spec.cells[0][2] == f"{got[0, 2]:.2f}"
    assert [s["id"] for s in kind_sections(run)] == ["similarity"]
    text = "\n".join(kind_lines(run.file))
    assert f"{got[1, 2]:.4f}" in text and "block2" in text


SCORED = {"_target_": "similarity_models.Scored"}
ROWS = {"dataset": {"_target_": "toy_models.SignedRows"}, "batch_size": 4}


@pytest.mark.parametrize(("overrides", "message"), [
    ({"at": ["block1"], "measure": "linear_ckaa"}, "similarity.measure='linear_ckaa': not a measure; did you mean linear_cka?"),
    ({"at": ["block1"], "measure": "cka"}, "similarity.measure='cka': not a measure; did you mean linear_cka?"),
    ({"at": ["block1"], "measure": "rbf_cka", "estimator": "minibatch"}, "estimator=minibatch with measure=rbf_cka: undefined"),
    ({"at": ["block1"], "pool": "max"}, "similarity.pool='max'"),
    ({"at": ["block1"], "measure": "rbf_cka", "sigma": float("inf")}, "similarity.sigma=inf: the rbf width is a "
     "fraction of the median distance between rows, from 0.001 to 1000"),  # (was every cell 0, the diagonal too)
    ({"at": ["block1"], "measure": "rbf_cka", "sigma": 1e200}, "similarity.sigma=1e+200: "),  # (was OverflowError)
    ({"at": ["block1"], "measure": "rbf_cka", "sigma": float("nan")}, "similarity.sigma=nan: "),
    ({"at": ["block1"], "measure": "rbf_cka", "sigma": 1e-200}, "similarity.sigma=1e-200: "),
    ({"at": ["block1"], "measure": "rsa", "estimator": "unbiased"}, "estimator=unbiased with measure=rsa: undefined"),
    ({"at": ["block1"], "estimator": "unbiased", "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 3},
                                                         "batch_size": 3}}, "need at least 4 (the unbiased HSIC"),
    ({"at": ["block1"], "estimator": "minibatch", "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 8},
                                                          "batch_size": 3}}, "at least 4 rows"),
    ({"at": ["block1"], "memory": "1MB"}, "estimator: minibatch"),
    ({"at": ["block1"], "memory": "1KB"}, "similarity.memory=1000 bytes: "),  # (was 0.0MB)
    ({"at": ["block1"], "estimator": "exactt"}, "similarity.estimator='exactt': not an estimator; did you mean exact?"),
    ({"at": ["block1"], "with": {"model": {"_target_": "nope.m"}, "at": ["block1"]}},
     "similarity.with.model: cannot import 'nope.m'"),  # (was "model: ...": the run's own model blamed)
    ({"at": ["block1"], "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 2}, "batch_size": 2}},
     "similarity over 2 item(s): CKA and RSA compare how the items lie relative to each other and need at least 3"),
    ({"at": ["block1"], "data": {"dataset": {"_target_": "hookrun.data.shapes", "size": 8}, "batch_size": 2,
                                 "limit": 1}}, "similarity over 2 item(s)"),  # data.limit counts batches
    ({"at": ["blok1"]}, "block1"),
    ({"at": ["block1"], "with": {"model": SECOND, "at": ["block1"], "data": {}}}, "similarity.with.data: not a key"),
    ({"at": ["block1"], "colour": 1}, "similarity.colour: not a key"),
    ({"at": ["score"], "model": SCORED, "data": ROWS}, "similarity.at: score gives shape (4,) torch.float32: no feature axis"),
    ({"at": ["lin"], "model": SCORED, "data": ROWS, "with": {"model": SCORED, "at": ["pairs"]}},
     "similarity.with.at: pairs's output (8, 3) has 8 rows on its first axis for a batch of 4 items: not batch first"),
    ({"at": ["lin"], "model": {"_target_": "similarity_models.Looped"}, "data": ROWS},
     "similarity.at: lin ran twice in one forward (a shared module): which call's output to take is not defined"),
])
def test_bad_input_is_one_line_before_any_batch(tmp_path, overrides, message) -> None:
    model, data = overrides.pop("model", MODEL), overrides.pop("data", None)
    with pytest.raises(HookrunError) as err:
        hookrun.run(cfg(tmp_path / "bad.h5", model=model, data=data, **overrides))
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "bad.h5").exists()


@pytest.mark.slow
def test_cka_resnet_experiment_runs(tmp_path) -> None:
    out = tmp_path / "cka"
    warm(["-m", "hookrun", "experiment=cka_resnet", "data.dataset.size=24",
          "data.dataset.image_size=[3,32,32]", "data.batch_size=8", "progress=false",
          f"hydra.run.dir={out}"], cwd=ROOT, check=True, timeout=300)
    got, meta = file_matrix(out / "captures.h5")
    assert got.shape == (4, 4) and meta["with"] == "torchvision.models.resnet34"
    assert np.all((got > 0) & (got <= 1 + 1e-9))


def test_flattened_rows_whose_length_changes_are_refused_in_one_line(tmp_path) -> None:
    from hookrun.errors import RunError

    block = {"model": {"_target_": "similarity_models.token_mlp"},
             "data": {"dataset": {"_target_": "similarity_models.Lengths"}, "batch_size": 4}, "at": ["0", "2"]}
    with pytest.raises(RunError, match="similarity.pool=flatten: 0 gives 28 features per item in this batch and 20"):
        hookrun.run(cfg(tmp_path / "l.h5", **block))
    hookrun.run(cfg(tmp_path / "ok.h5", **block, pool="mean"))  # the mean over steps has one width


@pytest.mark.parametrize(("n", "estimator", "measure", "route"), [
    (16, "exact", "linear_cka", "gram"), (24, "exact", "linear_cka", "feature"), (16, "minibatch", "linear_cka", "minibatch"),
    (16, "exact", "rbf_cka", "gram"), (16, "exact", "rsa", "gram"), (24, "unbiased", "linear_cka", "feature"),
    (16, "unbiased", "linear_cka", "gram")])
def test_a_constant_layer_is_n_a_in_the_file_inspect_and_picture_with_one_warning(tmp_path, caplog, n, estimator,
                                                                                   measure, route) -> None:
    """Layer 1 gives 0 and layer 2 its bias for every item: each measure is 0 / 0 there (numpy's too),
    which rounding of a Gram matrix of equal rows would turn into any number; layer 0 varies."""
    import warnings

    import similarity_models

    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.TensorDataset(x, torch.zeros(n, dtype=torch.long))
    block = {"model": {"_target_": "similarity_models.dead_mlp"}, "data": {"batch_size": 8}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (numpy's 0 / 0 warning is not passed on)
        path = hookrun.run(cfg(tmp_path / "d.h5", **block, at=["0", "1", "2"], estimator=estimator, measure=measure),
                           dataset=data).path
    what = "constant features within every batch" if estimator == "minibatch" else "the same features for every item"
    assert [r.message for r in caplog.records if r.levelname == "WARNING"] == [
        f"similarity: 1, 2 give(s) {what}: {measure} is undefined there, NaN in the file (n/a in the pictures)"]
    got, meta = file_matrix(path)
    feats = recorded(similarity_models.dead_mlp(), ["0", "1", "2"], x, "flatten")
    assert np.ptp(feats[1], axis=0).max() == 0 and np.ptp(feats[2], axis=0).max() == 0 and np.ptp(feats[0], axis=0).min() > 0
    assert meta["route"] == route and np.isnan(got[1:]).all() and np.isnan(got[:, 1:]).all()
    assert got[0, 0] == pytest.approx(1.0)
    run = hookrun.open_run(path)
    assert "  0  1.0000     n/a     n/a" in kind_lines(run.file)
    each = " within every batch" if estimator == "minibatch" else ""
    assert f"  n/a: undefined (1: constant features{each}; 2: constant features{each})" in kind_lines(run.file)  # which, why
    (name, spec), = kind_figures(run)
    assert spec.cells[0] == ["1.00", "n/a", "n/a"] and "n/a: constant features" in spec.title


def test_the_pictures_cells_keep_the_digits_that_tell_values_apart() -> None:
    """Two ResNets' stages on noise images lie between 0.96 and 0.998: at 2 decimals the cells read
    1.00 and 0.99 for values that differ; the cells take 3 decimals there (4 closer still)."""
    from hookrun.runner.kinds.similarity.reader import _cell, _decimals

    near = np.array([[0.9975, 0.9632], [0.9865, np.nan]])
    assert [_cell(v, f".{_decimals(near)}f") for v in near.ravel()] == ["0.998", "0.963", "0.987", "n/a"]
    assert _decimals(np.array([[0.9975, 0.9961], [0.9930, 0.9990]])) == 4
    assert _decimals(np.array([[1.0, 0.16], [0.5, 0.7]])) == 2 and _decimals(np.array([[1.0, np.nan]])) == 2


@pytest.mark.parametrize("kind", ["correlation", "euclidean"])
def test_rsa_by_correlation_with_an_item_whose_features_are_all_equal_is_n_a(tmp_path, caplog, kind) -> None:
    """Item 0 is the zero input of a bias-free layer: its features are all 0, and its Pearson correlation
    with any item is 0 / 0 (numpy's corrcoef gives NaN, so scipy's Spearman does): RSA by correlation is
    undefined for both layers, said in one warning, NaN in the file and n/a in the picture with why;
    by Euclidean distance it is defined, and equal to scipy's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6, bias=False), torch.nn.Tanh()).eval()
    x = torch.randn(12, 4, generator=torch.Generator().manual_seed(1))
    x[0] = 0.0
    config = {"data": {"batch_size": 4}, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "r.h5")},
              "similarity": {"at": ["0", "1"], "measure": "rsa", "dissimilarity": kind}}
    path = hookrun.run(config, model=model, dataset=torch.utils.data.TensorDataset(x, torch.zeros(12))).path
    got, meta = file_matrix(path)
    feats = recorded(model, ["0", "1"], x, "flatten")
    assert (feats[0][0] == 0).all() and (feats[1][0] == 0).all()
    iu = np.triu_indices(12, k=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        want = np.array([[spearman(dissim(a, kind)[iu], dissim(b, kind)[iu]) for b in feats] for a in feats])
    warned = [r.message for r in caplog.records if r.levelname == "WARNING"]
    if kind == "euclidean":
        assert not warned and "undefined" not in meta
        np.testing.assert_allclose(got, want, rtol=1e-6)
        return
    assert np.isnan(want).all() and np.isnan(got).all()
    assert warned == ["similarity: 0, 1: some item's features are all equal there, and its Pearson correlation with any "
                      "item is 0 / 0: rsa with dissimilarity: correlation is undefined, NaN in the file (n/a in the "
                      "pictures); dissimilarity: euclidean is defined for it"]
    assert meta["undefined"] == {"0": "an item's features all equal", "1": "an item's features all equal"}
    (name, spec), = kind_figures(hookrun.open_run(path))
    assert spec.cells == [["n/a", "n/a"], ["n/a", "n/a"]] and spec.title.endswith("(n/a: an item's features all equal)")
    assert kind_lines(hookrun.open_run(path).file)[-1] == ("  n/a: undefined (0: an item's features all equal; 1: an "
                                                            "item's features all equal)")


def test_inspects_matrix_keeps_its_columns_under_negative_values(tmp_path) -> None:
    """(An unbiased HSIC's CKA is negative where two hook points share less than chance: -0.0066 is 7
    characters, one more than the columns were given.)"""
    with h5py.File(tmp_path / "n.h5", "w") as f:
        f.attrs["similarity"] = json.dumps({"measure": "linear_cka", "estimator": "unbiased", "route": "gram",
                                            "pool": "flatten", "rows": ["a", "b"], "cols": ["a", "b"], "model": "m"})
        f["captures/similarity/__model__/linear_cka"] = np.array([[1.0, -0.0066], [-0.0066, 1.0]])
    lines = kind_lines(f := h5py.File(tmp_path / "n.h5", "r"))
    f.close()
    head, *cells = lines[1:]
    ends = {head.index("a") + 1, head.index("b") + 1}
    assert all({row.index(v) + len(v) for v in row.split()[1:]} == ends for row in cells), lines


def test_a_sweeps_report_shows_each_jobs_matrix_on_one_scale(tmp_path) -> None:
    """Two jobs of a sweep over similarity.measure (the folder as Hydra's -m leaves it): the report's
    sweep section holds each job's heatmap, titled by its swept value, its cells the job's file's."""
    import yaml

    from hookrun.analysis.kind_readers import kind_sweep_sections

    for num, measure in enumerate(["linear_cka", "rsa"]):
        job = tmp_path / "sweep" / str(num)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"similarity.measure={measure}"]))
        hookrun.run(cfg(job / "captures.h5", n=12, at=["block1", "block3"], pool="mean", measure=measure))
    (section,) = kind_sweep_sections(hookrun.open_sweep(tmp_path / "sweep"))
    assert section["id"] == "similarity-sweep" and len(section["items"]) == 2
    for num, (item, measure) in enumerate(zip(section["items"], ["linear_cka", "rsa"], strict=True)):
        got, _ = file_matrix(tmp_path / "sweep" / str(num) / "captures.h5")
        trace, layout = item["figure"]["data"][0], item["figure"]["layout"]
        np.testing.assert_allclose(np.array(trace["z"], dtype=float), got, rtol=1e-6)  # (the page keeps 7 digits)
        scale = (-1.0, 1.0) if measure == "rsa" else (0.0, 1.0)  # a rank correlation can be negative: never drawn as 0
        assert (trace["zmin"], trace["zmax"]) == scale and f"similarity.measure={measure}" in str(layout["title"])
    # plot on the sweep folder: each job's matrix as a PNG (matplotlib, the same scales); no chart of one
    # point (each measure's mean is in one job only)
    from matplotlib.image import imread

    from hookrun.analysis.kind_readers import kind_sweep_figures
    from hookrun.cli.plot_command import plot_sweep
    from hookrun.cli.sample_figures import render

    written = plot_sweep(hookrun.open_sweep(tmp_path / "sweep"), tmp_path / "figures")
    assert sorted(p.name for p in written) == ["similarity_job0.png", "similarity_job1.png"]
    assert all(imread(p).shape[2] == 4 for p in written)
    image = render(kind_sweep_figures(hookrun.open_sweep(tmp_path / "sweep"))[1][1]).axes[0].images[0]
    assert (image.norm.vmin, image.norm.vmax) == (-1.0, 1.0)
    assert image.norm(-0.3) < image.norm(0.0) == 0.5 < image.norm(0.3)  # -0.3 has a colour of its own


class Gated(torch.nn.Module):
    """`a` varies; `gate` (a ReLU of x - 1.9) is 0 for 38 of 40 items; `blow` overflows float32 for the
    items whose first input is above 1.5."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.a, self.gate, self.blow = torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Identity()

    def forward(self, x):
        return (self.a(x) + 0 * self.gate(x[:, :3] - 1.9).sum()
                + 0 * self.blow(torch.exp(100.0 * (x[:, :1] > 1.5) * torch.ones_like(x))).sum())


def gated_data() -> torch.utils.data.TensorDataset:
    x = torch.randn(40, 6, generator=torch.Generator().manual_seed(0))
    return torch.utils.data.TensorDataset(x, torch.zeros(40))


def test_non_finite_features_stop_the_run_in_one_line_naming_the_module_and_item(tmp_path) -> None:
    """(Every cell of `blow` was NaN, labelled `constant features`, with no warning.) Reference: the item
    whose row a raw forward hook sees as non-finite."""
    from hookrun.errors import RunError

    data = gated_data()
    feats = recorded(Gated(), ["blow"], data.tensors[0], "flatten")[0]
    bad = np.flatnonzero(~np.isfinite(feats).all(axis=1))
    assert len(bad) == 1
    config = {"data": {"batch_size": 8}, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "b.h5")},
              "similarity": {"at": ["a", "blow"]}}
    with pytest.raises(RunError) as err:
        hookrun.run(config, model=Gated().eval(), dataset=data)
    assert str(err.value) == (f"similarity.at: blow's pooled output holds NaN or infinite values in 1 row(s) of this "
                              f"batch (the first of item {bad[0]}); CKA and RSA need finite features: compare another "
                              f"module, or find where the model overflows (its dtype, its inputs)")


def test_rbf_cka_where_the_median_distance_is_0_is_n_a_with_its_own_cause(tmp_path, caplog) -> None:
    """`gate` differs from 0 for 2 of 40 items: most pairs are at distance 0, so the kernel's width is 0
    (numpy's gram_rbf divides by it: NaN). Said in a warning and labelled as such, not `constant features`;
    linear CKA is defined for it (numpy's)."""
    data = gated_data()
    a, gate = recorded(Gated(), ["a", "gate"], data.tensors[0], "flatten")
    d2 = ((gate[:, None] - gate[None]) ** 2).sum(-1)
    assert np.median(d2) == 0 and np.ptp(gate, axis=0).max() > 0
    config = {"data": {"batch_size": 8}, "device": "cpu", "progress": False,
              "similarity": {"at": ["a", "gate"], "measure": "rbf_cka"}}
    path = hookrun.run({**config, "output": {"path": str(tmp_path / "r.h5")}}, model=Gated().eval(), dataset=data).path
    got, meta = file_matrix(path)
    assert np.isnan(got[1]).all() and np.isnan(got[:, 1]).all() and got[0, 0] == pytest.approx(1.0)
    assert meta["undefined"] == {"gate": "median distance 0"}
    assert [r.message for r in caplog.records if r.levelname == "WARNING"] == [
        "similarity: gate: the median squared distance between items is 0 (most items' features are equal): the rbf "
        "kernel's width sigma x median is 0, rbf_cka is undefined there, NaN in the file (n/a in the pictures); "
        "linear_cka is defined for it"]
    assert kind_lines(hookrun.open_run(path).file)[-1] == "  n/a: undefined (gate: median distance 0)"
    config["similarity"]["measure"] = "linear_cka"
    path = hookrun.run({**config, "output": {"path": str(tmp_path / "l.h5")}}, model=Gated().eval(), dataset=data).path
    assert file_matrix(path)[0][0, 1] == pytest.approx(cka(a @ a.T, gate @ gate.T), rel=1e-6)


def test_a_nan_cell_whose_cause_was_not_recorded_is_not_called_constant(tmp_path) -> None:
    """(Readers said `n/a: undefined (constant features)` for any NaN the file gave no cause for.)"""
    with h5py.File(tmp_path / "u.h5", "w") as f:
        f.attrs["kind"] = "similarity"  # (as every similarity file; without it the reader was found only once loaded)
        f.attrs["similarity"] = json.dumps({"measure": "linear_cka", "estimator": "exact", "route": "gram",
                                            "pool": "flatten", "rows": ["a", "b"], "cols": ["a", "b"], "model": "m"})
        f["captures/similarity/__model__/linear_cka"] = np.array([[1.0, np.nan], [np.nan, np.nan]])
    from hookrun.runner.kinds.similarity.reader import spec

    with h5py.File(tmp_path / "u.h5", "r") as f:
        assert kind_lines(f)[-1] == "  n/a: undefined" and spec(f).title.endswith("(n/a: undefined)")
        assert "constant" not in " ".join(kind_lines(f)) + spec(f).title


def test_pool_mean_averages_a_conv1d_map_over_its_length_and_other_3d_outputs_over_their_tokens(tmp_path) -> None:
    """A Conv1d's (rows, channels, length) was averaged over its channels as if they were tokens (0.6575
    where the mean over the length gives 0.3888). Reference: raw hooks, numpy's mean over the last axis.
    Any other 3-D output (a ViT block's patches, here a Linear's over (rows, tokens, features) with no
    attention mask) stays token rows: numpy's mean over axis 1."""
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Conv1d(1, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv1d(8, 4, 3, padding=1), Transposed(), torch.nn.Linear(4, 5)).eval()
    x = torch.randn(40, 1, 6, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.TensorDataset(x, torch.zeros(40))
    config = {"data": {"batch_size": 8}, "device": "cpu", "progress": False,
              "similarity": {"at": ["0", "2", "4"], "pool": "mean"}}
    path = hookrun.run({**config, "output": {"path": str(tmp_path / "c.h5")}}, model=model, dataset=data).path
    raw = _raw(model, ["0", "2", "4"], x)
    a, b = (f.double().numpy().mean(axis=2) for f in raw[:2])  # (over the length)
    c = raw[2].double().numpy().mean(axis=1)  # (over the tokens)
    got = file_matrix(path)[0]
    assert got[0, 1] == pytest.approx(cka(a @ a.T, b @ b.T), rel=1e-6)
    assert got[1, 2] == pytest.approx(cka(b @ b.T, c @ c.T), rel=1e-6)


class Transposed(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2)  # (rows, length, channels): token rows for the Linear after it


def _raw(model: torch.nn.Module, names: list[str], x: torch.Tensor) -> list[torch.Tensor]:
    """Each module's output as a raw forward hook sees it (unpooled)."""
    out: dict[str, torch.Tensor] = {}
    handles = [model.get_submodule(n).register_forward_hook(lambda m, i, o, n=n: out.__setitem__(n, o.detach().clone()))
               for n in names]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return [out[n] for n in names]


class OneStep(torch.nn.Module):
    def forward(self, y: torch.Tensor) -> torch.Tensor:  # every other row one float32 step up
        y = y.clone()
        y[1::2] = torch.nextafter(y[1::2], torch.full_like(y[1::2], float("inf")))
        return y


@pytest.mark.parametrize(("estimator", "measure", "route", "items"), [
    ("exact", "linear_cka", "feature", "one"), ("exact", "rsa", "gram", "one"), ("unbiased", "rbf_cka", "gram", "one"),
    ("minibatch", "linear_cka", "minibatch", "per_batch")])
def test_rows_equal_up_to_rounding_are_constant_on_every_route(tmp_path, caplog, estimator, measure, route,
                                                               items) -> None:
    """One input repeated (for the minibatch estimator: one per batch of 8) through nn.Linear, every other row of
    each Linear's output one float32 step away (OneStep: the rounding a kernel that sums in another order per row
    gives; on a CPU whose kernels do not, the rows were bit for bit equal): the rows differ by float32 rounding
    only (raw hooks: 3e-8 to 1.2e-7 of values near 1), and that noise was compared as features
    (minibatch CKA 0.6461, no warning)."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), OneStep(), torch.nn.ReLU(), torch.nn.Linear(5, 4), OneStep()).eval()
    v = torch.randn(6, 6, generator=torch.Generator().manual_seed(0))
    x = torch.stack([v[i // 8] if items == "per_batch" else v[1] for i in range(40)])
    spreads = [np.ptp(f.double().numpy(), axis=0).max() for b in range(0, 40, 8) for f in _raw(model, ["1", "4"], x[b:b + 8])]
    assert 0 < max(spreads) <= 2 ** -23  # one float32 step of values below 2: rounding, not nothing (equal rows passed before)
    config = {"data": {"batch_size": 8}, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "n.h5")},
              "similarity": {"at": ["1", "4"], "estimator": estimator, "measure": measure}}
    path = hookrun.run(config, model=model, dataset=torch.utils.data.TensorDataset(x, torch.zeros(40))).path
    got, meta = file_matrix(path)
    assert meta["route"] == route and np.isnan(got).all()
    each = " within every batch" if route == "minibatch" else ""
    assert meta["undefined"] == {"1": f"constant features{each}", "4": f"constant features{each}"}
    what = "constant features within every batch" if each else "the same features for every item"
    assert [r.message for r in caplog.records if r.levelname == "WARNING"] == [
        f"similarity: 1, 4 give(s) {what}: {measure} is undefined there, NaN in the file (n/a in the pictures)"]


def rounding_walk(c: float, rows: int = 64, features: int = 4, steps: int = 4) -> torch.Tensor:
    """Each feature a constant near c (c to 2c), every value then moved `steps` float32 steps up or down at
    random: one value up to a few float32 roundings (std 2 steps), about its magnitude whatever that is."""
    g = torch.Generator().manual_seed(0)
    y = torch.full((rows, features), c, dtype=torch.float32) * (1 + torch.rand(features, generator=g))[None]
    for _ in range(steps):
        up = torch.rand(rows, features, generator=g) < 0.5
        y = torch.nextafter(y, torch.where(up, torch.tensor(float("inf")), torch.tensor(-float("inf"))))
    return y


def relative_spread(x: np.ndarray) -> float:
    """numpy: the largest column's spread about its mean over its sum of squares (measures.NOISE's measure)."""
    spread = ((x - x.mean(axis=0)) ** 2).sum(axis=0)
    return float((spread / (x**2).sum(axis=0)).max())


@pytest.mark.parametrize("c", [1.0, 1e3, 1e-3])
def test_a_layer_constant_up_to_rounding_is_constant_for_minibatch_as_for_exact(tmp_path, c) -> None:
    """A layer one value up to a few float32 roundings (rounding_walk at magnitudes 1, 1e3, 1e-3): the exact
    route calls it constant (n/a), its spread within measures.NOISE of its squares over the rows; the
    minibatch route asked that of each batch of 8 alone, and some batch's spread over its few rows came out
    above it by chance (1.1e-13 to 1.3e-13), so its self-similarity read 1.0 and its CKA with any layer was
    CKA of rounding noise, with no word. Reference: numpy on the same rows (the whole's and each batch's
    relative spread); now the minibatch route weighs the within-batch spreads over all its batches."""
    x = rounding_walk(c)
    rows = x.double().numpy()
    assert relative_spread(rows) < 1e-13 < max(relative_spread(rows[b:b + 8]) for b in range(0, 64, 8))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Identity(), torch.nn.Linear(4, 3)).eval()
    data = torch.utils.data.TensorDataset(x, torch.zeros(64))
    got = {}
    for estimator in ("exact", "minibatch"):
        config = {"data": {"batch_size": 8}, "device": "cpu", "progress": False, "similarity": {"at": ["0"], "estimator": estimator},
                  "output": {"path": str(tmp_path / f"{estimator}.h5")}}
        got[estimator] = file_matrix(hookrun.run(config, model=model, dataset=data).path)
    assert np.isnan(got["exact"][0]).all() and got["exact"][1]["undefined"] == {"0": "constant features"}
    assert np.isnan(got["minibatch"][0]).all()
    assert got["minibatch"][1]["undefined"] == {"0": "constant features within every batch"}


def test_a_sweeps_report_names_the_jobs_it_has_no_matrix_for(tmp_path, capsys) -> None:
    """Job 0 complete, job 1 failed at its second batch (the model's own error), job 2 refused before its
    file opened: the report's similarity section showed job 0's matrix alone under 'each job's matrix',
    and said nothing of the two others; plot drew job 0's PNG and said nothing of them either. Reference:
    each job's file (h5py) and its folder."""
    import yaml
    from toy_models import raising_at

    from hookrun.analysis.kind_readers import kind_sweep_sections
    from hookrun.errors import RunError
    from hookrun.models.tiny_cnn import tiny_cnn

    for num, measure in enumerate(["linear_cka", "rsa", "linear_cka"]):
        job = tmp_path / "sweep" / str(num)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"similarity.measure={measure}", f"seed={num}"]))
    hookrun.run(cfg(tmp_path / "sweep" / "0" / "captures.h5", n=12, at=["block1", "block3"], pool="mean"))
    model = tiny_cnn()
    raising_at(model, 2, RuntimeError("the model's own error"))
    with pytest.raises(RunError):
        hookrun.run(cfg(tmp_path / "sweep" / "1" / "captures.h5", n=12, at=["block1", "block3"], pool="mean",
                        measure="rsa"), model=model)
    with h5py.File(tmp_path / "sweep" / "1" / "captures.h5") as f:
        assert f.attrs["status"] == "failed"
    (tmp_path / "sweep" / "2" / "refused.txt").write_text("similarity.at: TinyCNN has no module 'nope'\n")
    sweep = hookrun.open_sweep(tmp_path / "sweep")
    assert [r["status"] for r in sweep.table()] == ["complete", "failed", "refused: similarity.at: TinyCNN has no module 'nope'"]
    (section,) = kind_sweep_sections(sweep)
    assert len(section["items"]) == 1 and section["items"][0]["caption"] == "job 0"
    assert "job 1 failed: no matrix; job 2 refused: no matrix" in section["note"], section["note"]

    pytest.importorskip("matplotlib")
    from hookrun.cli.plot_command import plot_sweep

    capsys.readouterr()
    written = plot_sweep(sweep, tmp_path / "figures")
    assert [p.name for p in written if p.name.startswith("similarity")] == ["similarity_job0.png"]
    assert "not drawn: each job's matrix (job 1 failed: no matrix; job 2 refused: no matrix)" in capsys.readouterr().out
