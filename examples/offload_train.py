"""Train a small CNN on an image folder with DDP, its input pipeline offloaded to dlop-offloader daemons.

    dlop make-dataset /tmp/dlop-data
    dlop-offloader --listen 127.0.0.1:7001 --token-file TOKEN --threads 1 &   # and more, anywhere
    DLOP_OFFLOAD_TOKEN=$(cat TOKEN) .venv/bin/torchrun --nproc-per-node 2 examples/offload_train.py \\
        --data /tmp/dlop-data --offloaders 127.0.0.1:7001,127.0.0.1:7002
    .venv/bin/torchrun --nproc-per-node 2 examples/offload_train.py --data /tmp/dlop-data --local-dataloader

The same pipeline both ways (decode, RandomResizedCrop, flip, normalise):
dlop.data.OffloadLoader's batches are made by the daemons (each rank gets its
own shard, exactly once per epoch); with --local-dataloader a torch
DataLoader makes them in worker processes on the trainer's own cores. Each
epoch prints the loss and the samples/s of all ranks together.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def offloaded_loader(args, size: int):
    from dlop.data import OffloadLoader

    spec = {"ops": [{"op": "random_resized_crop", "size": size}, {"op": "hflip", "p": 0.5},
                    {"op": "normalize", "mean": MEAN, "std": STD}], "output": "float32"}
    return OffloadLoader(args.data, spec, args.batch_size, shuffle=True, seed=0, drop_last=True,
                         offloaders=[a for a in args.offloaders.split(",") if a])


def local_loader(args, size: int):
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    from dlop._torchvision_compat import import_torchvision

    T = import_torchvision().transforms
    transform = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    dataset = import_torchvision().datasets.ImageFolder(args.data, transform=transform)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
                        drop_last=True, persistent_workers=args.workers > 0)
    loader.set_epoch = sampler.set_epoch  # the same call as OffloadLoader's
    return loader


def model_for(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(32 * 16, classes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="an image folder, one sub-folder per class (dlop make-dataset)")
    parser.add_argument("--offloaders", default="", help="host:port,... of dlop-offloader daemons")
    parser.add_argument("--local-dataloader", action="store_true", help="a local torch DataLoader instead")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader worker processes per rank (local only)")
    parser.add_argument("--dist-backend", default="dlop")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--size", type=int, default=96, help="RandomResizedCrop's output size")
    args = parser.parse_args()

    dist.init_process_group(backend=args.dist_backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    loader = local_loader(args, args.size) if args.local_dataloader else offloaded_loader(args, args.size)
    classes = len({p.name for p in __import__("pathlib").Path(args.data).iterdir() if p.is_dir()})
    model = DDP(model_for(classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    source = "local DataLoader" if args.local_dataloader else f"dlop offloaders {args.offloaders}"
    if rank == 0:
        print(f"backend {dist.get_backend()}, {world} ranks, data from {source}, {len(loader)} steps per epoch")
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        totals = torch.zeros(2)  # loss sum, samples
        start = time.perf_counter()
        for images, labels in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
            totals += torch.tensor([loss.item() * labels.numel(), labels.numel()])
        seconds = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(totals)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"epoch {epoch}: loss {totals[0] / totals[1]:.3f}, {totals[1] / seconds.item():.1f} samples/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
