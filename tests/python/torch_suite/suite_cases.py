"""The test class that runs torch's DistributedTest._DistTestBase on one backend.

torch's distributed_test reads BACKEND, WORLD_SIZE and its timeout variables
when it is imported, and its skip decorators look at them then: run_suite sets
the environment before the first import. TORCH_SUITE_BACKEND chooses:

- "gloo": the reference;
- "dlop": dlop as a plug-in, as torch documents it (the suite then skips the
  many tests it gates on the names "gloo"/"nccl");
- "dlop-as-gloo": the suite believes it runs Gloo (BACKEND=gloo: every Gloo
  test is selected and takes Gloo's branches) while each rank's default
  process group, and the groups made from it, are dlop. This is the strict
  comparison: dlop must pass what Gloo passes, test for test.
"""

import os
from datetime import timedelta

import torch
import torch.distributed as dist

import dlop  # noqa: F401  (registers backend "dlop")
from torch.testing._internal.common_distributed import DistTestCases

SUITE_BACKEND = os.environ["TORCH_SUITE_BACKEND"]

if SUITE_BACKEND == "dlop":
    # Features the suite only exercises for backends it knows by name.
    DistTestCases.backend_feature["ddp"].add("dlop")
    DistTestCases.backend_feature["subgroup"].add("dlop")
    DistTestCases.backend_feature["plugin"].add("dlop")

# Imported only now: its skip decorators read DistTestCases and BACKEND.
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


def _default_groups_on_dlop() -> None:
    """In this rank, init_process_group(backend="gloo") makes a dlop group, and
    dist.monitored_barrier runs on dlop's groups."""
    gloo_init = dist.init_process_group

    def init_on_dlop(*args, **kwargs):
        if kwargs.get("backend") == "gloo":
            kwargs["backend"] = "dlop"
        elif args[:1] == ("gloo",):
            args = ("dlop",) + args[1:]
        return gloo_init(*args, **kwargs)

    dist.init_process_group = init_on_dlop

    def monitored_barrier_on_dlop(group=None, timeout=None, wait_all_ranks=False):
        # torch's dist.monitored_barrier admits only Gloo by name; the
        # ProcessGroup method it then calls is the backend's, dlop's here.
        if group is dist.GroupMember.NON_GROUP_MEMBER:
            return None
        if timeout is None:
            timeout = dist.default_pg_timeout
        elif isinstance(timeout, (int, float)):
            timeout = timedelta(seconds=timeout)
        pg = dist.group.WORLD if group is None else group
        return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    dist.monitored_barrier = monitored_barrier_on_dlop


class TestTorchSuite(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        # Forked ranks start at once; spawned ones import torch and this
        # suite again, about 20 s per test on this 2-core machine. The parent
        # never creates a process group, so nothing of dlop's is forked.
        if os.environ.get("TORCH_SUITE_START", "fork") == "spawn":
            self._spawn_processes()
        else:
            self._start_processes(torch.multiprocessing.get_context("fork").Process)

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, **kwargs):
        # Two cores, several ranks: one intra-op thread per rank.
        torch.set_num_threads(1)
        if SUITE_BACKEND == "dlop-as-gloo":
            _default_groups_on_dlop()
        super()._run(rank, test_name, file_name, pipe, **kwargs)
