"""The persistent grid every Pallas kernel of this package launches (one CTA per SM), and the
2-CTA cluster helpers of the ring kernels."""

from __future__ import annotations

import jax
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

# Off a GPU (lowering for CUDA on a CPU host) the kernels assume an H100 / H200 SXM.
DEFAULT_SMS = 132


def persistent_ctas(num_sms: int | None, interpret) -> int:
  """CTAs of a persistent kernel: ``num_sms`` when a config sets it; 2 in the interpreter (it
  runs the grid sequentially, and a few "SMs" exercise the striding); else the device's SM
  count (``DEFAULT_SMS`` where the default device has none, e.g. a CPU host)."""
  if num_sms is not None:
    return num_sms
  if interpret:
    return 2
  return getattr(jax.devices()[0], "core_count", None) or DEFAULT_SMS


# 2-CTA clusters of the ring kernels (GemmConfig / DhConfig / WgradConfig.cluster_m): the
# cluster axis's name, the plgpu.kernel arguments, a CTA's rank and the ring's release barrier.
CLUSTER_AXIS = "cluster"


def cluster_kwargs(cluster_m: int) -> dict:
  """plgpu.kernel's cluster arguments for clusters of ``cluster_m`` CTAs (none for 1)."""
  return dict(cluster=(cluster_m,), cluster_names=(CLUSTER_AXIS,)) if cluster_m > 1 else {}


def cluster_rank(cluster_m: int):
  """This CTA's index in its cluster (inside the kernel body; 0 without clusters)."""
  return lax.axis_index(CLUSTER_AXIS) if cluster_m > 1 else 0


def multicasts(cluster_m: int, interpret) -> bool:
  """Whether the kernel shares operand tiles across its cluster by TMA multicast: not in the
  interpreter, which has no cluster barriers (there each CTA loads its own tiles)."""
  return cluster_m > 1 and not interpret


def release_barrier(num_arrivals: int, num_barriers: int, multicast: bool):
  """The ring's "empty" barriers: with multicast a slot is refilled by both CTAs' copies, so
  the consumers of every CTA of the cluster release it (a ClusterBarrier)."""
  if multicast:
    return plgpu.ClusterBarrier(collective_axes=(CLUSTER_AXIS,), num_arrivals=num_arrivals,
                                num_barriers=num_barriers)
  return plgpu.Barrier(num_arrivals=num_arrivals, num_barriers=num_barriers)
