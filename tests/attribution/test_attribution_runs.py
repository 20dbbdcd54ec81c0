"""Attribution runs on the shipped shape classifier (issue 39): deletion and insertion curves equal a numpy
computation of their definition, a run killed with SIGKILL resumes to the file an uninterrupted run
writes, bad inputs are one line before any batch, and the shipped experiments compose and run."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch
from kill_in_flush import killed_inside_a_flush
from shapes_fixtures import data, model  # noqa: F401  (fixtures: the shipped tiny_cnn, 8 shapes)

import hookrun
from hookrun.errors import ConfigError
from hookrun.store.live import settled

captum_attr = pytest.importorskip("captum.attr")
pytest.importorskip("zennit")

N, B = 8, 4
MODEL = {"_target_": "hookrun.models.tiny_cnn"}
DATA = {"dataset": {"_target_": "hookrun.data.shapes", "size": N}, "batch_size": B}



def cfg(path, **block):
    return {"model": MODEL, "data": DATA, "device": "cpu", "progress": False, "output": {"path": str(path)},
            "attribution": block}


def numpy_curve(model, x, baseline, target, score, steps, deletion):
    """The definition: rank pixels by score (largest first, ties in pixel order); step k of `steps`
    removes the first k*P//steps (sets them to the baseline, every channel) or, for insertion, starts
    from the baseline and puts them back; the target's probability after each step."""
    n, c, h, w = x.shape
    p = h * w
    order = np.argsort(-score.reshape(n, p), axis=1, kind="stable")
    out = np.zeros((n, steps + 1))
    for i in range(n):
        for k in range(steps + 1):
            chosen = order[i, : k * p // steps]
            img = (x[i] if deletion else baseline[i]).reshape(c, p).copy()
            img[:, chosen] = (baseline[i] if deletion else x[i]).reshape(c, p)[:, chosen]
            with torch.no_grad():
                logits = model(torch.from_numpy(img.reshape(1, c, h, w))).double()
            out[i, k] = torch.softmax(logits, 1)[0, target[i]].item()
    return out


def test_deletion_and_insertion_equal_numpy_of_the_definition(tmp_path, model, data):
    hookrun.run(cfg(tmp_path / "a.h5", method="saliency", measure={"deletion": 4, "insertion": 5}, memory="200KB"))
    run = hookrun.open_run(tmp_path / "a.h5")
    x = torch.stack([data[i][0] for i in range(N)])
    y = torch.tensor([data[i][1] for i in range(N)])
    sal = torch.cat([captum_attr.Saliency(model).attribute(x[s: s + B].clone(), target=y[s: s + B]) for s in (0, B)])
    score = sal.sum(1).numpy()
    xs = x.numpy()
    for name, steps in (("deletion", 4), ("insertion", 5)):
        want = numpy_curve(model, xs, np.zeros_like(xs), y.numpy(), score, steps, name == "deletion")
        got = run.attribution(name)
        assert got.dims == ("sample", "fraction") and got.shape == (N, steps + 1)
        np.testing.assert_allclose(got.values, want, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(run.attribution()[f"{name}_area"].values, np.trapezoid(want, np.linspace(0, 1, steps + 1), axis=1),
                                   rtol=1e-5, atol=1e-7)
    budget = json.loads(run.attribution().attrs["budget"])
    assert budget["curve_rows_per_forward"] < 2 * (5 + 1)  # the 200KB budget split the curves' forwards


def test_a_killed_run_resumes_to_the_same_file(tmp_path):
    block = {"method": "integrated_gradients", "steps": 4, "measure": {"deletion": 2}}
    ref = hookrun.run(cfg(tmp_path / "ref.h5", **block)).path
    c = cfg(tmp_path / "k.h5", **block)
    c["data"] = {**DATA, "batch_size": 2}
    c["output"]["flush_every"] = 1
    ref2 = hookrun.run({**c, "output": {"path": str(tmp_path / "ref2.h5")}}).path
    out = killed_inside_a_flush(c, 4)
    assert out.returncode == 9, out.stderr[-2000:]
    settled(tmp_path / "k.h5")  # (the killed writer's flush helper lets go of the file once it has applied its last message)
    with h5py.File(tmp_path / "k.h5") as f:
        assert f.attrs["status"] != "complete" and 0 < f["samples/index"].shape[0] < N
    assert hookrun.run({**c, "resume": True}).status == "complete"
    with h5py.File(tmp_path / "k.h5") as f, h5py.File(ref2) as r, h5py.File(ref) as r4:
        names = []
        f["captures"].visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        assert sorted(names) == sorted(["attribution/__model__/" + k for k in
                                        ("attribution", "target", "logit", "prob", "delta", "deletion", "deletion_area",
                                         "deletion_random", "deletion_random_area")])
        np.testing.assert_array_equal(f["samples/index"][:], np.arange(N))
        for n in names:
            np.testing.assert_array_equal(f["captures/" + n][:], r["captures/" + n][:])
            if "_random" not in n:  # (the random orders are drawn per batch: batches of 4 draw others)
                np.testing.assert_allclose(f["captures/" + n][:], r4["captures/" + n][:], rtol=1e-5, atol=1e-6)


class Twice(torch.nn.Module):
    """tiny_cnn after a ReLU module that its forward calls twice."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.act = inner, torch.nn.ReLU()

    def forward(self, x):
        return self.inner(self.act(self.act(x)))


class Unused(torch.nn.Module):
    """tiny_cnn with a module its forward never calls."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.spare = inner, torch.nn.Conv2d(1, 1, 1)

    def forward(self, x):
        return self.inner(x)


def not_canonizable():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.BatchNorm2d(1), torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 4)).eval()


