"""The same training as examples/torchft_ddp.py without torchft: torch's DDP over one group of all ranks.

torchrun --nproc-per-node 2 bench/ft/plain_ddp.py --backend dlop --steps 20 --record steps.jsonl
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn, optim
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchft_ddp.py"


def _example():
    spec = importlib.util.spec_from_file_location("torchft_ddp_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["dlop", "gloo"], default="dlop")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--useless-params", type=int, default=2_000_000)
    parser.add_argument("--record", required=True)
    args = parser.parse_args()
    if args.backend == "dlop":
        import dlop  # noqa: F401  (registers the backend)
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    example = _example()
    torch.manual_seed(0)
    trainset = example.synthetic_dataset()
    loader = DataLoader(trainset, batch_size=64, sampler=DistributedSampler(trainset, shuffle=True, seed=0))
    # As torchft's DDP: buckets never rebuilt (find_unused_parameters).
    m = DistributedDataParallel(example.Net(args.useless_params), find_unused_parameters=True)
    optimizer = optim.AdamW(m.parameters())
    criterion = nn.CrossEntropyLoss()
    log = open(args.record, "a")
    step = 0
    while step < args.steps:
        for inputs, labels in loader:
            started = time.time()
            optimizer.zero_grad()
            criterion(m(inputs), labels).backward()
            optimizer.step()
            log.write(json.dumps({"replica": rank, "attempt": 0, "event": "step", "step": step, "started": started,
                                  "t": time.time(), "committed": True, "participants": dist.get_world_size()}) + "\n")
            log.flush()
            step += 1
            if step >= args.steps:
                break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
