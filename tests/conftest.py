"""Test setup: 8 host CPU devices for sharding tests, and the `gpu` marker skip."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import pytest  # noqa: E402


def _has_hopper() -> bool:
  try:
    dev = jax.devices()[0]
  except RuntimeError:
    return False
  return dev.platform == "gpu" and getattr(dev, "compute_capability", "") == "9.0"


def pytest_collection_modifyitems(config, items):
  if _has_hopper():
    return
  skip = pytest.mark.skip(reason="needs an NVIDIA Hopper GPU")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)
