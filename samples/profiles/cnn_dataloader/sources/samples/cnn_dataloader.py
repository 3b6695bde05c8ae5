"""Train a small CNN on images served by a DataLoader whose workers are slow on purpose.

Known problem for the analysis: a data-loader stall. Each sample takes --load-ms to load
(a sleep standing in for decoding and augmentation), so every step waits in the DataLoader's
next() while the device idles; more workers or a cheaper pipeline would fix it.
"""

from __future__ import annotations

import time

import torch
from models import SmallCNN, pick_device, sample_args
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset


class SlowImages(Dataset):
    """Random 3x32x32 images with labels; each item sleeps to mimic slow decoding."""

    def __init__(self, size: int, load_ms: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randn(size, 3, 32, 32, generator=generator)
        self.labels = torch.randint(0, 10, (size,), generator=generator)
        self.load_s = load_ms / 1000

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.load_s)
        return self.images[i], self.labels[i]


def main() -> None:
    args = sample_args(__doc__.splitlines()[0], steps=6, batch=16, workers=1, load_ms=10)
    device = pick_device(args.device)
    torch.manual_seed(0)
    dataset = SlowImages(args.batch * args.steps, args.load_ms)
    loader = DataLoader(dataset, batch_size=args.batch, num_workers=args.workers)
    model = SmallCNN().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    print(f"cnn_dataloader: {len(loader)} steps on {device}, final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