@pytest.mark.parametrize("block, live, message", [
    ({"method": "saliency", "target": 7}, None, r"attribution.target=7: class 7 is out of range: the model has 4 classes"),
    ({"method": "saliency", "target": "answer"}, None, r"attribution.target='answer': the items have no key 'answer'"),
    ({"method": "integrated_gradients", "at": "spare"}, "unused", r"attribution.at='spare': the module never ran"),
    ({"method": "grad_cam", "at": "block9"}, None, r"attribution.at='block9': the model has no module .*closest names: block"),
    ({"method": "occlusion", "window": [1, 40, 8]}, None, r"attribution.window=\[1, 40, 8\]: larger than an item's input \[1, 32, 32\]"),
    ({"method": "integrated_gradients", "baseline": "ref"}, "dict", r"attribution.baseline='ref': the baseline's shape \[1, 16, 16\] differs from the input's \[1, 32, 32\]"),
    ({"method": "lrp"}, "bn_first", r"attribution.method=lrp: zennit cannot canonize Sequential: its batch norm\(s\) 0 do not"),
    ({"method": "integrated_gradient"}, None, r"attribution.method='integrated_gradient': not a choice; did you mean integrated_gradients"),
    ({"method": "grad_cam"}, None, r"attribution.at=input: grad_cam weighs a layer's feature maps"),
    ({"method": "saliency", "at": "block3"}, None, r"attribution.at='block3': method=saliency attributes to the input only"),
    ({"method": "occlusion"}, None, r"attribution.window: occlusion needs the sliding window's shape"),
    ({"method": "saliency", "target": [1, 2]}, None, r"attribution.target=\[1, 2\]; give label, predicted, a class number"),
    ({"method": "saliency", "target": 1.5}, None, r"attribution.target=1.5; give label, predicted, a class number"),
    ({"method": "saliency", "target": "score"}, "dict", r"attribution.target=score: \d\.7 is not a class number \(a whole number"),
    ({"method": "saliency", "target": "ref"}, "dict", r"attribution.target=ref: gives \(4, 1, 16, 16\) for a batch of 4 items; give one class"),
    ({"method": "integrated_gradients", "at": "act", "steps": 2}, "twice", r"attribution.at='act': the module runs 2 times in a forward"),
    ({"method": "grad_cam", "at": ""}, None, r"attribution.at='': the model itself, whose output is the logits"),
], ids=["target_range", "target_key", "never_fires", "no_module", "window", "baseline_shape", "lrp_canonize",
        "method_typo", "grad_cam_input", "saliency_layer", "no_window", "target_list", "target_float", "target_key_float",
        "target_key_tensor", "module_twice", "at_root"])
