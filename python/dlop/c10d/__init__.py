"""dlop.c10d: the ``torch.distributed`` backend ``"dlop"``.

``backend`` registers it (``import dlop`` does, and torch's entry points do
for scripts that never import dlop) and reads mpirun's or SLURM's rank and
size for :func:`dlop.init`; ``device`` attaches accelerator tensors to it;
``shared_device`` lets ranks on one host share a device's memory.
"""
