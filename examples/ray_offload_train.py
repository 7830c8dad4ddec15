"""Ray Train with its input pipeline on dlop-offloader daemons that Ray starts, as actors, on its CPU nodes.

    pip install 'dlop[ray]' 'ray[train]'
    dlop make-dataset /shared/dlop-data                     # a folder every node reads
    python examples/ray_offload_train.py --data /shared/dlop-data --workers 2 --offloaders 2 --max 8

This driver joins the Ray cluster, hosts the fleet's c10d store, starts the
first offloaders (dlop.fleet.scaling.ray.RayActuator: one actor of
--offloader-cpus CPUs each, off this node where the cluster has room) and
runs the autoscaling controller, which grows and shrinks the fleet on the
trainers' data stall. Each Ray Train worker keeps a plain OffloadLoader: it
starts from the offloaders announced in the store and adds those that join
later between batches. Each epoch prints the loss and the samples/s.
"""

import argparse
import secrets
import tempfile
import time
from pathlib import Path

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def train_loop(config: dict) -> None:
    import torch
    from ray import train
    from ray.train.torch import prepare_model
    from torch import nn
    from torch.distributed import TCPStore

    from dlop.data import OffloadLoader
    from dlop.fleet import discovery
    from dlop.fleet.scaling.figures import Publisher

    host, port = config["store"].rsplit(":", 1)
    store = TCPStore(host, int(port), is_master=False)
    spec = {"ops": [{"op": "random_resized_crop", "size": 64}, {"op": "hflip", "p": 0.5},
                    {"op": "normalize", "mean": MEAN, "std": STD}], "output": "float32"}
    joined = discovery.discover(store)
    loader = OffloadLoader(config["data"], spec, config["batch_size"], shuffle=True, seed=0, drop_last=True,
                           offloaders=joined, token=config["token"])
    # The controller sizes the fleet on these figures (stall, step time, each offloader's busy fraction).
    Publisher(store, train.get_context().get_world_rank(), train.get_context().get_world_size(), loader.stats)
    model = prepare_model(nn.Sequential(nn.Conv2d(3, 16, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                        nn.Flatten(), nn.Linear(16, config["classes"])))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(config["epochs"]):
        start, samples, loss = time.perf_counter(), 0, torch.zeros(())
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            samples += len(y)
            for address in discovery.discover(store):  # offloaders the controller added join between batches
                if address not in joined:
                    loader.add_offloader(address, wait=False)
                    joined.append(address)
        rate = samples / (time.perf_counter() - start)
        if train.get_context().get_world_rank() == 0:
            print(f"epoch {epoch}: loss {loss.item():.3f}, {rate:.0f} samples/s on rank 0", flush=True)
        train.report({"epoch": epoch, "loss": loss.item(), "samples_per_s": rate})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--workers", type=int, default=2, help="Ray Train workers")
    p.add_argument("--offloaders", type=int, default=1, help="offloaders at first (--min)")
    p.add_argument("--max", type=int, default=8, help="offloaders at most")
    p.add_argument("--offloader-cpus", type=float, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--address", default=None, help="the Ray cluster (default: RAY_ADDRESS, else a Ray of this machine)")
    args = p.parse_args()

    import ray
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    from torch.distributed import TCPStore

    from dlop.fleet.scaling import policy
    from dlop.fleet.scaling.controller import Controller
    from dlop.fleet.scaling.ray import RayActuator

    ray.init(address=args.address)
    me = ray.util.get_node_ip_address()
    store = TCPStore(me, 0, is_master=True, wait_for_workers=False)
    token = secrets.token_hex(24)
    with tempfile.TemporaryDirectory(prefix="dlop-ray-") as folder:
        token_file = Path(folder) / "token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        actuator = RayActuator(store, token_file, num_cpus=args.offloader_cpus)
        actuator.scale(args.offloaders)
        controller = Controller(store, actuator, policy.Settings(min=args.offloaders, max=args.max)).start()
        try:
            trainer = TorchTrainer(train_loop, scaling_config=ScalingConfig(num_workers=args.workers),
                                   train_loop_config={"store": f"{me}:{store.port}", "token": token,
                                                      "data": args.data, "classes": args.classes,
                                                      "batch_size": args.batch_size, "epochs": args.epochs})
            trainer.fit()
        finally:
            controller.stop()
            actuator.close()


if __name__ == "__main__":
    main()