def test_bad_inputs_are_one_line_before_any_batch(tmp_path, model, data, block, live, message):
    path = tmp_path / "bad.h5"
    c = cfg(path, **block)
    kwargs = {}
    if live == "unused":
        kwargs["model"] = Unused(model)
    elif live == "bn_first":
        kwargs["model"] = not_canonizable()
    elif live == "twice":
        kwargs["model"] = Twice(model)
    elif live == "dict":
        kwargs["dataset"] = [{"image": data[i][0], "label": data[i][1], "ref": torch.zeros(1, 16, 16),
                              "score": data[i][1] + 0.7} for i in range(N)]
        c["data"] = {"batch_size": B, "inputs": ["image"]}
    with pytest.raises(ConfigError, match=message) as exc:
        hookrun.run(c, **kwargs)
    assert "\n" not in str(exc.value)
    assert not path.exists()


def test_the_shipped_experiments_compose_and_run(tmp_path):
    for name, extra in (("attribution_shapes", ["data.dataset.size=4", "attribution.steps=4"]),
                        ("attribution_resnet50", ["data.dataset.size=2", "data.batch_size=2", "data.dataset.image_size=[3,32,32]",
                                                  "attribution.steps=2", "data.limit=1"])):
        c = hookrun.compose(f"experiment={name}", f"output.path={tmp_path / name}.h5", "device=cpu", "progress=false", *extra)
        hookrun.run(c)
        got = hookrun.open_run(tmp_path / f"{name}.h5").attribution()
        assert got.dims == ("sample", "channel", "height", "width")
        if name == "attribution_shapes":
            assert got.shape == (4, 1, 32, 32) and "deletion_area" in got.coords and "delta" in got.coords
        else:
            assert got.shape == (2, 64, 8, 8) and got.attrs["at"] == "layer1.1.conv2"


