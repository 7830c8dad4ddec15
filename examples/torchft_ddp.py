"""torchft's DDP example (train_ddp.py) on CPU, with the backend to pick: dlop or Gloo.

One process per replica group, each started by its own launcher, and one
lighthouse for all (docs/fault_tolerance.md):

    torchft_lighthouse --min_replicas 1 --join_timeout_ms 10000 &
    for r in 0 1; do
      REPLICA_GROUP_ID=$r NUM_REPLICA_GROUPS=2 TORCHFT_LIGHTHOUSE=http://localhost:29510 \\
        torchrun --standalone --nproc-per-node=1 --max-restarts=3 examples/torchft_ddp.py --backend dlop &
    done

What differs from torchft's example, besides --backend: a seeded synthetic
data set instead of CIFAR-10 (no download), a smaller "useless" layer
(--useless-params), a fixed number of steps, a record of each step and of the
final weights, a fault to inject (--kill-at-step), and a comm hook that lets
the survivor of a failed all-reduce go on: torchft 0.2.0's own hook asserts
on the future of a failed all-reduce, with Gloo as with dlop.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from datetime import timedelta

import torch
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset
from torchft import DistributedDataParallel as TorchftDDP
from torchft import DistributedSampler, Manager, Optimizer
from torchft.checkpointing.pg_transport import PGTransport


def make_process_group(backend: str, timeout: timedelta):
    if backend == "gloo":
        from torchft import ProcessGroupGloo

        return ProcessGroupGloo(timeout=timeout)
    from dlop.c10d.torchft import ProcessGroupDlop

    return ProcessGroupDlop(timeout=timeout)


class DistributedDataParallel(TorchftDDP):
    """torchft's DDP, whose comm hook survives a failed all-reduce (the manager already discards the step)."""

    @staticmethod
    def _comm_hook(state, bucket):
        work = state.allreduce(bucket.buffer())
        work.wait()
        fut = work.get_future()
        fut = getattr(fut, "_fut", fut)  # a managed future, or a done one once the manager has errored
        if fut is None:
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
        return fut


class Net(nn.Module):
    def __init__(self, useless_params: int) -> None:
        super().__init__()
        self.cnn = nn.Sequential(
            nn.Conv2d(3, 6, 5), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2, 2)
        )
        final_dim = 10
        # As in torchft's example: a large layer, so that steps spend time communicating.
        self.useless = nn.Embedding(max(1, useless_params // final_dim), final_dim)
        self.classifier = nn.Sequential(
            nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, final_dim)
        )

    def forward(self, x):
        x = self.cnn(x)
        x = torch.flatten(x, 1)
        x = self.classifier(x)
        x += self.useless.weight[0]
        return x


def synthetic_dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    return TensorDataset(torch.randn(4096, 3, 32, 32, generator=generator),
                         torch.randint(0, 10, (4096,), generator=generator))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["dlop", "gloo"], default="dlop")
    parser.add_argument("--steps", type=int, default=100,
                        help="stop once the manager has committed this many, at a step every replica group took part in")
    parser.add_argument("--useless-params", type=int, default=2_000_000)
    parser.add_argument("--pg-timeout", type=float, default=10.0, help="seconds, of each collective")
    parser.add_argument("--record", help="append one JSON line per step (and per fault) to this file")
    parser.add_argument("--out", help="save the final weights to OUT/replica_<id>.pt")
    parser.add_argument("--kill-at-step", type=int, default=-1,
                        help="replica --kill-replica SIGKILLs itself in the backward pass of this step, "
                             "in its launcher's first attempt only")
    parser.add_argument("--kill-replica", type=int, default=1)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    replica = int(os.environ.get("REPLICA_GROUP_ID", 0))
    num_replica_groups = int(os.environ.get("NUM_REPLICA_GROUPS", 2))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    log = open(args.record, "a") if args.record else None

    def record(**fields) -> None:
        if log:
            log.write(json.dumps({"replica": replica, "attempt": attempt, "t": time.time(), **fields}) + "\n")
            log.flush()

    record(event="start")
    torch.manual_seed(0)
    trainset = synthetic_dataset()
    sampler = DistributedSampler(trainset, replica_rank=replica, num_replica_groups=num_replica_groups,
                                 group_rank=0, num_replicas=1, shuffle=True, seed=0)
    trainloader = DataLoader(trainset, batch_size=64, num_workers=0, sampler=sampler)

    def load_state_dict(state_dict):
        m.load_state_dict(state_dict["model"])
        optimizer.load_state_dict(state_dict["optim"])

    def state_dict():
        return {"model": m.state_dict(), "optim": optimizer.state_dict()}

    pg = make_process_group(args.backend, timedelta(seconds=args.pg_timeout))
    transport = PGTransport(pg, timeout=timedelta(seconds=30), device=torch.device("cpu"))
    manager = Manager(pg=pg, min_replica_size=1, load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id=f"train_ddp_{replica}", timeout=timedelta(seconds=30),
                      checkpoint_transport=transport)
    m = DistributedDataParallel(manager, Net(args.useless_params))
    optimizer = Optimizer(manager, optim.AdamW(m.parameters()))
    criterion = nn.CrossEntropyLoss()

    def die(grad):
        record(event="kill", step=manager.current_step())
        os.kill(os.getpid(), signal.SIGKILL)
        return grad

    while True:
        for inputs, labels in trainloader:
            started = time.time()
            optimizer.zero_grad()
            loss = criterion(m(inputs), labels)
            if attempt == 0 and replica == args.kill_replica and manager.current_step() == args.kill_at_step:
                # In the backward pass: the peer's gradient all-reduce is in flight.
                m.module.classifier[0].weight.register_hook(die)
            loss.backward()
            step = manager.current_step()
            optimizer.step()
            record(event="step", step=step, started=started, committed=manager.current_step() > step,
                   participants=manager.num_participants(), loss=loss.item())
            # Every group ends at the same step, with the same weights: a survivor
            # past --steps goes on until the replacement has rejoined.
            if manager.current_step() >= args.steps and manager.num_participants() >= num_replica_groups:
                if args.out:
                    torch.save(m.module.state_dict(), os.path.join(args.out, f"replica_{replica}.pt"))
                manager.shutdown(wait=False)
                return


if __name__ == "__main__":
    main()
