"""timm ViT and swin, torchvision Faster R-CNN (random init, offline) against raw hooks on the
same weights and images; 7 images in batches of 3 (a smaller last batch, of 1)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import hookrun
import hookrun.models
from hookrun.data import RandomTensors

timm = pytest.importorskip("timm")
N, BATCH = 7, 3


def run(tmp_path, model, ds, hooks, **over):
    data = {"batch_size": BATCH, **over.pop("data", {})}
    cfg = {"data": data, "device": "cpu", "progress": False, "hooks": hooks,
           "output": {"path": str(tmp_path / "c.h5"), "overwrite": True}, **over}
    hookrun.run(cfg, model=model, dataset=ds)
    return h5py.File(tmp_path / "c.h5")


def images(n=N):
    return RandomTensors(n=n, shape=(3, 32, 32), num_classes=10, seed=3)


def batches(ds):
    for i in range(0, len(ds), BATCH):
        idx = range(i, min(i + BATCH, len(ds)))
        yield torch.stack([ds[j][0] for j in idx]), torch.stack([ds[j][1] for j in idx])


def vit():
    torch.manual_seed(0)
    return hookrun.models.timm_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=10).eval()


def test_vit_blocks_and_an_ablated_attention(tmp_path):
    model, ds = vit(), images()
    outs, logits = [], []
    h1 = model.blocks[1].register_forward_hook(lambda m, a, o: outs.append(o.clone()))
    h2 = model.blocks[0].attn.register_forward_hook(lambda m, a, o: o * 0.0)
    with torch.no_grad():
        for x, _ in batches(ds):
            logits.append(model(x))
    h1.remove()
    h2.remove()
    hooks = {"ablate": {"at": "blocks.0.attn", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": 0.0}]},
             "blocks": {"at": "blocks.1", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
             "logits": {"at": "head", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    with run(tmp_path, model, ds, hooks) as f:
        np.testing.assert_allclose(f["captures/blocks/blocks.1/output"][:], torch.cat(outs).numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(f["captures/logits/head/output"][:], torch.cat(logits).numpy(), rtol=1e-5, atol=1e-6)


def test_vit_gradients_match_autograd(tmp_path):
    model, ds = vit(), images()
    hooks = {"g": {"at": "blocks.0", "type": "tensor", "actions": ["record"]}}
    loss = {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True}
    with run(tmp_path, model, ds, hooks, mode="grad", loss=loss) as f:
        got = f["captures/g/blocks.0/grad"][:]
    want = []
    for x, y in batches(ds):
        keep = []
        h = model.blocks[0].register_forward_hook(lambda m, a, o, keep=keep: keep.append(o))
        out = torch.nn.functional.cross_entropy(model(x.requires_grad_(True)), y)
        h.remove()
        want.append(torch.autograd.grad(out, keep[0])[0])
    np.testing.assert_allclose(got, torch.cat(want).numpy(), rtol=1e-4, atol=1e-8)


def test_swin_window_tensors_fold_per_sample_and_the_mask_stays_per_step(tmp_path):
    torch.manual_seed(0)
    model = hookrun.models.timm_model("swin_tiny_patch4_window7_224", img_size=32, window_size=4, embed_dim=16,
                                      depths=(2, 2), num_heads=(1, 2), num_classes=10).eval()
    ds = images()
    xs, masks = [], []

    def keep(m, a, k):
        xs.append(a[0].clone())
        masks.append(k["mask"].clone())

    h = model.layers[0].blocks[1].attn.register_forward_pre_hook(keep, with_kwargs=True)
    with torch.no_grad():
        for x, _ in batches(ds):
            model(x)
    h.remove()
    hooks = {"win": {"at": "layers.0.blocks.1.attn", "type": "forward_pre",
                     "actions": [{"name": "record", "what": "input"}, {"name": "record", "what": "input.mask", "rows": "step"}]}}
    with run(tmp_path, model, ds, hooks) as f:
        got = f["captures/win/layers.0.blocks.1.attn/input"]
        assert got.attrs["rows"] == "samples" and got.shape[:2] == (N, 4)  # (B*windows, ...) folded: 4 windows a sample
        np.testing.assert_allclose(got[:], torch.cat(xs).reshape(N, 4, *xs[0].shape[1:]).numpy(), rtol=1e-6)
        mask = f["captures/win/layers.0.blocks.1.attn/input.mask"]
        assert mask.attrs["rows"] == "steps" and mask.shape[0] == 3
        np.testing.assert_array_equal(mask[:], torch.stack(masks).numpy())


class Pictures(Dataset):
    """(image, {boxes, labels}) items, as torchvision's detection datasets give."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        return torch.rand(3, 64, 64, generator=g), {"boxes": torch.tensor([[4.0, 4.0, 30.0, 30.0]]), "labels": torch.tensor([1])}


