"""A backend that takes each kernel entry point from the backend named for it.

Every backend implements the same eight entry points with the same meaning (``kernels.py``),
so one layer step can run, say, the ``pallas`` forward and dh with the ``ffi`` dx_pairs and
dW1. That is how a per-kernel comparison of two backends (``benchmarks/kernel_profile.py``)
becomes a faster step where each backend wins some kernels::

    from sonic_jax.ffi.backend import FfiKernels
    from sonic_jax.pallas.backend import PallasKernels
    k = MixedKernels(PallasKernels(), dx_pairs=FfiKernels(), dw1=FfiKernels())
    out = sonic_jax.moe(x, router_w, w1, w2, top_k=8, backend=k)

Each backend keeps its own gathers: an entry point that needs gathered rows makes them itself
(XLA's CSE shares a gather only between entry points of one backend, as within that backend).
The backward's order for peak memory (``ExpertKernels.dw1_last``) is the base backend's.
"""

from __future__ import annotations

from sonic_jax.kernels import ExpertKernels

ENTRY_POINTS = ("up_proj", "down_proj", "combine", "dh", "dw2", "dx_pairs", "dw1")


class MixedKernels(ExpertKernels):
  """``base`` for every entry point except those given as keyword arguments.

  Args:
    base: the backend of the entry points not named.
    name: what ``.name`` says (default "mixed"; ``backends.COMBINED``'s entries use their name).
    **overrides: entry point name (one of ENTRY_POINTS) -> the ExpertKernels that runs it.
  """

  name = "mixed"

  def __init__(self, base: ExpertKernels, *, name: str = "mixed", **overrides: ExpertKernels):
    if not isinstance(base, ExpertKernels):
      raise ValueError(f"base must be an ExpertKernels instance, got {type(base).__name__}")
    for entry, kern in overrides.items():
      if entry not in ENTRY_POINTS:
        raise ValueError(f"unknown entry point {entry!r}: MixedKernels takes {ENTRY_POINTS}")
      if not isinstance(kern, ExpertKernels) or isinstance(kern, MixedKernels):
        raise ValueError(f"{entry} must be a (non-mixed) ExpertKernels instance, got "
                         f"{type(kern).__name__}")
    if isinstance(base, MixedKernels):
      overrides = {**base.overrides, **overrides}
      base = base.base
    self.base = base
    # Entry points that name the base backend are the base's: one spelling per configuration.
    self.overrides = {k: v for k, v in sorted(overrides.items()) if v != base}
    self.dw1_last = base.dw1_last
    self.name = name

  def backend_of(self, entry: str) -> ExpertKernels:
    """The backend that runs ``entry``."""
    if entry not in ENTRY_POINTS:
      raise ValueError(f"unknown entry point {entry!r}: one of {ENTRY_POINTS}")
    return self.overrides.get(entry, self.base)

  def _key(self):
    return (self.base, tuple(self.overrides.items()))

  # Value semantics, as the other backends: the custom_vjp block is cached per instance.
  def __hash__(self):
    return hash((type(self), self._key()))

  def __eq__(self, other):
    return type(other) is type(self) and other._key() == self._key()

  def __repr__(self):
    parts = [repr(self.base)] + ([f"name={self.name!r}"] if self.name != "mixed" else []) + [
        f"{k}={v!r}" for k, v in self.overrides.items()]
    return f"MixedKernels({', '.join(parts)})"

  def validate(self, x, plan, w1, w2) -> None:
    self.validate_entries(x, plan, w1, w2, ENTRY_POINTS)

  def validate_entries(self, x, plan, w1, w2, entries) -> None:
    # Each backend checks only the entry points it runs: e.g. pallas' dh cannot tile n = 160,
    # which is no reason to reject "pallas+ffi", whose dh is ffi's.
    served: dict[ExpertKernels, list[str]] = {}
    for entry in ENTRY_POINTS:
      if entry in entries:
        served.setdefault(self.backend_of(entry), []).append(entry)
    for kern, its_entries in served.items():
      kern.validate_entries(x, plan, w1, w2, tuple(its_entries))

  def up_proj(self, x, w1, plan, *, inference=False):
    return self.backend_of("up_proj").up_proj(x, w1, plan, inference=inference)

  def down_proj(self, a, w2, plan):
    return self.backend_of("down_proj").down_proj(a, w2, plan)

  def combine(self, y, plan, scores, out_dtype):
    return self.backend_of("combine").combine(y, plan, scores, out_dtype)

  def combine_add(self, y, plan, addend, out_dtype):
    return self.backend_of("combine").combine_add(y, plan, addend, out_dtype)

  def dh(self, dout, w2, h, scores_grouped, plan):
    return self.backend_of("dh").dh(dout, w2, h, scores_grouped, plan)

  def dw2(self, dout, a_prime, plan):
    return self.backend_of("dw2").dw2(dout, a_prime, plan)

  def dx_pairs(self, dh, w1, plan):
    return self.backend_of("dx_pairs").dx_pairs(dh, w1, plan)

  def dw1(self, x, dh, plan):
    return self.backend_of("dw1").dw1(x, dh, plan)
