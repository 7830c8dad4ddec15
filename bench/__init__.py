"""The benchmark lab: dlop measured against its peers, from a source tree (not part of the dlop package).

Run from the repository root (``python -m bench.NAME``; the ranks and hosts a
benchmark starts inherit that folder) with dlop installed. The lab imports
dlop; dlop never imports the lab. The benchmarks live in family folders;
COMMANDS below names the module each ``bench.NAME`` runs.

- collectives/: ``torchrun --nproc-per-node 2 -m bench.c10d``: collectives,
  dlop against Gloo in the same run (nccl-tests columns); ``-m bench.device``:
  accelerator tensors through the staged path; the C++ ``dlop-bench``
  (dlop-bench/, built by make build) and its MPI reference; the reduction
  kernels (micro/); the floor of a blocking exchange (exchange_floor.c).
- ddp/: ``python -m bench.ddp``: DDP training throughput and linearity, dlop
  against Gloo, on CPU; ``torchrun ... -m bench.ddp_overlap``: DDP's overlap
  of communication with the backward pass. ``dlop report FILE.json...`` turns
  these JSON files into markdown tables and PNG plots.
- linearity/: ``python -m bench.linearity``: calibrates the scaling model of
  dlop.report.scaling_model term by term (linearity_calibrate.py), checks it
  across namespace hosts (linearity_checks.py) and writes the linearity
  report, predicting 16-1024 ranks (``dlop report linearity --from-json``
  reports it again under other assumptions).
- offload/: ``python -m bench.offload``: offloaded data loading against a
  local DataLoader (images), torchcodec and PyAV (``--kind video``),
  soundfile (``--kind audio``); ``-m bench.offload_s3``: from an S3 store
  against webdataset; ``-m bench.pinned_pool``: the pinned batch pool.
- fleet/: ``python -m bench.autoscale``: an offloader fleet sized by
  dlop.fleet's controller against fleets sized by hand for the peak and the
  average, on namespace hosts, through a per-sample cost that changes mid-run.
- train/: ``python -m bench.train``: whole DDP steps with offloaded data
  against stock DDP, on this host or across namespace hosts (``--kind
  video``: clips; ``--device DEV``: one accelerator fed by offloaders).
- ft/: ``python -m bench.ft``: training under torchft through a replica
  group's death: recovery, healing and steady-state cost, dlop against
  torchft's Gloo wrapper (examples/torchft_ddp.py, 2 groups, a lighthouse).
- common/: what the benchmarks share: netns.py (hosts as network namespaces;
  ``python -m bench.netns``), forked.py (benchmarks run in a forked copy of a
  process that has imported torch), _common.py (sizes, headers, JSON),
  pack_results.py (a run folder as bench/results keeps it).
"""

import importlib.abc
import importlib.util
import sys

# Each command, ``python -m bench.NAME``, and the module it runs. A family
# folder named like its command (bench/ddp/) runs the module named here as its
# __main__; any other NAME is found here when no bench/NAME exists.
COMMANDS = {
    "c10d": "bench.collectives.c10d",
    "device": "bench.collectives.device",
    "multihost_allreduce": "bench.collectives.multihost_allreduce",
    "busy_cores": "bench.collectives.busy_cores",
    "idle_cpu": "bench.collectives.idle_cpu",
    "ddp": "bench.ddp.ddp",
    "ddp_overlap": "bench.ddp.ddp_overlap",
    "linearity": "bench.linearity.linearity",
    "offload": "bench.offload.offload",
    "offload_s3": "bench.offload.offload_s3",
    "pinned_pool": "bench.offload.pinned_pool",
    "autoscale": "bench.fleet.autoscale",
    "train": "bench.train.train",
    "train_rank": "bench.train.train_rank",
    "train_device_rank": "bench.train.train_device_rank",
    "netns": "bench.common.netns",
    "ft": "bench.ft.ft",
}


class _CommandFinder(importlib.abc.MetaPathFinder):
    """Consulted after the ordinary finders: ``bench.NAME`` (or ``bench.NAME.__main__`` for a family folder
    named NAME) loads COMMANDS[NAME]'s file under the name asked for, so ``python -m`` reports the command."""

    def find_spec(self, fullname, path=None, target=None):
        parts = fullname.split(".")
        if parts[0] != __name__ or len(parts) not in (2, 3) or parts[2:] not in ([], ["__main__"]):
            return None
        module = COMMANDS.get(parts[1])
        if module is None:
            return None
        return importlib.util.spec_from_file_location(fullname, importlib.util.find_spec(module).origin)


if not any(isinstance(f, _CommandFinder) for f in sys.meta_path):
    sys.meta_path.append(_CommandFinder())