def test_faster_rcnn_boxes_are_variable_length_rows(tmp_path):
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_fpn(
        weights=None, weights_backbone=None, num_classes=3, min_size=64, max_size=64, box_score_thresh=0.0,
        box_detections_per_img=6).eval()
    ds = Pictures()
    pooled = []
    h = model.roi_heads.box_head.register_forward_hook(lambda m, a, o: pooled.append(o.clone()))
    with torch.no_grad():
        want = [d for i in range(0, N, BATCH) for d in model([ds[j][0] for j in range(i, min(i + BATCH, N))])]
    h.remove()
    assert len({p.shape[0] for p in pooled}) > 1  # the proposals per batch vary: one shape per row cannot hold them
    hooks = {"det": {"at": "", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
             "feats": {"at": "roi_heads.box_head", "type": "forward", "actions": [{"name": "record", "what": "output", "rows": "ragged"}]}}
    collate = {"_target_": "hookrun.data.collate_lists", "_partial_": True}
    with run(tmp_path, model, ds, hooks, data={"collate": collate}) as f:
        boxes = f["captures/det/__model__/output.boxes"]
        assert boxes.attrs["ragged"] and tuple(boxes.attrs["row_shape"]) == (4,) and boxes.shape == (N,)
        for i in range(N):
            np.testing.assert_allclose(boxes[i].reshape(-1, 4), want[i]["boxes"].numpy(), rtol=1e-5, atol=1e-4)
            np.testing.assert_array_equal(f["captures/det/__model__/output.labels"][i], want[i]["labels"].numpy())
        np.testing.assert_array_equal(f["samples/index"][:], np.arange(N))
        feats = f["captures/feats/roi_heads.box_head/output"]
        assert feats.attrs["rows"] == "steps" and feats.shape == (3,)
        for step, want_step in enumerate(pooled):
            np.testing.assert_allclose(feats[step].reshape(-1, *feats.attrs["row_shape"]), want_step.numpy(), rtol=1e-5, atol=1e-6)


def test_variable_length_rows_with_empty_samples(tmp_path):
    class Detector(torch.nn.Module):  # i boxes for sample i: sample 0 has none
        def forward(self, x):
            return [{"boxes": torch.arange(int(v) * 4, dtype=torch.float32).view(-1, 4) + v} for v in x[:, 0]]

    ds = [torch.tensor([float(i)]) for i in range(5)]
    hooks = {"det": {"at": "", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    with run(tmp_path, Detector(), ds, hooks, data={"batch_size": 2}) as f:
        rows = f["captures/det/__model__/output.boxes"]
        for i in range(5):
            np.testing.assert_array_equal(rows[i].reshape(-1, 4), (torch.arange(i * 4, dtype=torch.float32).view(-1, 4) + i).numpy())
        assert len(rows[0]) == 0


def test_timm_pretrained_weights_offline_are_one_line_naming_the_way_out(tmp_path, monkeypatch):
    """huggingface_hub's 'An error happened while trying to locate the file on the Hub ...' was the message."""
    from hookrun.errors import ConfigError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # (read when the hub was imported)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ConfigError) as got:
        hookrun.models.timm_model("resnet18", pretrained=True)
    assert str(got.value) == ("model.pretrained=true: timm's weights for 'resnet18' are not in the Hugging Face cache and "
                              "cannot be downloaded (LocalEntryNotFoundError); set model.pretrained=false (random init), "
                              "or give model.checkpoint=PATH with a state_dict file")
