"""The seeds' tutorial script, as a whole process: forward hooks append layer1..layer4's outputs of
ResNet-18 to lists, one h5py write at the end. `python benchmarks/tutorial_script.py BATCHES OUT.h5`

benchmarks/process_pair.py times it against `python -m hookrun` doing the same run (issue 41 item 18).
"""

import sys

import h5py
import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

LAYERS = ["layer1", "layer2", "layer3", "layer4"]


def images(size: int) -> datasets.FakeData:
    """The images hookrun.data.synthetic gives (FakeData, random_offset 0), without importing hookrun."""
    return datasets.FakeData(size=size, image_size=(3, 224, 224), num_classes=1000, transform=transforms.ToTensor())


def main(batches: int, out: str) -> None:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    store: dict[str, list[torch.Tensor]] = {name: [] for name in LAYERS}
    for name in LAYERS:
        getattr(model, name).register_forward_hook(lambda m, i, o, name=name: store[name].append(o.detach().cpu()))
    with torch.no_grad():
        for x, _ in DataLoader(images(16 * batches), batch_size=16):
            model(x)
    with h5py.File(out, "w") as f:
        for name, chunks in store.items():
            f.create_dataset(name, data=torch.cat(chunks).numpy())


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
