"""Collectives: c10d-level benchmarks against Gloo, the C++ dlop-bench against MPI and ucx_perftest, the reduction kernels."""
