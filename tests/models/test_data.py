"""Datasets: the image-folder reader (both layouts) against torchvision's own transforms."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms

import hookrun
from hookrun.data import image_folder
from hookrun.errors import ConfigError


def write_images(folder, names):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in names:
        Image.fromarray(rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(folder / name)


def reference(path):
    tf = transforms.Compose([transforms.Resize(36), transforms.CenterCrop(32), transforms.ToTensor(),
                             transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    return tf(Image.open(path).convert("RGB"))


@pytest.mark.parametrize("layout", ["flat", "classes"])
def test_image_folder_run_records_paths_and_normalised_images(tmp_path, layout):
    root = tmp_path / "images"
    if layout == "flat":
        write_images(root, ["b.png", "a.png", "c.jpg"])
    else:
        write_images(root / "cat", ["1.png", "2.png"])
        write_images(root / "dog", ["3.png"])
    cfg = {
        "model": {"_target_": "torchvision.models.resnet18", "weights": None, "num_classes": 3},
        "data": {"dataset": {"_target_": "hookrun.data.image_folder", "root": str(root), "resize": 36, "crop": 32}, "batch_size": 2},
        "device": "cpu", "progress": False, "output": {"path": str(tmp_path / "c.h5")},
        "hooks": {"x": {"at": "conv1", "type": "forward_pre", "actions": ["record"]}},
    }
    with h5py.File(hookrun.run(cfg).path) as f:
        paths = [p.decode() for p in f["samples/path"][:]]
        expected = sorted(str(p) for p in root.rglob("*.*"))
        assert paths == expected
        for row, path in enumerate(paths):
            np.testing.assert_allclose(f["captures/x/conv1/input"][row], reference(path).numpy(), atol=1e-6)
        if layout == "classes":
            np.testing.assert_array_equal(f["samples/target"][:], [0, 0, 1])
        else:
            assert "target" not in f["samples"]


def test_image_folder_errors(tmp_path):
    with pytest.raises(ConfigError, match="data.root is not set"):
        image_folder(None)
    with pytest.raises(ConfigError, match="is not a folder"):
        image_folder(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no images"):
        image_folder(str(tmp_path / "empty"))


def _png(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((40, 40, 3), value, np.uint8)).save(path)


def test_images_beside_class_folders_are_refused_naming_them(tmp_path):
    """Three images beside one subfolder: the run read the subfolder's one image as class 0 and dropped
    the three, silently."""
    for i in range(3):
        _png(tmp_path / f"top{i}.png", 10 * i)
    _png(tmp_path / "thumbs" / "t.png", 200)
    with pytest.raises(ConfigError, match=r"holds class folders \(thumbs\) and 3 image\(s\) beside them "
                                          r"\(top0.png, top1.png, top2.png\), which the class-folder layout does not read"):
        image_folder(str(tmp_path))


def test_hidden_folders_are_not_classes(tmp_path):
    """A notebook's .ipynb_checkpoints folder was a class (and, empty, stopped the run). Reference:
    torchvision's ImageFolder on the same images without the hidden folder."""
    from torchvision import datasets, transforms

    for name, value in (("cat/a.png", 10), ("cat/b.png", 20), ("dog/c.png", 30)):
        _png(tmp_path / "clean" / name, value)
        _png(tmp_path / "notebook" / name, value)
    _png(tmp_path / "notebook" / ".ipynb_checkpoints" / "a-checkpoint.png", 99)
    (tmp_path / "notebook" / ".cache").mkdir()
    got = image_folder(str(tmp_path / "notebook"), resize=36, crop=32)
    tf = transforms.Compose([transforms.Resize(36), transforms.CenterCrop(32), transforms.ToTensor(),
                             transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    want = datasets.ImageFolder(str(tmp_path / "clean"), transform=tf)
    assert got.classes == want.classes == ["cat", "dog"] and len(got) == len(want) == 3
    for i in range(3):
        assert got[i][1] == want[i][1] and torch.equal(got[i][0], want[i][0])


def test_synthetic_images_are_fixed_per_index():
    a = hookrun.data.synthetic(size=4, image_size=(3, 8, 8))
    b = hookrun.data.synthetic(size=4, image_size=(3, 8, 8))
    assert torch.equal(a[2][0], b[2][0]) and not torch.equal(a[1][0], a[2][0])


def test_another_synthetic_seed_is_another_draw():
    """seed 1's item i was seed 0's item i + 1 (FakeData's offset only shifts the index): two seeds shared
    all but one image. Reference: the images of both seeds compared pairwise."""
    a = hookrun.data.synthetic(size=6, image_size=(3, 8, 8), seed=0)
    b = hookrun.data.synthetic(size=6, image_size=(3, 8, 8), seed=1)
    assert not any(torch.equal(a[i][0], b[j][0]) for i in range(6) for j in range(6))
    with pytest.raises(ConfigError, match=r"data.dataset.seed: expected a whole number from 0 to 4294967295, got -1"):
        hookrun.data.synthetic(seed=-1)


@pytest.mark.parametrize("make, kw, message", [
    ("synthetic", {"size": -1}, r"data.dataset.size: expected a whole number >= 1, got -1"),
    ("synthetic", {"num_classes": 0}, r"data.dataset.num_classes: expected a whole number >= 1, got 0"),
    ("synthetic", {"image_size": [3, 0, 8]}, r"data.dataset.image_size: expected \[channels, height, width\]"),
    ("shapes", {"noise": -1}, r"data.dataset.noise: expected a standard deviation >= 0, got -1"),
    ("shapes", {"image_size": 0}, r"data.dataset.image_size: expected a whole number >= 8, got 0"),
    ("text", {"start": -1}, r"data.dataset.start: expected a whole number >= 0, got -1"),
    ("text", {"limit": 0}, r"data.dataset.limit: expected a whole number >= 1, got 0"),
])
def test_out_of_range_data_set_arguments_are_one_line(make, kw, message):
    """They were tracebacks (FakeData's '__len__() should return >= 0', numpy's 'scale < 0'), or, for a
    negative text start, Python's slice: the last text alone, silently."""
    with pytest.raises(ConfigError, match=message):
        getattr(hookrun.data, make)(**kw)


def test_a_text_start_past_the_end_names_the_number_of_texts(tmp_path):
    """start 9000 of a file of fewer texts said 'holds no text' of a file that holds some; now the line names
    how many it holds (the reference: the file's lines counted here), and an empty file still says no text."""
    lines = ["alpha beta", "gamma", "delta epsilon zeta"]
    (tmp_path / "t.txt").write_text("\n".join(lines) + "\n")
    assert [hookrun.data.text(str(tmp_path / "t.txt"), start=2).texts] == [lines[2:]]
    with pytest.raises(ConfigError, match=rf"^data.dataset.start=3: past the end: data.dataset.files: "
                                          rf"{tmp_path / 't.txt'} holds {len(lines)} text\(s\); give a start below {len(lines)}$"):
        hookrun.data.text(str(tmp_path / "t.txt"), start=3)
    (tmp_path / "e.txt").write_text("")
    with pytest.raises(ConfigError, match=r"^data.dataset.files: .*e.txt holds no text$"):
        hookrun.data.text(str(tmp_path / "e.txt"))


@pytest.mark.parametrize("kw, message", [
    ({"resize": 32, "crop": 64}, "data.dataset.crop=64 is larger than data.dataset.resize=32 (the resized image's shorter "
                                 "side): the centre crop would pad it with black borders; give crop <= resize"),
    ({"resize": 36, "crop": 0}, "data.dataset.crop: expected a whole number >= 1, got 0"),
    ({"resize": 0, "crop": 32}, "data.dataset.resize: expected a whole number >= 1, got 0"),
])
def test_image_folder_sizes_that_would_pad_or_empty_the_images_are_one_line(tmp_path, kw, message):
    """crop 64 after resize 32 was torchvision's CenterCrop padding every image with zeros (black borders,
    -2.1 after normalising) with no word; crop 0 gave (3, 0, 0) images; resize 0 a ValueError at the first item.
    Reference: CenterCrop's own padding, seen on the same image; the exact lines."""
    from torchvision import transforms

    _png(tmp_path / "a.png", 10)
    padded = transforms.CenterCrop(64)(transforms.Resize(32)(Image.open(tmp_path / "a.png")))
    assert np.asarray(padded.convert("L"))[0, 0] == 0  # (what the run read before: a black border)
    with pytest.raises(ConfigError) as err:
        image_folder(str(tmp_path), **kw)
    assert str(err.value) == message


def test_hidden_image_files_are_not_items(tmp_path):
    """macOS's AppleDouble `._a.png` (metadata beside a.png on a copied drive) was an item: the run stopped at
    it ('cannot identify image file'), in a class folder after every batch before it. Reference: torchvision's
    ImageFolder on the same images without the hidden files; the flat folder's visible file names."""
    from torchvision import datasets, transforms

    for name, value in (("cat/a.png", 10), ("cat/b.png", 20), ("dog/c.png", 30)):
        _png(tmp_path / "clean" / name, value)
        _png(tmp_path / "copied" / name, value)
    for junk in ("copied/cat/._a.png", "copied/dog/._c.png", "flat/._a.png"):
        (tmp_path / junk).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / junk).write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    _png(tmp_path / "flat" / "a.png", 40)
    tf = transforms.Compose([transforms.Resize(36), transforms.CenterCrop(32), transforms.ToTensor(),
                             transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    got, want = image_folder(str(tmp_path / "copied"), resize=36, crop=32), datasets.ImageFolder(str(tmp_path / "clean"), transform=tf)
    assert len(got) == len(want) == 3
    for i in range(3):
        assert got[i][1] == want[i][1] and torch.equal(got[i][0], want[i][0])
    flat = image_folder(str(tmp_path / "flat"), resize=36, crop=32)
    assert [p for p, _ in flat.samples] == [str(tmp_path / "flat" / "a.png")] and torch.equal(flat[0], tf(Image.open(tmp_path / "flat" / "a.png").convert("RGB")))


def test_a_hugging_face_dataset_of_lists_is_told_to_format_itself_as_torch(tmp_path):
    """A datasets.Dataset gives lists until it is formatted: the refusal names ds.with_format('torch'),
    and the formatted one runs, recording what the Linear layer gives on the same rows."""
    datasets = pytest.importorskip("datasets")
    rows = [[float(i), -float(i), 0.5, 2.0] for i in range(8)]
    ds = datasets.Dataset.from_dict({"x": rows, "label": [0] * 8})
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    cfg = {"device": "cpu", "progress": False, "output": {"path": str(tmp_path / "r.h5")}, "data": {"batch_size": 4, "inputs": ["x"]},
           "hooks": {"h": {"at": "0", "type": "forward", "actions": ["record"]}}}
    with pytest.raises(ConfigError, match=r"holds a tensor \(got list\); a Hugging Face datasets.Dataset gives lists: "
                                          r"pass ds.with_format\('torch'\)"):
        hookrun.run(cfg, model=model, dataset=ds)
    result = hookrun.run(cfg, model=model, dataset=ds.with_format("torch"))
    with h5py.File(result.path, "r") as f:
        got = f["captures/h/0/output"][:]
    np.testing.assert_allclose(got, model(torch.tensor(rows)).detach().numpy(), rtol=1e-6)
