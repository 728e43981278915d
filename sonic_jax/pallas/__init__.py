"""Pallas Mosaic GPU kernels for Hopper (sm_90a): one module per kernel family.

``backend.PallasKernels`` wires them into the kernel contract (``sonic_jax.kernels``). On a CPU,
``PallasKernels(interpret=True)`` runs them in the Mosaic GPU interpreter (tiny shapes only).
"""
