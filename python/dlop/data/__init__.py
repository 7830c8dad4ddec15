"""dlop.data: offloaded data loading.

So far: the built-in synthetic dataset (``dlop.data.make_dataset``). The
native pipeline itself is in ``dlop._C.offload``.
"""
