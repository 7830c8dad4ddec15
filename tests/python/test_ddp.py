"""DDP trains with backend "dlop" exactly as with Gloo.

Each rank trains the same seeded model twice per case, once with DDP over the
dlop default group and once over a Gloo group of the same ranks, on the same
per-rank data; the parent compares the final parameters of the two runs (and
checks that training moved them, and that the ranks agree). One spawn of the
ranks runs every case, because starting ranks costs more than the training.
"""

from __future__ import annotations

import pytest
import torch

from training_ranks import run_ranks

STEPS = 20
# Small buckets: several all-reduces per step, and buckets that finish out of order.
BUCKET_CAP_MB = 0.002


class Net(torch.nn.Module):
    """An MLP with a batch norm (its buffers are broadcast each step) and a
    head that is only used on even steps when `sometimes_unused`."""

    def __init__(self, sometimes_unused: bool = False):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU()
        )
        self.head = torch.nn.Linear(32, 4)
        self.extra_head = torch.nn.Linear(32, 4)
        self.sometimes_unused = sometimes_unused

    def forward(self, x, step: int):
        h = self.body(x)
        out = self.head(h)
        if not self.sometimes_unused or step % 2 == 0:
            out = out + self.extra_head(h)
        return out


def _batch(rank: int, step: int, micro: int = 0):
    g = torch.Generator().manual_seed(1000 * rank + 10 * step + micro)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def _hook_for(case: str, group):
    from bench.ddp.ddp import make_hook

    return make_hook({"fp16_hook": "fp16", "bf16_hook": "bf16"}.get(case, case), group)


def _train(case: str, rank: int, group) -> dict[str, torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(
        Net(sometimes_unused=case == "find_unused"),
        process_group=group,
        # PowerSGD's hook issues collectives from future callbacks while the
        # backward pass issues the next buckets' all-reduces: with several
        # buckets the order in which a rank issues them is a race, and any
        # backend that matches collectives by order (Gloo's tags, dlop's
        # sequence) can pair different ones: Gloo itself aborts here with
        # "Received data size doesn't match expected size" when the buckets
        # are small. One bucket keeps it deterministic.
        bucket_cap_mb=25 if case == "powersgd" else BUCKET_CAP_MB,
        find_unused_parameters=case == "find_unused",
    )
    hook = _hook_for(case, group)
    if hook is not None:
        model.register_comm_hook(*hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad()
        if case == "no_sync":
            # Two accumulated micro-batches without communication, the third syncs.
            with model.no_sync():
                for micro in range(2):
                    x, y = _batch(rank, step, micro)
                    torch.nn.functional.mse_loss(model(x, step), y).backward()
            x, y = _batch(rank, step, 2)
        else:
            x, y = _batch(rank, step)
        torch.nn.functional.mse_loss(model(x, step), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.module.state_dict().items()}


CASES = ["plain", "find_unused", "no_sync", "fp16_hook", "bf16_hook", "powersgd"]
CASES_3_RANKS = ["plain", "find_unused", "fp16_hook"]


def _train_all(cases):
    def run(rank, world_size, dlop_group, gloo_group):
        import torch.distributed as dist

        # The comparison means something only if each run used the backend it names.
        assert (dist.get_backend(dlop_group), dist.get_backend(gloo_group)) == ("dlop", "gloo")
        return {case: {"dlop": _train(case, rank, dlop_group), "gloo": _train(case, rank, gloo_group)} for case in cases}

    return run


def _ranks_2(rank, world_size, dlop_group, gloo_group):
    return _train_all(CASES)(rank, world_size, dlop_group, gloo_group)


def _ranks_3(rank, world_size, dlop_group, gloo_group):
    return _train_all(CASES_3_RANKS)(rank, world_size, dlop_group, gloo_group)


@pytest.fixture(scope="module")
def trained_2(tmp_path_factory):
    return run_ranks(_ranks_2, 2, tmp_path_factory.mktemp("ddp2"))


@pytest.fixture(scope="module")
def trained_3(tmp_path_factory):
    return run_ranks(_ranks_3, 3, tmp_path_factory.mktemp("ddp3"))


def _initial_state(case: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return Net(sometimes_unused=case == "find_unused").state_dict()


def _check_same_training(results: list, case: str, tolerance: dict) -> None:
    initial = _initial_state(case)
    for rank, by_case in enumerate(results):
        dlop_state, gloo_state = by_case[case]["dlop"], by_case[case]["gloo"]
        for name, gloo_value in gloo_state.items():
            torch.testing.assert_close(
                dlop_state[name], gloo_value, **tolerance, msg=lambda m: f"rank {rank}, {case}, {name}: {m}"
            )
        # DDP keeps the parameters identical on every rank (not the batch norm's
        # running statistics: the last forward updates them from local data).
        for name, _ in Net().named_parameters():
            torch.testing.assert_close(
                dlop_state[name], results[0][case]["dlop"][name], **tolerance, msg=lambda m: f"rank {rank} vs 0: {m}"
            )
    moved = [n for n, v in results[0][case]["dlop"].items() if v.is_floating_point() and not torch.equal(v, initial[n])]
    assert "head.weight" in moved and "body.0.weight" in moved, f"{case}: training did not change {sorted(initial)}"


# float32 with sums in another order; the half-precision hooks round the
# gradient once more, so a different summation order shows more.
FLOAT32 = {"rtol": 1e-5, "atol": 1e-5}
HALF = {"rtol": 1e-3, "atol": 1e-3}


@pytest.mark.timeout(400)
@pytest.mark.parametrize("case", CASES)
def test_ddp_two_ranks_dlop_trains_as_gloo(trained_2, case):
    _check_same_training(trained_2, case, HALF if "16" in case or case == "powersgd" else FLOAT32)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("case", CASES_3_RANKS)
def test_ddp_three_ranks_dlop_trains_as_gloo(trained_3, case):
    _check_same_training(trained_3, case, HALF if "16" in case else FLOAT32)
