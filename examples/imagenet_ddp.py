"""ImageNet-style DDP training on synthetic images, on any device.

    torchrun --nproc-per-node 2 examples/imagenet_ddp.py --dist-backend dlop --device cuda
    torchrun --nproc-per-node 2 examples/imagenet_ddp.py --dist-backend dlop --device dlop_test --image-size 32

An ordinary DDP script (ResNet, SGD with momentum, cross-entropy): nothing in
it is specific to dlop but the backend's name. The model is torchvision's
ResNet when torchvision's models load, else a small ResNet of the same shape
defined here. Synthetic batches (fixed seed) are made on the device, so the
figure is the training step's throughput, not a loader's. Prints images/s
per epoch of --steps steps.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Block(nn.Module):
    def __init__(self, channels_in: int, channels: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels_in, channels, 3, stride, 1, bias=False), nn.BatchNorm2d(channels), nn.ReLU(inplace=True),
            nn.Conv2d(channels, channels, 3, 1, 1, bias=False), nn.BatchNorm2d(channels))
        self.skip = nn.Identity() if stride == 1 and channels_in == channels else nn.Sequential(
            nn.Conv2d(channels_in, channels, 1, stride, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


def small_resnet(classes: int) -> nn.Module:
    """ResNet-18's layout (without torchvision)."""
    layers, channels_in = [], 64
    for channels, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(channels_in, channels, stride), Block(channels, channels, 1)]
        channels_in = channels
    return nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                         nn.MaxPool2d(3, 2, 1), *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))


def make_model(arch: str, classes: int) -> nn.Module:
    try:
        import torchvision

        return getattr(torchvision.models, arch)(num_classes=classes)
    except Exception:  # noqa: BLE001  (no torchvision, or one built for another torch)
        return small_resnet(classes)


def pick_device(name: str, local_rank: int) -> torch.device:
    if name == "cpu":
        return torch.device("cpu")
    if name == "dlop_test":
        import dlop.testing.accelerator  # noqa: F401  (the project's test accelerator)
    module = getattr(torch, name)
    device = torch.device(name, local_rank % module.device_count())
    module.set_device(device.index)
    return device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dist-backend", default="dlop")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=20, help="per epoch")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    device = pick_device(args.device, int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=args.dist_backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = make_model(args.arch, args.classes).to(device)
    ddp = DDP(model, device_ids=None if device.type == "cpu" else [device.index])
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(rank)
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=generator).to(device)
    labels = torch.randint(0, args.classes, (args.batch_size,), generator=generator).to(device)
    sync = (lambda: getattr(torch, device.type).synchronize(device)) if device.type != "cpu" else (lambda: None)
    if rank == 0:
        print(f"backend {dist.get_backend()}, {world} ranks on {device.type}, {args.arch}, "
              f"{args.batch_size} images of {args.image_size}px per rank per step")
    for epoch in range(args.epochs):
        sync()
        start = time.perf_counter()
        for _ in range(args.steps):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(images), labels)
            loss.backward()
            optimizer.step()
        sync()
        seconds = time.perf_counter() - start
        rate = torch.tensor([args.steps * args.batch_size / seconds], device=device)
        dist.all_reduce(rate)  # every rank's images/s, summed (on the device, like the gradients)
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}  {rate.item():.1f} images/s "
                  f"({world} ranks, {seconds / args.steps * 1e3:.1f} ms/step)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
