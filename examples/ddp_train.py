"""Train a small classifier with DistributedDataParallel on CPU.

    .venv/bin/torchrun --nproc-per-node 2 examples/ddp_train.py --dist-backend dlop
    .venv/bin/torchrun --nproc-per-node 2 examples/ddp_train.py --dist-backend gloo   # the same, over Gloo

An ordinary DDP script: nothing in it is specific to dlop. Once dlop is
installed, torch finds the backend "dlop" through its entry points, so the
only change from a Gloo script is the backend's name. The data is built in:
points around one centre per class (fixed seed), so the loss falls within a
few epochs and every run sees the same samples.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def synthetic_dataset(samples: int, features: int, classes: int, seed: int = 0) -> TensorDataset:
    """Points scattered around one random centre per class: learnable, and the same on every rank."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, features, generator=generator) * 0.3  # classes overlap: accuracy climbs over epochs
    labels = torch.randint(0, classes, (samples,), generator=generator)
    points = centres[labels] + torch.randn(samples, features, generator=generator)
    return TensorDataset(points, labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dist-backend", default="dlop", help="torch.distributed backend: dlop (default) or gloo")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128, help="per rank")
    parser.add_argument("--samples", type=int, default=32768)
    parser.add_argument("--lr", type=float, default=0.02)
    args = parser.parse_args()

    # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; env:// reads them.
    dist.init_process_group(backend=args.dist_backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # DDP broadcasts rank 0's weights anyway; this keeps runs repeatable

    features, classes = 64, 10
    dataset = synthetic_dataset(args.samples, features, classes)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = DDP(nn.Sequential(nn.Linear(features, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                              nn.Linear(512, classes)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    if rank == 0:
        print(f"backend {dist.get_backend()}, {world} ranks, {len(loader)} steps per epoch of {args.batch_size} per rank")
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        totals = torch.zeros(3)  # loss sum, correct, samples
        start = time.perf_counter()
        for points, labels in loader:
            optimizer.zero_grad()
            logits = model(points)
            loss = loss_fn(logits, labels)
            loss.backward()  # DDP all-reduces the gradients here, overlapped with the backward pass
            optimizer.step()
            totals += torch.tensor([loss.item() * len(labels), (logits.argmax(1) == labels).sum().item(), len(labels)])
        seconds = time.perf_counter() - start
        dist.all_reduce(totals)  # the whole epoch's figures, over every rank
        if rank == 0:
            print(f"epoch {epoch}: loss {totals[0] / totals[2]:.4f}  accuracy {totals[1] / totals[2]:.3f}  "
                  f"{totals[2] / seconds:.0f} samples/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
