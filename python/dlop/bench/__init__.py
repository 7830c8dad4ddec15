"""Python benchmarks of dlop through torch.distributed.

- ``python -m dlop.bench.c10d``: collectives, dlop against Gloo in the same run
  (nccl-tests columns), under torchrun.
- ``python -m dlop.bench.ddp``: DDP training throughput and linearity, dlop
  against Gloo, on CPU.
- ``python -m dlop.bench.report``: their JSON files as markdown tables and PNG plots.
- ``python -m dlop.bench.linearity`` (``dlop report linearity``): DDP linearity
  at several rank counts (runs dlop.bench.ddp per N), with a scaling model
  (scaling_model.py) calibrated on the runs that predicts 16-1024 ranks.
"""