def test_a_token_model_attributes_at_its_embeddings_as_captum_does(tmp_path):
    pytest.importorskip("transformers")
    from toy_lm import VOCAB, tiny_gpt2

    lm = tiny_gpt2()
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, VOCAB, (4, 6), generator=g)
    items = [{"input_ids": ids[i], "answer": int(ids[i, 0])} for i in range(4)]
    c = {"data": {"batch_size": 2, "target": None}, "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "t.h5")},
         "attribution": {"method": "integrated_gradients", "at": "transformer.wte", "target": "answer", "steps": 4,
                         "measure": {"deletion": 3}}}
    hookrun.run(c, model=lm, dataset=items)
    run = hookrun.open_run(tmp_path / "t.h5")
    got = run.attribution()
    assert got.dims == ("sample", "position", "feature") and got.shape[:2] == (4, 6)
    want = torch.cat([captum_attr.LayerIntegratedGradients(lambda x: lm(input_ids=x).logits[:, -1], lm.transformer.wte).attribute(
        ids[s: s + 2], baselines=torch.zeros_like(ids[s: s + 2]), target=ids[s: s + 2, 0], n_steps=4) for s in (0, 2)])
    np.testing.assert_allclose(got.values, want.detach().numpy(), rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    assert got.sum("feature").dims == ("sample", "position")  # each token's share
    assert run.attribution("deletion").shape == (4, 4)
    from hookrun.runner.kinds.attribution.report import overlays
    title = overlays(run, dict(got.attrs))["title"]  # what the maps sum over, and no word of input images
    assert "summed over the 32 features at each token position" in title and "image" not in title, title


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_text_is_attributed_at_each_items_last_real_token(side):
    """Right padding: the class attributed, its logit, the map and the deletion curve are those of each
    item's last real token (a raw forward and captum on the same weights), not of the padding after it."""
    pytest.importorskip("transformers")
    from hookrun.data.text import text
    from hookrun.models.tiny_lm import tiny_lm

    lm, ds = tiny_lm().eval(), text(files="pydoc_topics", max_length=24, limit=4, padding_side=side)
    ids = torch.stack([ds[i]["input_ids"] for i in range(4)])
    am = torch.stack([ds[i]["attention_mask"] for i in range(4)])
    assert len(set(am.sum(1).tolist())) > 1  # items of several lengths: padding on some
    got = hookrun.attribute(lm, ds, batch_size=2, target_key=None, method="integrated_gradients", at="transformer.wte",
                            target="predicted", steps=4, measure={"deletion": 3})

    def at_last_real(ids, am):  # the logits at the last 1 of the mask: the last position minus its trailing 0s
        last = am.shape[1] - 1 - torch.flip(am, [1]).argmax(1)  # (positions from each item's first real token,
        pos = (am.cumsum(1) - 1).clamp(min=0)                   # as generate() and TransformerLens count them)
        return lm(input_ids=ids, attention_mask=am, position_ids=pos).logits[torch.arange(len(ids)), last]

    with torch.no_grad():
        logits = at_last_real(ids, am)
    target = logits.argmax(1)
    np.testing.assert_array_equal(got["target"], target.numpy())
    np.testing.assert_allclose(got["logit"], logits.gather(1, target[:, None])[:, 0].numpy(), rtol=1e-5, atol=1e-5)
    want = torch.cat([captum_attr.LayerIntegratedGradients(at_last_real, lm.transformer.wte).attribute(
        ids[s: s + 2], baselines=torch.zeros_like(ids[s: s + 2]), target=target[s: s + 2], n_steps=4,
        additional_forward_args=(am[s: s + 2],)) for s in (0, 2)]).detach()
    np.testing.assert_allclose(got["attribution"], want.numpy(), rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    order = np.argsort(-want.sum(-1).numpy(), axis=1, kind="stable")  # deletion: positions set to token 0
    t = ids.shape[1]
    for k in range(4):
        cut = ids.clone()
        for i in range(4):
            cut[i, order[i, : k * t // 3]] = 0
        with torch.no_grad():
            p = torch.softmax(at_last_real(cut, am).double(), 1).gather(1, target[:, None])[:, 0]
        np.testing.assert_allclose(got["deletion"][:, k], p.numpy(), rtol=1e-5, atol=1e-6)


def test_plot_draws_the_maps_over_the_images_and_the_curves(tmp_path, data):
    pytest.importorskip("matplotlib")
    from hookrun.cli.plot_command import plot_run

    hookrun.run(cfg(tmp_path / "p.h5", method="saliency", measure={"deletion": 2, "insertion": 2}))
    written = plot_run(hookrun.open_run(tmp_path / "p.h5"), tmp_path / "fig", samples=2, dataset=data)
    names = [p.name for p in written]
    assert "attribution_saliency.png" in names and "attribution_curves_saliency.png" in names
    from hookrun.runner.kinds.attribution.pictures import captions as attribution_captions
    from hookrun.runner.kinds.attribution.reader import attribution_meta

    with hookrun.open_run(tmp_path / "p.h5") as run:  # captions name the class as the data set does
        caps = attribution_captions(attribution_meta(run.attrs), run.attribution(), [0, 1])
    assert [c.split(" · ")[:2] for c in caps] == [[f"#{i}", f"target {data.classes[int(data[i][1])]}"] for i in (0, 1)]


@pytest.mark.slow
def test_two_torchrun_ranks_split_the_samples_into_the_one_process_file(tmp_path):
    from rank_runs import TORCHRUN, cli

    args = ["experiment=attribution_shapes", "device=cpu", "progress=false", "data.dataset.size=8", "data.batch_size=2",
            "attribution.steps=4", "attribution.measure=null"]
    one = hookrun.run(hookrun.compose(*args, f"output.path={tmp_path / 'one.h5'}")).path
    proc = cli(*args, f"hydra.run.dir={tmp_path / 'ranks'}", cwd=tmp_path, launcher=TORCHRUN, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = hookrun.open_run(tmp_path / "ranks").attribution()
    want = hookrun.open_run(one).attribution()
    order = np.argsort(got["sample"].values)
    np.testing.assert_array_equal(got["sample"].values[order], np.arange(8))
    np.testing.assert_allclose(got.values[order], want.values, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got["delta"].values[order], want["delta"].values, rtol=1e-5, atol=1e-7)
    with h5py.File(tmp_path / "ranks" / "captures.rank-00001.h5") as f:  # rank 1 wrote its own half
        assert f["captures/attribution/__model__/attribution"].shape[0] == 4
