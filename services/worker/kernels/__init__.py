"""Triton kernels for the worker: each op is its jit code, a host wrapper and a torch reference."""
