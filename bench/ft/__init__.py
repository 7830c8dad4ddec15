"""Fault tolerance: ``python -m bench.ft``, recovery under torchft, dlop against torchft's Gloo wrapper (ft.py).

replicas.py starts replica groups of examples/torchft_ddp.py with a
lighthouse and reads what their steps record; plain_ddp.py is the same
training without torchft, the steady-state reference.
"""
