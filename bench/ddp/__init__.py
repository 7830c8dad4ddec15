"""DDP: training throughput and linearity on CPU, and the overlap of communication with the backward pass."""
