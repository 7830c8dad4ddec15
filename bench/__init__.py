"""The benchmark lab: dlop measured against its peers, from a source tree (not part of the dlop package).

Run from the repository root (``python -m bench.NAME``; the ranks and hosts a
benchmark starts inherit that folder) with dlop installed. The lab imports
dlop; dlop never imports the lab.

- ``torchrun --nproc-per-node 2 -m bench.c10d``: collectives, dlop against
  Gloo in the same run (nccl-tests columns); ``-m bench.device``: accelerator
  tensors through the staged path; ``-m bench.ddp_overlap``: DDP's overlap of
  communication with the backward pass.
- ``python -m bench.ddp``: DDP training throughput and linearity, dlop
  against Gloo, on CPU. ``dlop report FILE.json...`` turns these JSON files
  into markdown tables and PNG plots.
- ``python -m bench.linearity``: calibrates the scaling model of
  dlop.report.scaling_model term by term (linearity_calibrate.py), checks it
  across namespace hosts (linearity_checks.py) and writes the linearity
  report, predicting 16-1024 ranks (``dlop report linearity --from-json``
  reports it again under other assumptions).
- ``python -m bench.offload``: offloaded data loading against a local
  DataLoader (images), torchcodec and PyAV (``--kind video``), soundfile
  (``--kind audio``); ``-m bench.offload_s3``: from an S3 store against
  webdataset.
- ``python -m bench.autoscale``: an offloader fleet sized by dlop.scaling's
  controller against fleets sized by hand for the peak and the average, on
  namespace hosts, through a per-sample cost that changes mid-run.
- ``python -m bench.train``: whole DDP steps with offloaded data against
  stock DDP, on this host or across namespace hosts (``--kind video``:
  clips; ``--device DEV``: one accelerator fed by offloaders).
- What the benchmarks share: netns.py (hosts as network namespaces;
  ``python -m bench.netns``), forked.py (benchmarks run in a forked copy of
  a process that has imported torch), _common.py (sizes, headers, JSON),
  offload_common.py (offloader daemons, timed passes).

The C++ benchmark ``dlop-bench`` is built from the .cpp files here (make build).
"""
