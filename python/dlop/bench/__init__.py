"""Python benchmarks of dlop through torch.distributed.

- ``python -m dlop.bench.c10d``: collectives, dlop against Gloo in the same run
  (nccl-tests columns), under torchrun.
- ``python -m dlop.bench.ddp``: DDP training throughput and linearity, dlop
  against Gloo, on CPU.
- ``python -m dlop.bench.report``: their JSON files as markdown tables and PNG plots.
"""
