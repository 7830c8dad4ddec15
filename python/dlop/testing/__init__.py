"""Test infrastructure for code built on dlop.

:mod:`dlop.testing.accelerator` registers ``dlop_test``, an accelerator on
host memory with real streams and events, for testing device-generic code
without a GPU (docs/test_accelerator.md).
"""
