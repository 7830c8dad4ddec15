"""Python benchmarks of dlop through torch.distributed.

- ``python -m dlop.bench.c10d``: collectives, dlop against Gloo in the same run
  (nccl-tests columns), under torchrun.
- ``python -m dlop.bench.ddp``: DDP training throughput and linearity, dlop
  against Gloo, on CPU.
- ``python -m dlop.bench.report``: their JSON files as markdown tables and PNG plots.
- ``python -m dlop.bench.linearity`` (``dlop report linearity``): a scaling
  model (scaling_model.py) whose terms are each calibrated from the benchmark
  that measures them (linearity_calibrate.py), checked against runs across
  namespace hosts (linearity_checks.py), predicting 16-1024 ranks.
- ``python -m dlop.bench.offload``: offloaded data loading against a local
  DataLoader (images), torchcodec and PyAV (``--kind video``), soundfile
  (``--kind audio``).
- ``python -m dlop.bench.train``: whole DDP steps with offloaded data against
  stock DDP, on this host or across namespace hosts (``--kind video``: clips).
"""
