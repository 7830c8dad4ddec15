"""Train a small 3D CNN on a video folder with DDP, its clips decoded and augmented by dlop-offloader daemons.

    dlop make-dataset --kind video /tmp/dlop-videos
    dlop-offloader --listen 127.0.0.1:7001 --token-file TOKEN --threads 1 &   # and more, anywhere
    DLOP_OFFLOAD_TOKEN=$(cat TOKEN) .venv/bin/torchrun --nproc-per-node 2 examples/offload_video_train.py \\
        --data /tmp/dlop-videos --offloaders 127.0.0.1:7001

Each sample is a clip of --frames frames at stride 2 from a random start,
its short side resized to a random size in [64, 80], a random 56x56 crop and
a flip drawn once for the whole clip, normalised, laid out C x T x H x W. The
daemons decode only from the keyframe before the clip. Each epoch prints the
loss and the samples/s of all ranks together.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def model_for(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv3d(3, 16, 3, stride=(1, 2, 2), padding=1), nn.ReLU(),
        nn.Conv3d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(32, classes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a video folder, one sub-folder per class, or a record file")
    parser.add_argument("--offloaders", default="", help="host:port,... of dlop-offloader daemons")
    parser.add_argument("--dist-backend", default="dlop")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4, help="per rank")
    parser.add_argument("--frames", type=int, default=8)
    args = parser.parse_args()

    from dlop.data import OffloadLoader

    dist.init_process_group(backend=args.dist_backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    spec = {"kind": "video", "frames": args.frames, "stride": 2, "short_side": [64, 80], "crop": 56, "hflip": 0.5,
            "normalize": {"mean": [0.45] * 3, "std": [0.225] * 3}, "output": "float32"}
    loader = OffloadLoader(args.data, spec, args.batch_size, shuffle=True, seed=0, drop_last=True,
                           offloaders=[a for a in args.offloaders.split(",") if a])
    classes = len(__import__("dlop._C", fromlist=["media"]).media.open_source(args.data, "video").classes)
    model = DDP(model_for(classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    if rank == 0:
        where = f"dlop offloaders {args.offloaders}" if loader.offloaded else "local workers"
        print(f"backend {dist.get_backend()}, {world} ranks, clips from {where}, {len(loader)} steps per epoch")
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        totals = torch.zeros(2)  # loss sum, samples
        start = time.perf_counter()
        for clips, labels in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(clips[:, 0]), labels)  # one view per clip: N x C x T x H x W
            loss.backward()
            optimizer.step()
            totals += torch.tensor([loss.item() * labels.numel(), labels.numel()])
        seconds = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(totals)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"epoch {epoch}: loss {totals[0] / totals[1]:.3f}, {totals[1] / seconds.item():.1f} clips/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
