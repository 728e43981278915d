"""Tests of the ``ffi`` backend (CUTLASS / CUDA kernels through the XLA FFI).

CPU: availability reporting, the BackendUnavailableError path, argument validation, and that the
Python side agrees with csrc/ (GEMM kinds and tile schedules, handler symbols and their
command-buffer trait, CMake switch). GPU (@pytest.mark.gpu): every entry point against XlaKernels
on several routings, every compiled tile schedule, the bf16-H SwiGLU error, and the whole layer
forward+backward, also inside XLA command buffers (CUDA graphs).
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

import sonic_jax
from sonic_jax import ffi
from sonic_jax.ffi import _lib, ops, schedules
from sonic_jax.ffi.backend import GATHER_SCHEDULE_CONFIGS, FfiKernels
from sonic_jax.ffi.ops import GemmKind
from sonic_jax.ffi.schedules import GemmConfig
from sonic_jax.mixed import MixedKernels
from sonic_jax.pallas.backend import PallasKernels
from sonic_jax.routing import RoutingPlan, TokenRounding, route_logits
from sonic_jax.xla_backend import XlaKernels

CSRC = pathlib.Path(__file__).resolve().parent.parent / "csrc"


def _on_gpu() -> bool:
  try:
    return jax.devices()[0].platform == "gpu"
  except RuntimeError:
    return False


# ---------------------------------------------------------------- CPU: availability and errors


def test_unavailable_reason_names_each_missing_piece():
  reason = ffi.unavailable_reason()
  if _lib.find_library() is None:
    assert reason is not None and "is not built" in reason
    assert "python -m sonic_jax.ffi.build" in reason
  if not _on_gpu():
    assert reason is not None and "no NVIDIA GPU" in reason and "'cpu'" in reason
    assert not ffi.is_available()


def test_unavailable_reason_for_a_bad_library_path(monkeypatch, tmp_path):
  missing = tmp_path / "nowhere" / _lib.LIBRARY_NAME
  monkeypatch.setenv(_lib.ENV_LIBRARY, str(missing))
  _lib._load.cache_clear()
  try:
    assert f"{_lib.ENV_LIBRARY}={missing} does not exist" in ffi.unavailable_reason()
    assert not ffi.is_available()
  finally:
    monkeypatch.undo()
    _lib._load.cache_clear()


def test_unavailable_reason_for_a_library_that_fails_to_load(monkeypatch, tmp_path):
  bogus = tmp_path / _lib.LIBRARY_NAME
  bogus.write_bytes(b"not an ELF file")
  monkeypatch.setenv(_lib.ENV_LIBRARY, str(bogus))
  _lib._load.cache_clear()
  try:
    assert "failed to load" in ffi.unavailable_reason()
  finally:
    monkeypatch.undo()
    _lib._load.cache_clear()


@pytest.mark.skipif(_on_gpu(), reason="checks the CPU error path")
def test_moe_backend_ffi_raises_with_the_reason():
  key = jax.random.key(0)
  kx, kr, k1, k2 = jax.random.split(key, 4)
  t, d, n, e = 16, 32, 16, 4
  x = jax.random.normal(kx, (t, d), jnp.bfloat16)
  router_w = jax.random.normal(kr, (d, e), jnp.float32).astype(jnp.bfloat16)
  w1 = jax.random.normal(k1, (e, d, 2 * n), jnp.bfloat16)
  w2 = jax.random.normal(k2, (e, n, d), jnp.bfloat16)
  reason = ffi.unavailable_reason()
  with pytest.raises(sonic_jax.BackendUnavailableError) as info:
    sonic_jax.moe(x, router_w, w1, w2, top_k=2, backend="ffi")
  assert "backend='ffi' is not available" in str(info.value)
  assert reason in str(info.value)
  assert "ffi" not in sonic_jax.available_backends()


def _plan(t=16, e=4, k=2):
  logits = jax.random.normal(jax.random.key(1), (t, e), jnp.float32)
  return route_logits(logits, top_k=k)


@pytest.mark.parametrize("bad, match", [
    (dict(dtype=jnp.float32), "needs bf16 operands: x has dtype float32"),
    (dict(d=12), "d \\(x.shape\\[1\\]\\) to be a multiple of 8, got 12"),
    (dict(n=12), "n \\(w2.shape\\[1\\]\\) to be a multiple of 8, got 12"),
])
def test_validate_rejects_what_the_kernels_cannot_tile(bad, match):
  d, n, e = bad.get("d", 32), bad.get("n", 16), 4
  x = jnp.zeros((16, d), bad.get("dtype", jnp.bfloat16))
  w1 = jnp.zeros((e, d, 2 * n), jnp.bfloat16)
  w2 = jnp.zeros((e, n, d), jnp.bfloat16)
  with pytest.raises(ValueError, match=match):
    FfiKernels().validate(x, _plan(e=e), w1, w2)


def test_validate_accepts_aligned_bf16():
  x = jnp.zeros((16, 32), jnp.bfloat16)
  FfiKernels().validate(x, _plan(), jnp.zeros((4, 32, 32), jnp.bfloat16),
                        jnp.zeros((4, 16, 32), jnp.bfloat16))


def test_gemm_kinds_match_the_header():
  text = (CSRC / "sonic_ffi.h").read_text()
  enum = dict(re.findall(r"\bk(VarlenM\w+|VarlenK\w+) = (\d+)", text))
  want = {"VarlenMNNF32": GemmKind.VARLEN_M_NN_F32, "VarlenMNNBf16": GemmKind.VARLEN_M_NN_BF16,
          "VarlenMNTF32": GemmKind.VARLEN_M_NT_F32, "VarlenMNTBf16": GemmKind.VARLEN_M_NT_BF16,
          "VarlenKF32": GemmKind.VARLEN_K_F32, "VarlenKBf16": GemmKind.VARLEN_K_BF16,
          "VarlenMGatherNNBf16": GemmKind.VARLEN_M_GATHER_NN_BF16,
          "VarlenMGatherNTF32": GemmKind.VARLEN_M_GATHER_NT_F32,
          "VarlenMGatherSwiGLU": GemmKind.VARLEN_M_GATHER_SWIGLU,
          "VarlenMGatherDSwiGLU": GemmKind.VARLEN_M_GATHER_DSWIGLU,
          "VarlenKGatherBf16": GemmKind.VARLEN_K_GATHER_BF16}
  assert {k: int(v) for k, v in enum.items()} == {k: int(v) for k, v in want.items()}
  assert re.search(r"kNumKinds = (\d+)", text).group(1) == str(len(GemmKind))
  # C++ is_gather_kind and Python GATHER_KINDS name the same kinds.
  body = re.search(r"bool is_gather_kind\(GemmKind k\) \{([^}]*)\}", text).group(1)
  assert set(re.findall(r"GemmKind::k(\w+)", body)) == {
      k for k, v in want.items() if v in schedules.GATHER_KINDS}
  body = re.search(r"bool is_fused_epilogue_kind\(GemmKind k\) \{([^}]*)\}", text).group(1)
  assert set(re.findall(r"GemmKind::k(\w+)", body)) == {
      k for k, v in want.items() if v in schedules.FUSED_EPILOGUE_KINDS}


def test_gemm_configs_match_the_header_and_the_instantiations():
  text = (CSRC / "sonic_ffi.h").read_text()
  enum = dict(re.findall(r"\bk((?:Pingpong|Cooperative|Gather|Tma)\w+) = (\d+)", text))
  assert {k: int(v) for k, v in enum.items()} == {
      "Pingpong128x128C2x1": GemmConfig.PINGPONG_128x128_C2x1,
      "Cooperative128x256C2x1": GemmConfig.COOPERATIVE_128x256_C2x1,
      "Cooperative256x128C2x1": GemmConfig.COOPERATIVE_256x128_C2x1,
      "Cooperative128x256C1x2": GemmConfig.COOPERATIVE_128x256_C1x2,
      "GatherCoop128x128": GemmConfig.GATHER_COOP_128x128,
      "GatherCoop128x256": GemmConfig.GATHER_COOP_128x256,
      "GatherTmaB128x256C2x1": GemmConfig.GATHER_TMA_B_128x256_C2x1,
      "GatherNoinc128x256": GemmConfig.GATHER_NOINC_128x256,
      "GatherTma256x128C2x1": GemmConfig.GATHER_TMA_256x128_C2x1,
      "GatherTma256x128C1": GemmConfig.GATHER_TMA_256x128_C1,
      "Cooperative128x256C2x2": GemmConfig.COOPERATIVE_128x256_C2x2,
      "Cooperative128x256C1x1": GemmConfig.COOPERATIVE_128x256_C1x1,
      "Pingpong64x256C2x1": GemmConfig.PINGPONG_64x256_C2x1,
      "GatherTmaB128x256C1": GemmConfig.GATHER_TMA_B_128x256_C1,
      "TmaAB128x256C1": GemmConfig.TMA_AB_128x256_C1,
      "GatherPingpong64x256C2x1": GemmConfig.GATHER_PINGPONG_64x256_C2x1,
      "GatherPingpong64x256C1": GemmConfig.GATHER_PINGPONG_64x256_C1,
      "TmaABPingpong64x256C1": GemmConfig.TMA_AB_PINGPONG_64x256_C1,
      "Pingpong128x128C1x1": GemmConfig.PINGPONG_128x128_C1x1,
      "Pingpong64x256C1x1": GemmConfig.PINGPONG_64x256_C1x1}
  assert re.search(r"kNumConfigs = (\d+)", text).group(1) == str(len(GemmConfig))
  # Each TU's dispatch switch lists exactly the configs schedules.INSTANTIATED promises.
  names = {c.value: c.name.replace("_", "").lower() for c in GemmConfig}
  def cases(path, start=None):
    body = (CSRC / path).read_text()
    if start is not None:  # one dispatch function of a TU that has several
      body = body[body.index(start):]
      body = body[:body.index("default:")]
    return re.findall(r"case (\d+): fn\(\w+<(?:\w+, )?(\w+)>", body)
  for path, start, kind in (
      ("gemm_varlen_m_nn.cu", None, GemmKind.VARLEN_M_NN_BF16),
      ("gemm_varlen_m_nt_f32.cu", None, GemmKind.VARLEN_M_NT_F32),
      ("gemm_varlen_m_nt_bf16.cu", None, GemmKind.VARLEN_M_NT_BF16),
      # One switch serves both outputs (templated on the output type), a second one bf16 only.
      ("gemm_varlen_k.cu", "dispatch_k(int config", GemmKind.VARLEN_K_F32),
      ("gemm_varlen_k.cu", None, GemmKind.VARLEN_K_BF16),
      # One switch in gather_gemm.cuh serves the gathered and the fused-epilogue kinds
      # (templated on the kind's launcher).
      ("gather_gemm.cuh", "dispatch_config(int", GemmKind.VARLEN_M_GATHER_NN_BF16),
      ("gather_gemm.cuh", "dispatch_config(int", GemmKind.VARLEN_M_GATHER_NT_F32),
      ("gather_gemm.cuh", "dispatch_config(int", GemmKind.VARLEN_M_GATHER_SWIGLU),
      ("gather_gemm.cuh", "dispatch_config(int", GemmKind.VARLEN_M_GATHER_DSWIGLU)):
    got = [(int(i), name.lower()) for i, name in cases(path, start)]
    want = [(int(c), names[c.value]) for c in schedules.INSTANTIATED[kind]
            if not (kind == GemmKind.VARLEN_M_GATHER_SWIGLU
                    and c in schedules.SWIGLU_IN_ORDER_CONFIGS)]
    assert got == want, (path, kind, got, want)
  # ... and the SwiGLU kind's in-order configs by gemm_varlen_m_swiglu.cu's dispatch_swiglu.
  body = (CSRC / "gemm_varlen_m_swiglu.cu").read_text()
  body = body[body.index("dispatch_swiglu(int"):body.index("return dispatch_config<SwigluNN>")]
  got = re.findall(r"config == static_cast<int>\(GemmConfig::k(\w+)\)\) \{\s*"
                   r"fn\(SwigluNN<gather::(\w+)>", body)
  assert [(a.lower(), b.lower()) for a, b in got] == [
      (names[c.value], names[c.value]) for c in schedules.SWIGLU_IN_ORDER_CONFIGS], got
  # The gathered varlen-K TU builds one schedule, not through a case switch.
  body = (CSRC / "gemm_varlen_k_gather.cu").read_text()
  switch = body[body.index("switch (config)"):body.index("default:")]
  got = {int(case): set(re.findall(r"(?:WgradBf16|dispatch_tma_side)<gather::(\w+)\W", text))
         for case, text in re.findall(r"case (\d):(.*?)(?=case \d:|$)", switch, re.S)}
  got = {case: {name.lower() for name in found} for case, found in got.items()}
  assert got == {int(c): {names[c.value]}
                 for c in schedules.INSTANTIATED[GemmKind.VARLEN_K_GATHER_BF16]}, got
  # Every default and measured pick is instantiated.
  for kind, cfg in schedules.DEFAULT.items():
    assert cfg in schedules.INSTANTIATED[kind]
  for (kind, _, _), cfg in schedules.MEASURED.items():
    assert cfg in schedules.INSTANTIATED[kind]


def test_schedule_check_rejects_configs_that_are_not_built():
  with pytest.raises(ValueError, match="config must be one of .* for VARLEN_K_F32, got 1"):
    schedules.check(GemmKind.VARLEN_K_F32, 1)
  assert schedules.check(GemmKind.VARLEN_M_NT_F32, 2) == GemmConfig.COOPERATIVE_256x128_C2x1


def test_every_gemm_translation_unit_is_built():
  text = (CSRC / "CMakeLists.txt").read_text()
  listed = set(re.findall(r"\b(\w+\.cu)\b", text))
  assert {p.name for p in CSRC.glob("*.cu")} <= listed


def test_grouped_gemm_handler_rejects_gather_kinds():
  text = (CSRC / "ffi_handlers.cu").read_text()
  plain = text[text.index("ffi::Error GroupedGemmImpl("):text.index("ffi::Error GatheredGroupedGemmImpl(")]
  assert "check(!is_gather_kind(k)" in plain
  assert "check(!is_fused_epilogue_kind(k)" in plain
  assert "check(k != GemmKind::kVarlenKGatherBf16" in plain
  gathered = text[text.index("ffi::Error GatheredGroupedGemmImpl("):]
  assert "check(is_gather_kind(k)" in gathered


def test_ffi_kernels_fused_gather_switch():
  # "auto": dh where backend.dout_in_gemm(d, n), up_proj where backend.x_in_gemm(n).
  assert FfiKernels().fused_gather == "auto"
  assert FfiKernels(fused_gather=True) == FfiKernels(fused_gather="both")
  assert FfiKernels(fused_gather=True) != FfiKernels()
  assert FfiKernels(fused_gather="dh") != FfiKernels(fused_gather="up_proj")
  assert hash(FfiKernels(fused_gather=True)) == hash(FfiKernels(fused_gather=True))
  # The custom_vjp block is cached per backend: equal switches share one entry.
  assert len({FfiKernels(fused_gather="none"), FfiKernels(fused_gather=False),
              FfiKernels(fused_gather=True)}) == 2
  with pytest.raises(ValueError, match="fused_gather must be a bool or one of .*, got 'yes'"):
    FfiKernels(fused_gather="yes")
  with pytest.raises(ValueError, match="dw1_last must be a bool, got 1"):
    FfiKernels(dw1_last=1)


def _ffi_targets(fn, *args) -> list[str]:
  """The FFI targets ``fn(*args)`` calls, in trace order (no library needed to trace)."""
  targets = []
  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if "target_name" in eqn.params:
        targets.append(eqn.params["target_name"])
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        walk(sub)
  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return targets


_SCATTER_ALL = {"up_proj": "scatter", "dh": "scatter", "dw1": "scatter", "dw2": "scatter"}
_DOUT_IN_GEMM = {"up_proj": "scatter", "dh": "in-GEMM", "dw1": "scatter", "dw2": "in-GEMM"}
_ALL_IN_GEMM = {"up_proj": "in-GEMM", "dh": "in-GEMM", "dw1": "in-GEMM", "dw2": "in-GEMM"}


@pytest.mark.parametrize("fused, wgrad, d, n, want, up_epi", [
    ("none", "none", 32, 16, _SCATTER_ALL, "separate"),
    # The default: the dO path in the GEMM where backend.dout_in_gemm(d, n), the x path where
    # backend.x_in_gemm(n) (n <= 256).
    ("auto", "auto", 32, 16, _ALL_IN_GEMM, "separate"),
    ("auto", "auto", 2048, 256, _ALL_IN_GEMM, "separate"),
    ("auto", "auto", 1024, 264, _DOUT_IN_GEMM, "separate"),
    ("auto", "auto", 1024, 512, _DOUT_IN_GEMM, "separate"),
    ("auto", "auto", 1032, 512, _SCATTER_ALL, "separate"),
    ("auto", "auto", 32, 520, _SCATTER_ALL, "separate"),
    ("auto", "none", 32, 16, {**_SCATTER_ALL, "up_proj": "in-GEMM", "dh": "in-GEMM"},
     "separate"),
    # up_proj's SwiGLU GEMM over the gathered copy of x: "auto" leaves dW1 that copy.
    ("auto", "auto", 32, 16, {**_DOUT_IN_GEMM, "up_proj": "copy"}, "gemm"),
    ("dh", "dw2", 32, 520, _DOUT_IN_GEMM, "separate"),
    ("up_proj", "dw1", 32, 16, {"up_proj": "in-GEMM", "dh": "scatter", "dw1": "in-GEMM",
                                "dw2": "scatter"}, "separate"),
    (True, True, 32, 16, _ALL_IN_GEMM, "separate"),
])
def test_ffi_kernels_gather_switches_route_each_entry(monkeypatch, fused, wgrad, d, n, want,
                                                      up_epi):
  """fused_gather / wgrad_gather per entry point: the named ones read rows through gather_idx
  inside their GEMM, the others take scatter_rows' copy (traced only: no GPU, no library)."""
  monkeypatch.setattr(_lib, "library", lambda: None)
  monkeypatch.setattr(_lib, "gemm_workspace_bytes", lambda kind, config, groups: 256)
  kern = FfiKernels(fused_gather=fused, wgrad_gather=wgrad, up_proj_epilogue=up_epi)
  t, e, k = 64, 4, 2
  plan = route_logits(jax.random.normal(jax.random.key(0), (t, e)), top_k=k)
  p = plan.capacity
  bf = jnp.bfloat16
  x, dout = jnp.ones((t, d), bf), jnp.ones((t, d), bf)
  w1, w2 = jnp.ones((e, d, 2 * n), bf), jnp.ones((e, n, d), bf)
  h, a_prime = jnp.ones((p, 2 * n), bf), jnp.ones((p, n), bf)
  scores = jnp.ones((p,), jnp.float32)
  calls = {"up_proj": lambda: kern.up_proj(x, w1, plan), "dh": lambda: kern.dh(
      dout, w2, h, scores, plan), "dw1": lambda: kern.dw1(x, h, plan),
           "dw2": lambda: kern.dw2(dout, a_prime, plan)}
  for entry, how in want.items():
    targets = _ffi_targets(calls[entry])
    scattered = "sonic_jax_scatter_rows" in targets
    assert scattered == (how in ("scatter", "copy")), (entry, targets)
    in_gemm = {"up_proj": "sonic_jax_gathered_grouped_gemm", "dh":
               "sonic_jax_gathered_grouped_gemm", "dw1": "sonic_jax_gathered_varlen_k",
               "dw2": "sonic_jax_gathered_varlen_k"}[entry]
    assert (in_gemm in targets) == (how == "in-GEMM"), (entry, targets)


def _ffi_configs(fn, *args) -> list[tuple[str, int]]:
  """(target, config attribute) of each FFI call ``fn(*args)`` makes that has one."""
  out = []
  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if "target_name" in eqn.params:
        attrs = dict(eqn.params.get("attributes", ()))
        if "config" in attrs:
          out.append((eqn.params["target_name"], int(attrs["config"])))
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        walk(sub)
  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return out


def test_ffi_kernels_schedules_override_each_plain_gemm(monkeypatch):
  """FfiKernels(schedules=...) sets the config of the plain grouped GEMMs of its kinds, for
  every shape, and leaves the others to schedules.pick; bad kinds / configs are refused."""
  monkeypatch.setattr(_lib, "library", lambda: None)
  monkeypatch.setattr(_lib, "gemm_workspace_bytes", lambda kind, config, groups: 256)
  t, e, k, d, n = 64, 4, 2, 32, 16
  plan = route_logits(jax.random.normal(jax.random.key(0), (t, e)), top_k=k)
  p, bf = plan.capacity, jnp.bfloat16
  x, w1, w2 = jnp.ones((t, d), bf), jnp.ones((e, d, 2 * n), bf), jnp.ones((e, n, d), bf)
  a, dh = jnp.ones((p, n), bf), jnp.ones((p, 2 * n), bf)
  nn, nt, vk = GemmKind.VARLEN_M_NN_BF16, GemmKind.VARLEN_M_NT_BF16, GemmKind.VARLEN_K_BF16
  pick = lambda kind, *dims: int(schedules.pick(kind, *dims))
  gemm = "sonic_jax_grouped_gemm"

  def configs(kern):
    plain = dict(fused_gather="none", wgrad_gather="none")
    kern = FfiKernels(**plain, **kern)
    return ([c for tgt, c in _ffi_configs(lambda: kern.up_proj(x, w1, plan)) if tgt == gemm]
            + [c for _, c in _ffi_configs(lambda: kern.down_proj(a, w2, plan))]
            + [c for _, c in _ffi_configs(lambda: kern.dx_pairs(dh, w1, plan))]
            + [c for _, c in _ffi_configs(lambda: kern.dw1(x, dh, plan))])

  assert configs({}) == [pick(nn, 2 * n, d), pick(nn, d, n), pick(nt, d, 2 * n),
                         pick(vk, d, 2 * n)]
  c2 = GemmConfig.COOPERATIVE_128x256_C2x1
  got = configs(dict(schedules={"VARLEN_M_NN_BF16": "COOPERATIVE_128x256_C2x1",
                                vk: GemmConfig.PINGPONG_128x128_C2x1}))
  assert got == [c2, c2, pick(nt, d, 2 * n), GemmConfig.PINGPONG_128x128_C2x1]
  kern = FfiKernels(schedules={nn: c2})
  assert kern == FfiKernels(schedules={"VARLEN_M_NN_BF16": int(c2)}) != FfiKernels()
  assert "schedules={'VARLEN_M_NN_BF16': 'COOPERATIVE_128x256_C2x1'}" in repr(kern)
  with pytest.raises(ValueError, match="schedules: kind must be one of .*VARLEN_M_GATHER_NN"):
    FfiKernels(schedules={"VARLEN_M_GATHER_NN_BF16": "GATHER_COOP_128x256"})
  with pytest.raises(ValueError, match="config must be one of .* for VARLEN_M_NT_F32"):
    FfiKernels(schedules={"VARLEN_M_NT_F32": "PINGPONG_64x256_C2x1"})
  with pytest.raises(ValueError, match="schedules: unknown kind or config"):
    FfiKernels(schedules={"VARLEN_M_NN_BF16": "BIG_TILE"})
  with pytest.raises(ValueError, match="schedules must be a mapping"):
    FfiKernels(schedules=[("VARLEN_M_NN_BF16", "COOPERATIVE_128x256_C2x1")])


def test_ffi_kernels_row_gather_switch():
  assert FfiKernels().row_gather == "scatter"  # 1.55x gather_rows on the H200 (session 12)
  assert FfiKernels(row_gather="gather") != FfiKernels()
  assert len({FfiKernels(), FfiKernels(row_gather="gather"), FfiKernels(row_gather="gather")}) == 2
  assert "row_gather='gather'" in repr(FfiKernels(row_gather="gather"))
  with pytest.raises(ValueError, match="row_gather must be 'gather' or 'scatter', got 'xla'"):
    FfiKernels(row_gather="xla")
  # dw1_last (peak-memory order of the backward) is part of the value, off by default.
  assert not FfiKernels().dw1_last and FfiKernels(dw1_last=True).dw1_last
  assert FfiKernels(dw1_last=True) != FfiKernels() and "dw1_last=True" in repr(
      FfiKernels(dw1_last=True))
  with pytest.raises(ValueError, match="dw1_last must be a bool"):
    FfiKernels(dw1_last=1)


@pytest.mark.parametrize("bad, match", [
    (dict(kind=GemmKind.VARLEN_M_NN_BF16),
     "kind must be one of \\['VARLEN_M_GATHER_NN_BF16', 'VARLEN_M_GATHER_NT_F32'\\], got "
     "VARLEN_M_NN_BF16"),
    (dict(b=(4, 40, 64)), "b must be \\(E, K, N\\) .* K = src.shape\\[1\\] = 32, got b \\(4, 40, 64\\)"),
    (dict(b=(3, 32, 64)), "E = group_offsets.shape\\[0\\] - 1 = 4"),
    (dict(b=(4, 32, 60)), "K and N must be multiples of 8 .* N=60"),
    (dict(src_dtype=jnp.float32), "src must be bf16, got float32"),
    (dict(config=GemmConfig.COOPERATIVE_128x256_C2x1),
     "config must be one of .* for VARLEN_M_GATHER_NN_BF16, got 1"),
])
def test_gathered_grouped_gemm_rejects_bad_arguments(bad, match):
  src = jnp.zeros((16, 32), bad.get("src_dtype", jnp.bfloat16))
  b = jnp.zeros(bad.get("b", (4, 32, 64)), jnp.bfloat16)
  offs = jnp.array([0, 4, 8, 8, 12], jnp.int32)
  idx = jnp.zeros((16,), jnp.int32)
  with pytest.raises(ValueError, match=match):
    ops.gathered_grouped_gemm(src, idx, b, offs, bad.get("kind", GemmKind.VARLEN_M_GATHER_NN_BF16),
                              config=bad.get("config"))


@pytest.mark.parametrize("bad, match", [
    (dict(a_dtype=jnp.float32), "a must be bf16, got float32"),
    (dict(a_idx=(0,)), "a_idx must be None or a non-empty \\(P,\\) index"),
    (dict(b_idx=None), "as many grouped rows .* got 16 and 12"),
    (dict(b=(12, 60)), "multiples of 8 .* N=60"),
    (dict(config=GemmConfig.GATHER_TMA_B_128x256_C2x1),  # both operands through indices
     "in order by TMA: a_idx or b_idx must be None"),
    (dict(config=GemmConfig.GATHER_NOINC_128x256),
     "config must be one of \\['GATHER_COOP_128x256', 'GATHER_TMA_B_128x256_C2x1', "
     "'GATHER_TMA_256x128_C2x1', 'GATHER_TMA_256x128_C1'\\] for VARLEN_K_GATHER_BF16, got 7"),
    (dict(config=GemmConfig.GATHER_TMA_256x128_C1),
     "GATHER_TMA_256x128_C1 loads one operand's rows in order by TMA"),
    (dict(config=GemmConfig.GATHER_TMA_256x128_C2x1),
     "GATHER_TMA_256x128_C2x1 loads one operand's rows in order by TMA"),
])
def test_gathered_varlen_k_rejects_bad_arguments(bad, match):
  a = jnp.zeros((20, 32), bad.get("a_dtype", jnp.bfloat16))
  b = jnp.zeros(bad.get("b", (12, 64)), jnp.bfloat16)
  a_idx = jnp.zeros(bad.get("a_idx", (16,)), jnp.int32)
  b_idx = bad.get("b_idx", jnp.zeros((16,), jnp.int32))
  offs = jnp.array([0, 4, 8, 8, 12], jnp.int32)
  with pytest.raises(ValueError, match=match):
    ops.gathered_varlen_k(a, a_idx, b, b_idx, offs, config=bad.get("config"))


def test_gathered_varlen_k_rejects_operands_past_32_bit_row_offsets():
  huge = jax.ShapeDtypeStruct((2**22, 8192), jnp.bfloat16)  # 2**32 chunks of 16 bytes
  small = jax.ShapeDtypeStruct((16, 64), jnp.bfloat16)
  idx = jax.ShapeDtypeStruct((16,), jnp.int32)
  offs = jnp.array([0, 8, 16], jnp.int32)
  with pytest.raises(ValueError, match="a \\(4194304, 8192\\) is too large .* 2\\*\\*32 - 1"):
    jax.eval_shape(lambda a, i, b: ops.gathered_varlen_k(a, i, b, None, offs), huge, idx, small)


def test_ffi_kernels_wgrad_gather_switch():
  assert FfiKernels().wgrad_gather == "auto"  # dw2 and dw1 in the GEMM where n <= 256
  assert FfiKernels(wgrad_gather=True) != FfiKernels()
  assert "wgrad_gather='both'" in repr(FfiKernels(wgrad_gather=True))
  assert "wgrad_gather='dw2'" in repr(FfiKernels(wgrad_gather="dw2"))
  with pytest.raises(ValueError, match="wgrad_gather must be a bool or one of"):
    FfiKernels(wgrad_gather="yes")
  from sonic_jax.bench.variants import kernels_for
  assert kernels_for("ffi:fused-gather:wgrad-gather") == FfiKernels(fused_gather=True,
                                                                    wgrad_gather=True)
  assert kernels_for("ffi:fused-gather=dh:wgrad-gather=dw2") == FfiKernels(
      fused_gather="dh", wgrad_gather="dw2")
  with pytest.raises(SystemExit, match="wgrad_gather must be a bool or one of"):
    kernels_for("ffi:wgrad-gather=dh")


def test_grouped_gemm_refuses_gather_kinds():
  a = jnp.zeros((16, 32), jnp.bfloat16)
  with pytest.raises(ValueError, match="VARLEN_M_GATHER_NT_F32 gathers its A rows"):
    ops.grouped_gemm(a, jnp.zeros((4, 64, 32), jnp.bfloat16), jnp.zeros((5,), jnp.int32),
                     GemmKind.VARLEN_M_GATHER_NT_F32)
  with pytest.raises(ValueError, match="VARLEN_K_GATHER_BF16 reads rows through indices"):
    ops.grouped_gemm(a, a, jnp.zeros((5,), jnp.int32), GemmKind.VARLEN_K_GATHER_BF16)
  with pytest.raises(ValueError, match="VARLEN_M_GATHER_SWIGLU has a fused epilogue"):
    ops.grouped_gemm(a, jnp.zeros((4, 32, 64), jnp.bfloat16), jnp.zeros((5,), jnp.int32),
                     GemmKind.VARLEN_M_GATHER_SWIGLU)


@pytest.mark.parametrize("bad, match", [
    (dict(w1=(4, 32, 63)), "w1 must be \\(E, d, 2n\\), got \\(4, 32, 63\\)"),
    (dict(w1=(3, 32, 64)), "w1 must be \\(E, d, 2n\\) with E = group_offsets.shape\\[0\\] - 1 = 4"),
    (dict(w1=(4, 40, 64)), "K = src.shape\\[1\\] = 32, got \\(4, 40, 64\\)"),
    (dict(w1=(4, 32, 24)), "K and n must be multiples of 8 .* n=12"),
    (dict(src_dtype=jnp.float32), "src must be bf16, got float32"),
    (dict(config=GemmConfig.COOPERATIVE_128x256_C2x1),
     "config must be one of .* for VARLEN_M_GATHER_SWIGLU, got 1"),
    (dict(config=GemmConfig.TMA_AB_128x256_C1),
     "config TMA_AB_128x256_C1 loads src's rows in order by TMA: pass the gathered rows"),
])
def test_up_proj_swiglu_rejects_bad_arguments(bad, match):
  src = jnp.zeros((16, 32), bad.get("src_dtype", jnp.bfloat16))
  w1 = jnp.zeros(bad.get("w1", (4, 32, 64)), jnp.bfloat16)
  offs = jnp.array([0, 4, 8, 8, 12], jnp.int32)
  with pytest.raises(ValueError, match="(up_proj_swiglu: .*)?" + match):
    ops.up_proj_swiglu(src, jnp.zeros((16,), jnp.int32), w1, offs, config=bad.get("config"))


@pytest.mark.parametrize("bad, match", [
    (dict(h=(16, 48)), "h must be \\(P, 2n\\) = \\(P, 64\\) bf16, got \\(16, 48\\)"),
    (dict(s=(15,)), "s must be \\(P,\\) = \\(16,\\), got \\(15,\\)"),
    (dict(w2=(4, 32, 40)), "K = src.shape\\[1\\] = 32, got \\(4, 32, 40\\)"),
    (dict(idx=(12,)), "gather_idx must be \\(P,\\) with P = 16, got \\(12,\\)"),
    (dict(idx=None, src=(12, 32)), "without gather_idx, src must hold the 16 gathered rows"),
])
def test_dh_dswiglu_rejects_bad_arguments(bad, match):
  src = jnp.zeros(bad.get("src", (16, 32)), jnp.bfloat16)
  w2 = jnp.zeros(bad.get("w2", (4, 32, 32)), jnp.bfloat16)
  h_shape = bad.get("h", (16, 64))
  h = jnp.zeros(h_shape, jnp.bfloat16)
  s = jnp.zeros(bad.get("s", (h_shape[0],)), jnp.float32)
  idx_shape = bad.get("idx", (16,))
  idx = None if idx_shape is None else jnp.zeros(idx_shape, jnp.int32)
  offs = jnp.array([0, 4, 8, 8, 12], jnp.int32)
  with pytest.raises(ValueError, match="dh_dswiglu: .*" + match):
    ops.dh_dswiglu(src, idx, w2, h, s, offs)


def test_ffi_kernels_fused_epilogue_switch():
  assert FfiKernels(fused_epilogue=True).fused_epilogue == "both"
  assert FfiKernels(fused_epilogue=False).fused_epilogue == "none"
  assert FfiKernels(fused_epilogue=True) != FfiKernels(fused_epilogue="dh")
  assert len({FfiKernels(fused_epilogue="dh"), FfiKernels(fused_epilogue=True),
              FfiKernels(fused_epilogue="both")}) == 2
  assert "fused_epilogue='dh'" in repr(FfiKernels(fused_epilogue="dh"))
  with pytest.raises(ValueError, match="fused_epilogue must be a bool or one of .*, got 1"):
    FfiKernels(fused_epilogue=1)
  with pytest.raises(ValueError, match="fused_epilogue must be .*'both'.*, got 'dx'"):
    FfiKernels(fused_epilogue="dx")
  assert FfiKernels().fused_epilogue == "none"  # opt-in: slower on the H200 (session 16)
  for mode, want in (("none", ()), ("both", ("up_proj", "dh")), ("dh", ("dh",)),
                     ("up_proj", ("up_proj",))):
    kern = FfiKernels(fused_epilogue=mode)
    assert tuple(e for e in ("up_proj", "dh") if kern._fuses(e)) == want, mode


def test_ffi_kernels_up_proj_epilogue_switch():
  assert FfiKernels().up_proj_epilogue == "separate"  # opt-in until measured in the step
  k = FfiKernels(up_proj_epilogue="gemm")
  assert k != FfiKernels() and "up_proj_epilogue='gemm'" in repr(k)
  assert len({k, FfiKernels(up_proj_epilogue="gemm"), FfiKernels()}) == 2
  with pytest.raises(ValueError, match="up_proj_epilogue must be one of \\('separate', 'gemm', "
                     "'gemm_pingpong'\\), got 'tma'"):
    FfiKernels(up_proj_epilogue="tma")
  for mode in ("gemm", "gemm_pingpong"):
    for bad in (dict(fused_epilogue="up_proj"), dict(fused_epilogue=True),
                dict(fused_gather="up_proj"), dict(fused_gather=True)):
      with pytest.raises(ValueError, match=f"up_proj_epilogue='{mode}' reads the gathered copy"):
        FfiKernels(up_proj_epilogue=mode, **bad)
    # dh's in-GEMM paths leave x's gathered copy alone.
    FfiKernels(up_proj_epilogue=mode, fused_epilogue="dh", fused_gather="dh")
  # Each GEMM mode runs an in-order config of the SwiGLU kind.
  from sonic_jax.ffi.backend import UP_PROJ_EPILOGUE_CONFIGS
  assert set(UP_PROJ_EPILOGUE_CONFIGS.values()) == set(schedules.SWIGLU_IN_ORDER_CONFIGS)
  assert FfiKernels(up_proj_epilogue="gemm_pingpong") != k


def test_ffi_kernels_gather_schedule_switch():
  # "auto" (session 30, H100): dh without the cluster, up_proj with it (tma_b won on the H200
  # in session 18; it is also each in-GEMM gather kind's default config).
  assert FfiKernels().gather_schedule == "auto"
  assert FfiKernels(gather_schedule="cp_async") != FfiKernels()
  assert len({FfiKernels(gather_schedule="auto"), FfiKernels(gather_schedule="cp_async"),
              FfiKernels(gather_schedule="noinc"), FfiKernels()}) == 3
  assert "gather_schedule='noinc'" in repr(FfiKernels(gather_schedule="noinc"))
  for entry in ("up_proj", "dh"):
    assert (FfiKernels(gather_schedule="tma_b")._gather_config(entry) ==
            GemmConfig.GATHER_TMA_B_128x256_C2x1)
    assert (FfiKernels(gather_schedule="cp_async")._gather_config(entry) ==
            GemmConfig.GATHER_COOP_128x256)
    assert (FfiKernels(gather_schedule="noinc")._gather_config(entry) ==
            GemmConfig.GATHER_NOINC_128x256)
    assert (FfiKernels(gather_schedule="tma_b_c1")._gather_config(entry) ==
            GemmConfig.GATHER_TMA_B_128x256_C1)
    assert (FfiKernels(gather_schedule="pingpong")._gather_config(entry) ==
            GemmConfig.GATHER_PINGPONG_64x256_C2x1)
    assert (FfiKernels(gather_schedule="pingpong_c1")._gather_config(entry) ==
            GemmConfig.GATHER_PINGPONG_64x256_C1)
  # Every gather schedule is built for every in-GEMM gather and fused-epilogue kind.
  for kind in (*schedules.GATHER_KINDS, *schedules.FUSED_EPILOGUE_KINDS):
    for name, cfg in GATHER_SCHEDULE_CONFIGS.items():
      assert cfg in schedules.INSTANTIATED[kind], (kind, name)
  for kind in (*schedules.GATHER_KINDS, *schedules.FUSED_EPILOGUE_KINDS):
    assert schedules.DEFAULT[kind] == GemmConfig.GATHER_TMA_B_128x256_C2x1
  # "auto": each entry point's fastest in session 30's H100 sweep (dh without the cluster).
  auto = FfiKernels()
  assert auto._gather_config("up_proj") == GemmConfig.GATHER_TMA_B_128x256_C2x1
  assert auto._gather_config("dh") == GemmConfig.GATHER_TMA_B_128x256_C1
  assert auto != FfiKernels(gather_schedule="tma_b_c1") and "gather_schedule='auto'" in repr(auto)
  with pytest.raises(ValueError, match="gather_schedule must be one of"):
    FfiKernels(gather_schedule="tma")


def test_session17_schedules_are_built_for_every_in_gemm_gather_kind():
  for kind in (*schedules.GATHER_KINDS, *schedules.FUSED_EPILOGUE_KINDS):
    assert GemmConfig.GATHER_TMA_B_128x256_C2x1 in schedules.INSTANTIATED[kind]
    assert GemmConfig.GATHER_NOINC_128x256 in schedules.INSTANTIATED[kind]


@pytest.mark.skipif(_lib.find_library() is None, reason="libsonic_jax_cuda.so is not built")
def test_built_library_layout_checks_pass():
  """Host code of the library (no GPU): the fused epilogues' accumulator layout and, for the
  TMA-B schedule, where each TMA box lands against the WGMMA stage layout (swizzle included)."""
  if _lib.library_error() is not None:
    pytest.skip(_lib.library_error())
  assert _lib.layouts_ok()


def test_sweep_epilogue_variants():
  from sonic_jax.ffi import sweep
  names = list(sweep.EPILOGUE_VARIANTS)
  # Every variant gathers the rows of its unfused entry points into copies (not "auto"), as
  # the sessions that compared the epilogues did.
  none = dict(fused_gather=False, wgrad_gather=False)
  assert names[0] == "separate" and sweep.EPILOGUE_VARIANTS["separate"] == FfiKernels(**none)
  assert sweep.EPILOGUE_VARIANTS["both"] == FfiKernels(fused_epilogue="both", **none)
  assert sweep.EPILOGUE_VARIANTS["both:tma_b"] == FfiKernels(fused_epilogue="both",
                                                             gather_schedule="tma_b", **none)
  assert sweep.EPILOGUE_VARIANTS["both:cp_async"] == FfiKernels(fused_epilogue="both",
                                                                gather_schedule="cp_async",
                                                                **none)
  assert {"dh:noinc", "both:noinc", "dh:cp_async"} <= set(names)
  assert sweep.EPILOGUE_VARIANTS["up_gemm"] == FfiKernels(up_proj_epilogue="gemm", **none)
  with pytest.raises(SystemExit):  # argparse: not one of the choices
    sweep.main(["--fused-epilogue-only", "--epilogue-variants", "separate"])


def test_sweep_elementwise_rows(monkeypatch):
  """The --elementwise-only rows on the CPU: the two ffi kernels replaced by plain JAX (they need
  a GPU); checks the rows, the bytes behind their GB/s and the block-vs-warp comparison."""
  from sonic_jax import xla_backend
  from sonic_jax.ffi import sweep

  def dswiglu(da, h, s, offs, *, warp_per_row=False):
    dh, a = xla_backend.dswiglu(da, h.astype(jnp.float32))
    ds = jnp.sum(da * a, axis=-1)
    return ((s[:, None] * dh).astype(jnp.bfloat16), (s[:, None] * a).astype(jnp.bfloat16), ds)

  monkeypatch.setattr(sweep.ops, "dswiglu", dswiglu)
  monkeypatch.setattr(sweep.ops, "swiglu_from_h",
                      lambda h, offs: xla_backend.swiglu(h.astype(jnp.float32)).astype(h.dtype))
  t, n, e, k = 64, 16, 4, 2
  rows, picks = sweep.run_elementwise(t, 32, n, e, k, iters=1)
  assert picks == {}
  by = {r["name"]: r for r in rows}
  assert list(by) == ["dswiglu_block", "dswiglu_warp", "swiglu_from_h", "copy"]
  p = t * k  # a top-K plan's capacity
  # dSwiGLU reads dA' (fp32), H (bf16, 2n) and s, writes dH (bf16, 2n), A' (bf16) and dS.
  dswiglu_bytes = p * (4 * n + 2 * 2 * n + 4) + p * (2 * 2 * n + 2 * n + 4)
  for name in ("dswiglu_block", "dswiglu_warp"):
    r = by[name]
    assert r["rows"] == p and r["n"] == n and r["ms"] > 0
    assert r["gbps"] == pytest.approx(dswiglu_bytes / r["ms"] / 1e6)
  assert by["dswiglu_warp"]["rel_vs_block"] == 0.0
  assert by["copy"]["bytes"] == dswiglu_bytes
  assert by["swiglu_from_h"]["gbps"] == pytest.approx(p * 6 * n / by["swiglu_from_h"]["ms"] / 1e6)


def test_sweep_gemms_only_rows(monkeypatch):
  """--gemms-only on the CPU (the ffi GEMM and layer replaced by plain JAX): a row per plain
  GEMM and instantiated schedule, the layer under the default and the swept table, no fused
  gather or entry rows, and a pick per GEMM shape."""
  from sonic_jax.ffi import sweep

  calls = []

  def grouped_gemm(lhs, rhs, offs, kind, config=None):
    calls.append((GemmKind(kind), config))
    rows = jnp.arange(lhs.shape[0])
    onehot = ((rows[:, None] >= offs[None, :-1]) & (rows[:, None] < offs[None, 1:])).astype(
        jnp.float32)
    lhs, rhs = lhs.astype(jnp.float32), rhs.astype(jnp.float32)
    if kind in schedules.VARLEN_K_KINDS:
      out = jnp.einsum("pm,pe,pn->emn", lhs, onehot, rhs)
    elif kind in (GemmKind.VARLEN_M_NT_F32, GemmKind.VARLEN_M_NT_BF16):
      out = jnp.einsum("pk,pe,enk->pn", lhs, onehot, rhs)
    else:
      out = jnp.einsum("pk,pe,ekn->pn", lhs, onehot, rhs)
    f32 = kind in schedules.F32_OUT_KINDS
    return out if f32 else out.astype(jnp.bfloat16)

  monkeypatch.setattr(sweep.ops, "grouped_gemm", grouped_gemm)
  moe = sonic_jax.moe
  monkeypatch.setattr(sweep.sonic_jax, "moe",
                      lambda *a, backend=None, **kw: moe(*a, backend="xla", **kw))
  rows, picks = sweep.run_config(64, 32, 16, 4, 2, iters=1, gemms_only=True)
  gemms = [r for r in rows if r["kind"] == "gemm"]
  names = list(dict.fromkeys(r["name"] for r in gemms))
  assert len(names) == 6
  kinds = [GemmKind.VARLEN_M_NN_BF16, GemmKind.VARLEN_M_NN_BF16, GemmKind.VARLEN_M_NT_F32,
           GemmKind.VARLEN_M_NT_BF16, GemmKind.VARLEN_K_BF16, GemmKind.VARLEN_K_BF16]
  for name, kind in zip(names, kinds):
    got = [r["config"] for r in gemms if r["name"] == name]
    assert got == [c.name for c in schedules.INSTANTIATED[kind]], name
    # Every schedule agrees with the first one (the fake computes the same product).
    assert all(r["rel_err_vs_first"] < 1e-6 for r in gemms if r["name"] == name)
  assert len(gemms) == sum(len(schedules.INSTANTIATED[k]) for k in kinds)
  assert {r["kind"] for r in rows} == {"gemm", "layer"}
  assert [(r["name"], r["table"]) for r in rows if r["kind"] == "layer"] == [
      ("layer fwd", "default"), ("layer fwd+bwd", "default"),
      ("layer fwd", "swept"), ("layer fwd+bwd", "swept")]
  # One pick per distinct (kind, N, K) shape; up_proj (2n, d) and down_proj (d, n) differ.
  assert len(picks) == 6
  assert all(v in {c.name for c in GemmConfig} for v in picks.values())
  assert len(calls) == len(gemms)


def test_sweep_only_schedules_times_the_named_configs_next_to_the_default():
  from sonic_jax.ffi import sweep
  tma = GemmConfig.TMA_AB_128x256_C1
  for kind in (GemmKind.VARLEN_M_NN_BF16, GemmKind.VARLEN_M_NT_BF16, GemmKind.VARLEN_K_BF16):
    assert sweep._configs_to_time(kind, [tma.name]) == (schedules.DEFAULT[kind], tma)
    # The default named too: timed once, first.
    assert sweep._configs_to_time(kind, [schedules.DEFAULT[kind].name, tma.name]) == (
        schedules.DEFAULT[kind], tma)
  for kind in (GemmKind.VARLEN_M_NT_F32, GemmKind.VARLEN_K_F32):
    assert sweep._configs_to_time(kind, [tma.name]) == ()  # not built for these: skipped
  assert sweep._configs_to_time(GemmKind.VARLEN_K_BF16, None) == schedules.INSTANTIATED[
      GemmKind.VARLEN_K_BF16]
  with pytest.raises(SystemExit):  # argparse: not a GemmConfig name
    sweep.main(["--gemms-only", "--only-schedules", "TMA_AB"])


def test_ffi_kernels_dswiglu_switch():
  assert FfiKernels().dswiglu == "warp"  # faster at every measured shape (H200, session 20)
  assert FfiKernels(dswiglu="block") != FfiKernels()
  assert "dswiglu='block'" in repr(FfiKernels(dswiglu="block"))
  with pytest.raises(ValueError, match="dswiglu must be 'block' or 'warp', got 'grid'"):
    FfiKernels(dswiglu="grid")


def test_handlers_are_marked_command_buffer_compatible():
  text = (CSRC / "ffi_handlers.cu").read_text()
  blocks = re.findall(r"XLA_FFI_DEFINE_HANDLER_SYMBOL\((\w+),[^;]*;", text)
  for sym in _lib.TARGETS.values():
    block = re.search(r"XLA_FFI_DEFINE_HANDLER_SYMBOL\(" + sym + r",[^;]*;", text).group(0)
    assert "SONIC_CMD_BUFFER" in block, sym
  assert len(blocks) == len(_lib.TARGETS)
  assert "ffi::Traits::kCmdBufferCompatible" in text


def test_registered_symbols_exist_in_the_handlers():
  text = (CSRC / "ffi_handlers.cu").read_text()
  defined = set(re.findall(r"XLA_FFI_DEFINE_HANDLER_SYMBOL\((\w+),", text))
  assert set(_lib.TARGETS.values()) == defined
  assert f"sonic_jax_abi_version() {{ return {_lib.ABI_VERSION}; }}" in text


def test_sweep_layer_rows_time_the_whole_step():
  """The sweep's layer rows: the forward, and the training step of the layer benchmark (output
  and gradients, so the forward's down projection and combine are kept), with the paper's
  FLOP counts. Run here with the xla backend (the ffi kernels need a GPU)."""
  from sonic_jax.ffi.sweep import _layer_rows
  t, d, n, e, k = 32, 16, 8, 4, 2
  ks = jax.random.split(jax.random.key(5), 5)
  x = jax.random.normal(ks[0], (t, d), jnp.float32)
  router_w = jax.random.normal(ks[1], (d, e), jnp.float32)
  w1 = jax.random.normal(ks[2], (e, d, 2 * n), jnp.float32)
  w2 = jax.random.normal(ks[3], (e, n, d), jnp.float32)
  cot = jax.random.normal(ks[4], (t, d), jnp.float32)
  moe = lambda *a: sonic_jax.moe(*a, top_k=k, backend="xla")
  (fwd_name, fwd, fwd_args, fwd_flops), (step_name, step, step_args, step_flops) = _layer_rows(
      moe, x, router_w, w1, w2, cot, k)
  assert (fwd_name, step_name) == ("layer fwd", "layer fwd+bwd")
  assert (fwd_flops, step_flops) == (6 * t * k * d * n, 18 * t * k * d * n)
  out, grads = step(*step_args)
  np.testing.assert_allclose(out, fwd(*fwd_args), rtol=1e-5, atol=1e-5)
  want = jax.grad(lambda *a: jnp.sum(moe(*a) * cot), argnums=(0, 1, 2, 3))(x, router_w, w1, w2)
  for g, g_ref in zip(grads, want):
    assert _rel(g, g_ref) < 1e-5


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
def test_cmake_switch_off_is_a_pure_python_configure(tmp_path):
  out = subprocess.run(["cmake", "-S", str(CSRC), "-B", str(tmp_path), "-DSONIC_JAX_CUDA=OFF"],
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert "pure-Python install" in out.stdout
  assert "Looking for a CUDA compiler" not in out.stdout  # OFF never probes for nvcc


# ---------------------------------------------------------------- GPU: against the xla backend


def _rel(a, b, rows=None) -> float:
  a = np.asarray(jnp.asarray(a, jnp.float32))
  b = np.asarray(jnp.asarray(b, jnp.float32))
  if rows is not None:
    a, b = a[rows], b[rows]
  assert np.all(np.isfinite(a)), "non-finite values in the ffi result"
  assert np.all(np.isfinite(b)), "non-finite values in the reference"
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _plans(t, e):
  """Routings covering the edge cases the kernels must handle."""
  key = jax.random.key(7)
  plans = {"topk": route_logits(jax.random.normal(key, (t, e)), top_k=2)}
  # Only experts {0, 3, e-2} get tokens (the others are empty); E is not a power of two.
  allowed = np.array([0, 3, e - 2])
  rng = np.random.default_rng(0)
  picks = np.stack([rng.choice(allowed, 2, replace=False) for _ in range(t)])
  plans["empty_experts"] = RoutingPlan.from_assignments(
      jnp.repeat(jnp.arange(t), 2), jnp.asarray(picks.reshape(-1)),
      jnp.asarray(rng.uniform(0.1, 1.0, 2 * t), jnp.float32), num_tokens=t, num_experts=e,
      top_k=2)
  plans["one_expert"] = RoutingPlan.from_assignments(
      jnp.arange(t), jnp.full((t,), 1), jnp.asarray(rng.uniform(0.1, 1.0, t), jnp.float32),
      num_tokens=t, num_experts=e, top_k=1)
  plans["token_rounding"] = route_logits(jax.random.normal(key, (t, e)), top_k=2,
                                         routing=TokenRounding(tile=16))
  return plans


T, D, N, E = 640, 256, 128, 7  # E = 7: not a power of two; groups straddle 128-row tiles


@pytest.fixture(scope="module")
def data():
  ks = jax.random.split(jax.random.key(3), 8)
  p_max = max(p.capacity for p in _plans(T, E).values())
  return dict(
      x=jax.random.normal(ks[0], (T, D), jnp.bfloat16),
      w1=(jax.random.normal(ks[1], (E, D, 2 * N), jnp.float32) / np.sqrt(D)).astype(jnp.bfloat16),
      w2=(jax.random.normal(ks[2], (E, N, D), jnp.float32) / np.sqrt(N)).astype(jnp.bfloat16),
      dout=jax.random.normal(ks[3], (T, D), jnp.bfloat16),
      h=jax.random.normal(ks[4], (p_max, 2 * N), jnp.bfloat16),
      a=jax.random.normal(ks[5], (p_max, N), jnp.bfloat16),
      y=jax.random.normal(ks[6], (p_max, D), jnp.bfloat16),
      dh=jax.random.normal(ks[7], (p_max, 2 * N), jnp.bfloat16),
  )


def _rows(plan):
  return np.arange(plan.capacity) < int(plan.group_offsets[-1])


BF16_TOL, F32_TOL = 1e-2, 1e-3
ROUTINGS = ["topk", "empty_experts", "one_expert", "token_rounding"]


# The defaults (at N = 128 every gather in the GEMM) and every gathered operand scattered.
_ENTRY_KERNELS = {"auto": FfiKernels(),
                  "scatter": FfiKernels(fused_gather="none", wgrad_gather="none")}


@pytest.mark.gpu
@pytest.mark.parametrize("gathers", list(_ENTRY_KERNELS))
@pytest.mark.parametrize("routing", ROUTINGS)
def test_forward_entry_points_match_xla(routing, gathers, data):
  plan = _plans(T, E)[routing]
  p = plan.capacity
  ffi_k, ref = _ENTRY_KERNELS[gathers], XlaKernels()
  rows = _rows(plan)
  h, a = jax.jit(ffi_k.up_proj)(data["x"], data["w1"], plan)
  h_ref, a_ref = ref.up_proj(data["x"], data["w1"], plan)
  assert _rel(h, h_ref, rows) < BF16_TOL
  assert _rel(a, a_ref, rows) < BF16_TOL
  h_none, a_inf = jax.jit(lambda x, w, pl: ffi_k.up_proj(x, w, pl, inference=True))(
      data["x"], data["w1"], plan)
  assert h_none is None and _rel(a_inf, a_ref, rows) < BF16_TOL
  y = jax.jit(ffi_k.down_proj)(data["a"][:p], data["w2"], plan)
  assert _rel(y, ref.down_proj(data["a"][:p], data["w2"], plan), rows) < BF16_TOL
  for scores in (plan.scores, None):
    out = jax.jit(ffi_k.combine, static_argnums=3)(data["y"][:p], plan, scores, jnp.bfloat16)
    want = ref.combine(data["y"][:p], plan, scores, jnp.bfloat16)
    assert _rel(out, want) < BF16_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("routing", ROUTINGS)
def test_combine_add_matches_xla(routing, data):
  """The dx combine with the router's x-gradient as the kernel's starting value (every routing:
  empty experts, one expert, token rounding's padded plan; tokens without pairs get the
  addend alone)."""
  plan = _plans(T, E)[routing]
  p = plan.capacity
  ffi_k, ref = FfiKernels(combine_add="kernel"), XlaKernels()
  addend = jax.random.normal(jax.random.key(41), (T, D), jnp.bfloat16)
  out = jax.jit(ffi_k.combine_add, static_argnums=3)(data["y"][:p], plan, addend, jnp.bfloat16)
  want = ref.combine_add(data["y"][:p], plan, addend, jnp.float32)
  assert out.dtype == jnp.bfloat16 and _rel(out, want) < BF16_TOL
  # fp32 output: the default (combine, then the add)
  out32 = jax.jit(ffi_k.combine_add, static_argnums=3)(data["y"][:p], plan, addend, jnp.float32)
  assert out32.dtype == jnp.float32 and _rel(out32, want) < BF16_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("gathers", list(_ENTRY_KERNELS))
@pytest.mark.parametrize("routing", ROUTINGS)
def test_backward_entry_points_match_xla(routing, gathers, data):
  plan = _plans(T, E)[routing]
  p = plan.capacity
  ffi_k, ref = _ENTRY_KERNELS[gathers], XlaKernels()
  rows = _rows(plan)
  s = plan.grouped_scores()
  h = data["h"][:p]
  dh, a_prime, ds = jax.jit(ffi_k.dh)(data["dout"], data["w2"], h, s, plan)
  dh_r, a_prime_r, ds_r = ref.dh(data["dout"], data["w2"], h, s, plan)
  assert _rel(dh, dh_r, rows) < BF16_TOL
  assert _rel(a_prime, a_prime_r, rows) < BF16_TOL
  assert _rel(ds, ds_r, rows) < F32_TOL
  dw2 = jax.jit(ffi_k.dw2)(data["dout"], a_prime_r, plan)
  dw2_r = ref.dw2(data["dout"], a_prime_r, plan)
  # dW in bf16 (fp32 accumulation, VARLEN_K_BF16): one rounding of the output, rms ~1.6e-3.
  assert dw2.shape == (E, N, D) and dw2.dtype == jnp.bfloat16
  assert _rel(dw2, dw2_r) < 4e-3
  dx = jax.jit(ffi_k.dx_pairs)(data["dh"][:p], data["w1"], plan)
  assert _rel(dx, ref.dx_pairs(data["dh"][:p], data["w1"], plan), rows) < BF16_TOL
  dw1 = jax.jit(ffi_k.dw1)(data["x"], data["dh"][:p], plan)
  dw1_r = ref.dw1(data["x"], data["dh"][:p], plan)
  assert dw1.shape == (E, D, 2 * N) and dw1.dtype == jnp.bfloat16
  assert _rel(dw1, dw1_r) < 4e-3
  empty = np.asarray(plan.group_sizes) == 0
  if empty.any():  # varlen-K with K = 0 must write zeros, not leave garbage
    assert np.all(np.asarray(dw1)[empty] == 0) and np.all(np.asarray(dw2)[empty] == 0)


_LAYER_BACKENDS = {"gather_rows": FfiKernels(), "fused_gather": FfiKernels(fused_gather=True),
                   "fused_epilogue": FfiKernels(fused_epilogue=True),
                   "fused_dh": FfiKernels(fused_epilogue="dh"),
                   "up_proj_epilogue_gemm": FfiKernels(up_proj_epilogue="gemm"),
                   # Session 32's ping-pong schedules (64 x 256 tile per consumer warpgroup).
                   "up_proj_epilogue_gemm_pingpong": FfiKernels(up_proj_epilogue="gemm_pingpong"),
                   "fused_epilogue_pingpong": FfiKernels(fused_epilogue=True,
                                                         gather_schedule="pingpong"),
                   "fused_epilogue_pingpong_c1": FfiKernels(fused_epilogue=True,
                                                            gather_schedule="pingpong_c1"),
                   "fused_gather_pingpong_c1": FfiKernels(fused_gather=True,
                                                          gather_schedule="pingpong_c1"),
                   "dswiglu_block": FfiKernels(dswiglu="block"),
                   "fused_gather_noinc": FfiKernels(fused_gather=True, gather_schedule="noinc"),
                   "fused_gather_cp_async": FfiKernels(fused_gather=True,
                                                       gather_schedule="cp_async"),
                   "fused_epilogue_noinc": FfiKernels(fused_epilogue=True,
                                                      gather_schedule="noinc"),
                   "fused_epilogue_cp_async": FfiKernels(fused_epilogue=True,
                                                         gather_schedule="cp_async"),
                   "wgrad_gather": FfiKernels(wgrad_gather=True),
                   "all_gathers_fused": FfiKernels(fused_gather=True, wgrad_gather=True),
                   "no_gathers_fused": FfiKernels(fused_gather=False, wgrad_gather=False),
                   # No scatter of dO (dh and dW2 read its rows in the GEMM), or none of x.
                   "dout_gathers_fused": FfiKernels(fused_gather="dh", wgrad_gather="dw2"),
                   "x_gathers_fused": FfiKernels(fused_gather="up_proj", wgrad_gather="dw1"),
                   # sonic_jax.mixed: entry points of both GPU backends in one step.
                   "mixed_pallas_base": MixedKernels(PallasKernels(), dx_pairs=FfiKernels(),
                                                     dw1=FfiKernels(), combine=FfiKernels()),
                   "mixed_pallas_wgrad": MixedKernels(PallasKernels(),
                                                      dw1=FfiKernels(wgrad_gather=True),
                                                      dw2=FfiKernels(wgrad_gather=True)),
                   # pallas' forward and dh, ffi's dx_pairs and dW1 / dW2 reading x / dO
                   # through gather_idx (docs/ffi.md, 120B-n512's lever 5).
                   "mixed_pallas_dh_ffi_wgrad": MixedKernels(
                       PallasKernels(), dx_pairs=FfiKernels(),
                       dw1=FfiKernels(wgrad_gather="both"), dw2=FfiKernels(wgrad_gather="both")),
                   "mixed_ffi_base": MixedKernels(FfiKernels(dswiglu="warp"),
                                                  down_proj=PallasKernels(), dh=PallasKernels(),
                                                  dw2=PallasKernels())}


@pytest.mark.gpu
@pytest.mark.parametrize("variant", list(_LAYER_BACKENDS))
@pytest.mark.parametrize("routing", ["topk", "token_rounding"])
def test_layer_forward_backward_matches_xla(routing, variant):
  t, d, n, e, k = 1024, 512, 256, 12, 4
  ks = jax.random.split(jax.random.key(11), 5)
  x = jax.random.normal(ks[0], (t, d), jnp.bfloat16)
  router_w = (jax.random.normal(ks[1], (d, e)) / np.sqrt(d)).astype(jnp.bfloat16)
  w1 = (jax.random.normal(ks[2], (e, d, 2 * n)) / np.sqrt(d)).astype(jnp.bfloat16)
  w2 = (jax.random.normal(ks[3], (e, n, d)) / np.sqrt(n)).astype(jnp.bfloat16)
  cot = jax.random.normal(ks[4], (t, d), jnp.bfloat16)
  rt = "topk" if routing == "topk" else TokenRounding(tile=64)

  def loss(backend, x, router_w, w1, w2):
    out = sonic_jax.moe(x, router_w, w1, w2, top_k=k, routing=rt, backend=backend)
    return jnp.sum(out.astype(jnp.float32) * cot.astype(jnp.float32)), out

  results = {}
  for backend in (_LAYER_BACKENDS[variant], "xla"):
    f = jax.jit(jax.value_and_grad(lambda *a, b=backend: loss(b, *a), argnums=(0, 1, 2, 3),
                                   has_aux=True))
    results[backend] = f(x, router_w, w1, w2)
  (_, out), grads = [v for b, v in results.items() if b != "xla"][0]
  (_, out_r), grads_r = results["xla"]
  assert _rel(out, out_r) < BF16_TOL
  for name, g, g_r in zip(("dx", "drouter_w", "dw1", "dw2"), grads, grads_r):
    assert _rel(g, g_r) < 2 * BF16_TOL, name


@pytest.mark.gpu
@pytest.mark.parametrize("routing", ["topk", "empty_experts", "one_expert"])
def test_scatter_rows_matches_gather_rows(routing, data):
  """scatter_rows by reverse_idx gives gather_rows' grouped rows bit for bit (top-K plans,
  empty experts and one expert with every token included)."""
  plan = _plans(T, E)[routing]
  x = data["x"]
  got = jax.jit(ops.scatter_rows)(x, plan.reverse_idx)
  want = jax.jit(ops.gather_rows)(x, plan.gather_idx, plan.group_offsets)
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("routing", ["topk", "token_rounding"])
def test_layer_gradients_with_scatter_rows_match_gather_rows(routing):
  """row_gather="scatter" (the default): the same rows as row_gather="gather", so the same
  output and gradients bit for bit; a token-rounding plan (no fixed K) keeps gather_rows. Every
  gathered operand is copied (at n = 256 "auto" reads them in the GEMM)."""
  from tests.helpers import Problem, make_inputs, value_and_grads
  args = make_inputs(Problem(T=1024, d=512, n=256, E=12, K=4, seed=12), jnp.bfloat16)
  ct = jax.random.normal(jax.random.key(13), (1024, 512), jnp.bfloat16)
  rt = "topk" if routing == "topk" else TokenRounding(tile=64)
  run = lambda backend: value_and_grads(
      lambda *a: sonic_jax.moe(*a, top_k=4, routing=rt, backend=backend), args, ct)
  copies = dict(fused_gather="none", wgrad_gather="none")
  (out, grads), (out_g, grads_g) = (run(FfiKernels(**copies)),
                                    run(FfiKernels(row_gather="gather", **copies)))
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(out_g, np.float32))
  for name, a, b in zip(("dx", "drouter_w", "dw1", "dw2"), grads, grads_g):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32), name)


@pytest.mark.gpu
def test_layer_gradients_with_dw1_last_match_default():
  """FfiKernels(dw1_last=True) only reorders the backward (dW1 re-gathers x after dW2 and dx):
  the same output and gradients bit for bit. x is scattered (at n = 256 "auto" reads it in the
  GEMM, and then there is no copy to re-gather)."""
  from tests.helpers import Problem, make_inputs, value_and_grads
  args = make_inputs(Problem(T=1024, d=512, n=256, E=12, K=4, seed=14), jnp.bfloat16)
  ct = jax.random.normal(jax.random.key(15), (1024, 512), jnp.bfloat16)
  run = lambda backend: value_and_grads(
      lambda *a: sonic_jax.moe(*a, top_k=4, backend=backend), args, ct)
  dout_only = dict(fused_gather="dh", wgrad_gather="dw2")
  (out, grads), (out_d, grads_d) = (run(FfiKernels(dw1_last=True, **dout_only)),
                                    run(FfiKernels(**dout_only)))
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(out_d, np.float32))
  for name, a, b in zip(("dx", "drouter_w", "dw1", "dw2"), grads, grads_d):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32), name)


@pytest.mark.gpu
def test_library_reports_available_on_hopper():
  assert ffi.unavailable_reason() is None
  assert sonic_jax.resolve_backend("ffi").name == "ffi"


# The gathered kinds take (src, gather_idx) through ops.gathered_grouped_gemm, the fused-epilogue
# kinds go through ops.up_proj_swiglu / dh_dswiglu, the gathered varlen-K kind through
# ops.gathered_varlen_k: each is tested on its own.
_KIND_CONFIGS = [(kind, cfg) for kind, cfgs in schedules.INSTANTIATED.items() for cfg in cfgs
                 if kind not in schedules.GATHER_KINDS + schedules.FUSED_EPILOGUE_KINDS
                 + (GemmKind.VARLEN_K_GATHER_BF16,)]


@pytest.mark.gpu
@pytest.mark.parametrize("kind, config", _KIND_CONFIGS,
                         ids=[f"{k.name}-{c.name}" for k, c in _KIND_CONFIGS])
def test_every_gemm_schedule_matches_xla(kind, config, data):
  """Each compiled tile schedule against ragged_dot, on routings with empty / uneven groups."""
  for routing in ("topk", "empty_experts", "one_expert"):
    plan = _plans(T, E)[routing]
    p, offs = plan.capacity, plan.group_offsets
    xg, dog = data["x"][plan.gather_idx], data["dout"][plan.gather_idx]
    f32 = jnp.float32
    ragged = lambda l, r: jax.lax.ragged_dot(l, r, plan.group_sizes, preferred_element_type=f32)
    if kind in (GemmKind.VARLEN_M_NN_F32, GemmKind.VARLEN_M_NN_BF16):
      args, want = (xg, data["w1"]), ragged(xg, data["w1"])
    elif kind in (GemmKind.VARLEN_M_NT_F32, GemmKind.VARLEN_M_NT_BF16):
      args, want = (dog, data["w2"]), ragged(dog, jnp.swapaxes(data["w2"], 1, 2))
    else:
      args, want = (data["a"][:p], dog), XlaKernels().dw2(data["dout"], data["a"][:p], plan)
    got = jax.jit(lambda l, r, o: ops.grouped_gemm(l, r, o, kind, config=config))(*args, offs)
    tol = F32_TOL if got.dtype == jnp.float32 else BF16_TOL
    rows = None if kind in schedules.VARLEN_K_KINDS else _rows(plan)
    assert _rel(got, want, rows) < tol, routing


@pytest.mark.gpu
def test_up_proj_a_from_bf16_h_stays_at_bf16_rounding(data):
  """A is computed from the bf16 H (as the backward recomputes it), not from fp32: the error
  against an fp32 SwiGLU of the fp32 accumulator stays at bf16 rounding level."""
  plan = _plans(T, E)["topk"]
  rows = _rows(plan)
  h, a = jax.jit(FfiKernels().up_proj)(data["x"], data["w1"], plan)
  acc = jax.lax.ragged_dot(data["x"][plan.gather_idx], data["w1"], plan.group_sizes,
                           preferred_element_type=jnp.float32)
  n = acc.shape[1] // 2
  a32 = jax.nn.silu(acc[:, :n]) * acc[:, n:]
  assert _rel(h, acc, rows) < 4e-3        # one bf16 rounding (2^-9 relative, rms ~ 1.6e-3)
  assert _rel(a, a32, rows) < 6e-3        # inputs and output rounded: a few roundings
  h32 = jnp.asarray(h, jnp.float32)
  a_from_h = jax.nn.silu(h32[:, :n]) * h32[:, n:]
  assert _rel(a, a_from_h, rows) < 4e-3   # exactly silu(g)·u of the returned H, then rounded


_CMD_BUFFER_CHILD = r"""
import json
import jax, jax.numpy as jnp, numpy as np
import sys
import sonic_jax
from sonic_jax.ffi.backend import FfiKernels
ffi_backend = FfiKernels(fused_gather=sys.argv[1] == "1")
t, d, n, e, k = 512, 256, 128, 6, 2
ks = jax.random.split(jax.random.key(5), 6)
w1 = (jax.random.normal(ks[0], (e, d, 2 * n)) / np.sqrt(d)).astype(jnp.bfloat16)
w2 = (jax.random.normal(ks[1], (e, n, d)) / np.sqrt(n)).astype(jnp.bfloat16)
cot = jax.random.normal(ks[2], (t, d), jnp.bfloat16).astype(jnp.float32)
def loss(backend, x, r, w1, w2):
  out = sonic_jax.moe(x, r, w1, w2, top_k=k, backend=backend)
  return jnp.sum(out.astype(jnp.float32) * cot), out
fs = {name: jax.jit(jax.value_and_grad(lambda *a, b=b: loss(b, *a), argnums=(0, 1, 2, 3),
                                       has_aux=True))
      for name, b in (("ffi", ffi_backend), ("xla", "xla"))}
def inputs(seed, skew):
  kx, kr = jax.random.split(jax.random.key(seed))
  r = (jax.random.normal(kr, (d, e)) / np.sqrt(d)).astype(jnp.bfloat16)
  r = r.at[:, 0].add(skew)  # skew moves tokens between experts: new group offsets, same shapes
  return jax.random.normal(kx, (t, d), jnp.bfloat16), r
from sonic_jax.ffi import _lib
def rel(a, b):
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  assert np.all(np.isfinite(a)) and np.all(np.isfinite(b))
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))
errs = []
for seed, skew in ((0, 0.0), (1, 0.5), (0, 0.0), (2, 2.0)):  # replays with new routing data
  x, r = inputs(seed, skew)
  (_, out), g = fs["ffi"](x, r, w1, w2)
  (_, out_r), g_r = fs["xla"](x, r, w1, w2)
  errs.append([rel(out, out_r)] + [rel(a, b) for a, b in zip(g, g_r)])
calls, captured = _lib.handler_calls()
print("RESULT " + json.dumps(dict(calls=calls, captured=captured, errs=errs)))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("fused_gather", [False, True], ids=["gather_rows", "fused_gather"])
def test_layer_runs_inside_xla_command_buffers(fused_gather):
  """With custom calls allowed in command buffers, XLA records the FFI handlers into CUDA graphs
  (the library counts handler calls made while the stream is being captured; jax 0.11.2 forms
  command buffers from thunks, so they do not show in the compiled HLO), and calls with new
  routing data (new group offsets, one input repeated) still match the xla backend."""
  import json
  import os
  import sys
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer=FUSION,"
                      "CUBLAS,CUBLASLT,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1").strip()
  root = pathlib.Path(__file__).resolve().parent.parent
  env["PYTHONPATH"] = f"{root}{os.pathsep}{env.get('PYTHONPATH', '')}"
  proc = subprocess.run([sys.executable, "-c", _CMD_BUFFER_CHILD, str(int(fused_gather))],
                        capture_output=True,
                        text=True, timeout=600, env=env)
  assert proc.returncode == 0, proc.stderr[-4000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
  res = json.loads(line[len("RESULT "):])
  print(res)
  assert res["captured"] > 0, res
  for errs in res["errs"]:
    assert errs[0] < BF16_TOL and max(errs[1:]) < 2 * BF16_TOL, res["errs"]


# ---------------------------------------------------------------- GPU: fused gather (issue #5)

_GATHER_KIND_CONFIGS = [(kind, cfg) for kind in schedules.GATHER_KINDS
                        for cfg in schedules.INSTANTIATED[kind]]
GATHER_TOL = 8e-3


def _gather_problem(case: str, kind: GemmKind):
  """(src, plan, b) for a gathered-GEMM case; b is (E, K, N) for NN and (E, N, K) for NT."""
  if case == "ragged":
    # P = 999 (not a multiple of any tile), K = 200 (not a multiple of 64), N = 136 (not a
    # multiple of the tile N), E = 5.
    t, k, n, e = 333, 200, 136, 5
    plan = route_logits(jax.random.normal(jax.random.key(21), (t, e)), top_k=3)
  else:
    t, k, n, e = T, D, 2 * N, E
    plan = _plans(T, E)[case]
  ks = jax.random.split(jax.random.key(17), 2)
  src = jax.random.normal(ks[0], (t, k), jnp.bfloat16)
  shape = (e, n, k) if kind == GemmKind.VARLEN_M_GATHER_NT_F32 else (e, k, n)
  b = (jax.random.normal(ks[1], shape, jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
  return src, plan, b


def _gather_reference(src, plan, b, kind) -> np.ndarray:
  """float64 src[gather_idx[p]] · op(b[e]) per expert, rows past group_offsets[-1] zero."""
  rows = np.asarray(src, np.float64)[np.asarray(plan.gather_idx)]
  bb = np.asarray(jnp.asarray(b, jnp.float32), np.float64)
  if kind == GemmKind.VARLEN_M_GATHER_NT_F32:
    bb = np.swapaxes(bb, 1, 2)
  offs = np.asarray(plan.group_offsets)
  out = np.zeros((rows.shape[0], bb.shape[2]))
  for e in range(bb.shape[0]):
    out[offs[e]:offs[e + 1]] = rows[offs[e]:offs[e + 1]] @ bb[e]
  return out


@pytest.mark.gpu
@pytest.mark.parametrize("case", ROUTINGS + ["ragged"])
@pytest.mark.parametrize("kind, config", _GATHER_KIND_CONFIGS,
                         ids=[f"{k.name}-{c.name}" for k, c in _GATHER_KIND_CONFIGS])
def test_gathered_gemm_matches_fp32_reference(kind, config, case):
  """Empty experts and E = 7 (empty_experts), all rows on one expert (one_expert), groups
  straddling tiles (topk), padded capacity (token_rounding), P / K / N off the tile (ragged)."""
  src, plan, b = _gather_problem(case, kind)
  f = jax.jit(lambda s, i, w, o: ops.gathered_grouped_gemm(s, i, w, o, kind, config=config))
  got = f(src, plan.gather_idx, b, plan.group_offsets)
  want_dtype = jnp.float32 if kind == GemmKind.VARLEN_M_GATHER_NT_F32 else jnp.bfloat16
  assert got.dtype == want_dtype and got.shape == (plan.capacity, b.shape[1 if kind ==
                                                   GemmKind.VARLEN_M_GATHER_NT_F32 else 2])
  rows = _rows(plan)
  want = _gather_reference(src, plan, b, kind)
  assert _rel(got, want, rows) < GATHER_TOL, case
  # The same product through the separate gather + TMA grouped GEMM (the unfused path).
  plain = {GemmKind.VARLEN_M_GATHER_NN_BF16: GemmKind.VARLEN_M_NN_BF16,
           GemmKind.VARLEN_M_GATHER_NT_F32: GemmKind.VARLEN_M_NT_F32}[kind]
  unfused = jax.jit(lambda s, i, w, o: ops.grouped_gemm(ops.gather_rows(s, i, o), w, o, plain))(
      src, plan.gather_idx, b, plan.group_offsets)
  assert _rel(got, unfused, rows) < GATHER_TOL, case


@pytest.mark.gpu
@pytest.mark.parametrize("kind, config", _GATHER_KIND_CONFIGS,
                         ids=[f"{k.name}-{c.name}" for k, c in _GATHER_KIND_CONFIGS])
def test_gathered_gemm_is_deterministic(kind, config):
  src, plan, b = _gather_problem("topk", kind)
  f = jax.jit(lambda s, i, w, o: ops.gathered_grouped_gemm(s, i, w, o, kind, config=config))
  rows = _rows(plan)
  first = np.asarray(f(src, plan.gather_idx, b, plan.group_offsets))[rows]
  for _ in range(3):
    again = np.asarray(f(src, plan.gather_idx, b, plan.group_offsets))[rows]
    assert np.array_equal(first, again)


@pytest.mark.gpu
def test_gathered_gemm_zero_rows_and_out_of_range_indices():
  """No live rows at all (group_offsets all zero: no tiles) runs without a fault; an index
  outside [0, T) reads a zero row instead of faulting."""
  kind = GemmKind.VARLEN_M_GATHER_NN_BF16
  src, plan, b = _gather_problem("topk", kind)
  offs0 = jnp.zeros_like(plan.group_offsets)
  out = jax.jit(lambda s, i, w, o: ops.gathered_grouped_gemm(s, i, w, o, kind))(
      src, plan.gather_idx, b, offs0)
  assert out.shape == (plan.capacity, b.shape[2])
  idx = plan.gather_idx.at[0].set(src.shape[0] + 5)
  got = jax.jit(lambda s, i, w, o: ops.gathered_grouped_gemm(s, i, w, o, kind))(
      src, idx, b, plan.group_offsets)
  assert np.all(np.asarray(got[0], np.float32) == 0)
  rows = _rows(plan)
  rows[0] = False
  assert _rel(got, _gather_reference(src, plan, b, kind), rows) < GATHER_TOL


# ------------------------------------------------- GPU: gathered varlen-K (dW1 / dW2, issue #5)

def _wgrad_reference(a, a_idx, b, b_idx, offs) -> np.ndarray:
  """float64 Σ_{p in e} a[ia(p)]ᵀ ⊗ b[ib(p)] per group; out-of-range indices read zero rows."""
  def rows(x, idx, count):
    x = np.asarray(jnp.asarray(x, jnp.float32), np.float64)
    if idx is None:
      return x[:count]
    idx = np.asarray(idx)[:count]
    ok = (idx >= 0) & (idx < x.shape[0])
    return np.where(ok[:, None], x[np.clip(idx, 0, x.shape[0] - 1)], 0.0)
  offs = np.asarray(offs)
  ra, rb = rows(a, a_idx, offs[-1]), rows(b, b_idx, offs[-1])
  return np.stack([ra[offs[e]:offs[e + 1]].T @ rb[offs[e]:offs[e + 1]]
                   for e in range(len(offs) - 1)])


def _wgrad_problem(case: str, which: str):
  """(a, a_idx, b, b_idx, offsets): dW1-like (a = x gathered, b = dH), dW2-like (a = A', b = dO
  gathered) or both operands gathered."""
  if case == "ragged":  # P = 999, M = 328 (3 M blocks: an odd cluster pair) and N = 136 off
    t, m, nn, e = 333, 328, 136, 5  # the 128 x 256 tile, E = 5
    plan = route_logits(jax.random.normal(jax.random.key(21), (t, e)), top_k=3)
  elif case == "long_groups":  # groups over several 1024-row index chunks (the kernel's row
    t, m, nn, e = 2600, D, 2 * N, 3  # staging), ending mid-chunk, and an empty expert between
    scores = jax.random.uniform(jax.random.key(23), (t,), jnp.float32, 0.1, 1.0)
    plan = RoutingPlan.from_assignments(jnp.arange(t), jnp.where(jnp.arange(t) < 2200, 0, 2),
                                        scores, num_tokens=t, num_experts=e, top_k=1)
  else:
    t, m, nn, e = T, D, 2 * N, E
    plan = _plans(T, E)[case]
  ks = jax.random.split(jax.random.key(29), 2)
  p = plan.capacity
  a_rows = t if which in ("dw1", "both") else p
  b_rows = t if which in ("dw2", "both") else p
  a = jax.random.normal(ks[0], (a_rows, m), jnp.bfloat16)
  b = jax.random.normal(ks[1], (b_rows, nn), jnp.bfloat16)
  a_idx = plan.gather_idx if which in ("dw1", "both") else None
  b_idx = plan.gather_idx if which in ("dw2", "both") else None
  # Rows past the groups (token-rounding padding) may hold anything, NaN included: the kernel
  # must not let them reach the product (TMA reads them with the last block of the last group).
  live = int(plan.group_offsets[-1])
  if a_idx is None:
    a = a.at[live:].set(jnp.nan)
  if b_idx is None:
    b = b.at[live:].set(jnp.nan)
  return a, a_idx, b, b_idx, plan.group_offsets


# Configs 6, 8 and 9 load the operand without an index by TMA: B (dH) for dW1, A (A') for dW2.
_WGRAD_CASES = [(w, c) for w in ("dw1", "dw2") for c in (GemmConfig.GATHER_TMA_B_128x256_C2x1,
                                                          GemmConfig.GATHER_TMA_256x128_C2x1,
                                                          GemmConfig.GATHER_TMA_256x128_C1,
                                                          GemmConfig.GATHER_COOP_128x256)]
_WGRAD_CASES.append(("both", GemmConfig.GATHER_COOP_128x256))


@pytest.mark.gpu
@pytest.mark.parametrize("which, config", _WGRAD_CASES,
                         ids=[f"{w}-{c.name}" for w, c in _WGRAD_CASES])
@pytest.mark.parametrize("case", ROUTINGS + ["ragged", "long_groups"])
def test_gathered_varlen_k_matches_fp64_reference(case, which, config):
  """Empty experts give zeros (empty_experts), one group with every row (one_expert), groups
  straddling 64-row K blocks (topk), NaN padding rows after the groups (token_rounding),
  M / N / P off the tile and an odd number of M blocks (ragged), a group of 2200 rows over three
  1024-row index chunks next to an empty expert (long_groups)."""
  a, a_idx, b, b_idx, offs = _wgrad_problem(case, which)
  got = jax.jit(lambda *args: ops.gathered_varlen_k(*args, config=config))(a, a_idx, b, b_idx,
                                                                          offs)
  want = _wgrad_reference(a, a_idx, b, b_idx, offs)
  assert got.dtype == jnp.bfloat16 and got.shape == want.shape
  assert _rel(got, want) < GATHER_TOL, (case, which)
  empty = np.diff(np.asarray(offs)) == 0
  assert np.all(np.asarray(got, np.float32)[empty] == 0)
  # The same as the TMA varlen-K GEMM on the pre-gathered rows.
  if which != "both":
    ga = a if a_idx is None else ops.gather_rows(a, a_idx, offs)
    gb = b if b_idx is None else ops.gather_rows(b, b_idx, offs)
    plain = jax.jit(lambda x, y, o: ops.grouped_gemm(x, y, o, GemmKind.VARLEN_K_BF16))(ga, gb, offs)
    assert _rel(got, plain) < GATHER_TOL, (case, which)


@pytest.mark.gpu
def test_gathered_varlen_k_is_deterministic_and_reads_zero_rows_out_of_range():
  a, a_idx, b, b_idx, offs = _wgrad_problem("topk", "dw1")
  f = jax.jit(ops.gathered_varlen_k)
  first = np.asarray(f(a, a_idx, b, b_idx, offs))
  for _ in range(3):
    assert np.array_equal(first, np.asarray(f(a, a_idx, b, b_idx, offs)))
  bad = a_idx.at[0].set(a.shape[0] + 5).at[1].set(-3)
  got = f(a, bad, b, b_idx, offs)
  assert _rel(got, _wgrad_reference(a, bad, b, b_idx, offs)) < GATHER_TOL
  # No rows at all: every group empty, all zeros.
  zero = f(a, a_idx, b, b_idx, jnp.zeros_like(offs))
  assert np.all(np.asarray(zero, np.float32) == 0)


@pytest.mark.gpu
@pytest.mark.parametrize("routing", ROUTINGS)
def test_fused_gather_entry_points_match_xla(routing, data):
  plan = _plans(T, E)[routing]
  p = plan.capacity
  fused, ref = FfiKernels(fused_gather=True), XlaKernels()
  rows = _rows(plan)
  h, a = jax.jit(fused.up_proj)(data["x"], data["w1"], plan)
  h_ref, a_ref = ref.up_proj(data["x"], data["w1"], plan)
  assert _rel(h, h_ref, rows) < BF16_TOL
  assert _rel(a, a_ref, rows) < BF16_TOL
  s = plan.grouped_scores()
  dh, a_prime, ds = jax.jit(fused.dh)(data["dout"], data["w2"], data["h"][:p], s, plan)
  dh_r, a_prime_r, ds_r = ref.dh(data["dout"], data["w2"], data["h"][:p], s, plan)
  assert _rel(dh, dh_r, rows) < BF16_TOL
  assert _rel(a_prime, a_prime_r, rows) < BF16_TOL
  assert _rel(ds, ds_r, rows) < F32_TOL


# ------------------------------------------------ fused SwiGLU / dSwiGLU epilogues (issue #5)
# The configs of both fused kinds that gather (the SwiGLU kind also has in-order ones, below).
_FUSED_CONFIGS = list(schedules.INSTANTIATED[GemmKind.VARLEN_M_GATHER_DSWIGLU])
assert set(_FUSED_CONFIGS) == (set(schedules.INSTANTIATED[GemmKind.VARLEN_M_GATHER_SWIGLU])
                               - set(schedules.SWIGLU_IN_ORDER_CONFIGS))


def _fused_problem(case: str):
  """(x, dout, plan, w1, w2, h, s) for a fused-epilogue case; "ragged": P = 999, d = 200 (not a
  multiple of 64), n = 136 (off every tile N), E = 5."""
  if case == "ragged":
    t, d, n, e = 333, 200, 136, 5
    plan = route_logits(jax.random.normal(jax.random.key(21), (t, e)), top_k=3)
  else:
    t, d, n, e = T, D, N, E
    plan = _plans(T, E)[case]
  ks = jax.random.split(jax.random.key(23), 6)
  x = jax.random.normal(ks[0], (t, d), jnp.bfloat16)
  dout = jax.random.normal(ks[1], (t, d), jnp.bfloat16)
  w1 = (jax.random.normal(ks[2], (e, d, 2 * n)) / np.sqrt(d)).astype(jnp.bfloat16)
  w2 = (jax.random.normal(ks[3], (e, n, d)) / np.sqrt(n)).astype(jnp.bfloat16)
  h = jax.random.normal(ks[4], (plan.capacity, 2 * n), jnp.bfloat16)
  s = jax.random.uniform(ks[5], (plan.capacity,), jnp.float32, 0.1, 1.0)
  return x, dout, plan, w1, w2, h, s


def _silu(g):
  return g / (1.0 + np.exp(-g))


@pytest.mark.gpu
@pytest.mark.parametrize("gathered", [True, False], ids=["in_kernel_gather", "pre_gathered"])
@pytest.mark.parametrize("case", ROUTINGS + ["ragged"])
@pytest.mark.parametrize("config", _FUSED_CONFIGS, ids=[c.name for c in _FUSED_CONFIGS])
def test_fused_epilogue_kernels_match_fp64_reference(config, case, gathered):
  """up_proj_swiglu's H and A and dh_dswiglu's dH, A' and dS, each against a float64 reference
  (A from the bf16 H) and against the unfused kernels (gathered GEMM + elementwise pass)."""
  x, dout, plan, w1, w2, h, s = _fused_problem(case)
  offs, idx = plan.group_offsets, plan.gather_idx
  rows = _rows(plan)
  n = w2.shape[1]
  src_x = x if gathered else ops.gather_rows(x, idx, offs)
  src_do = dout if gathered else ops.gather_rows(dout, idx, offs)
  g_idx = idx if gathered else None
  up = jax.jit(lambda a, i, w, o: ops.up_proj_swiglu(a, i, w, o, config=config))
  h_f, a_f = up(src_x, g_idx, w1, offs)
  assert h_f.shape == (plan.capacity, 2 * n) and a_f.shape == (plan.capacity, n)
  h64 = _gather_reference(x, plan, w1, GemmKind.VARLEN_M_GATHER_NN_BF16)
  assert _rel(h_f, h64, rows) < GATHER_TOL, "H"
  hb = np.asarray(jnp.asarray(h_f, jnp.float32), np.float64)  # A from the kernel's bf16 H
  a64 = _silu(hb[:, :n]) * hb[:, n:]
  assert _rel(a_f, a64, rows) < BF16_TOL, "A"
  a_unfused = ops.swiglu_from_h(ops.gathered_grouped_gemm(
      x, idx, w1, offs, GemmKind.VARLEN_M_GATHER_NN_BF16), offs)
  assert _rel(a_f, a_unfused, rows) < BF16_TOL, "A vs unfused"
  _, a_inf = jax.jit(lambda a, i, w, o: ops.up_proj_swiglu(a, i, w, o, write_h=False,
                                                           config=config))(src_x, g_idx, w1, offs)
  np.testing.assert_array_equal(np.asarray(a_inf, np.float32)[rows],
                                np.asarray(a_f, np.float32)[rows])

  dh_f, ap_f, ds_f = jax.jit(lambda *a: ops.dh_dswiglu(*a, config=config))(
      src_do, g_idx, w2, h, s, offs)
  da64 = _gather_reference(dout, plan, w2, GemmKind.VARLEN_M_GATHER_NT_F32)
  hh = np.asarray(jnp.asarray(h, jnp.float32), np.float64)
  g, u, s64 = hh[:, :n], hh[:, n:], np.asarray(s, np.float64)[:, None]
  sig = 1.0 / (1.0 + np.exp(-g))
  act = g * sig * u
  dh64 = np.concatenate([s64 * da64 * u * sig * (1 + g * (1 - sig)), s64 * da64 * g * sig], 1)
  assert _rel(dh_f, dh64, rows) < BF16_TOL, "dH"
  assert _rel(ap_f, s64 * act, rows) < BF16_TOL, "A'"
  assert _rel(ds_f, np.sum(da64 * act, axis=1), rows) < F32_TOL, "dS"
  da_unfused = ops.gathered_grouped_gemm(dout, idx, w2, offs, GemmKind.VARLEN_M_GATHER_NT_F32)
  dh_u, ap_u, ds_u = ops.dswiglu(da_unfused, h, s, offs)
  assert _rel(dh_f, dh_u, rows) < BF16_TOL and _rel(ap_f, ap_u, rows) < BF16_TOL
  assert _rel(ds_f, ds_u, rows) < F32_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("case", ROUTINGS + ["ragged"])
@pytest.mark.parametrize("config", schedules.SWIGLU_IN_ORDER_CONFIGS,
                         ids=[c.name for c in schedules.SWIGLU_IN_ORDER_CONFIGS])
def test_in_order_swiglu_kernel_matches_fp64_reference(config, case):
  """up_proj_swiglu reading the gathered rows in order by TMA (config 14): H and A against the
  float64 reference and against the unfused GEMM + swiglu_from_h; inference writes the same A;
  repeated calls give the same bits; no live rows write nothing."""
  x, _, plan, w1, _, _, _ = _fused_problem(case)
  offs, idx = plan.group_offsets, plan.gather_idx
  rows = _rows(plan)
  n = w1.shape[2] // 2
  xg = ops.gather_rows(x, idx, offs)
  up = jax.jit(lambda a, w, o, write_h=True: ops.up_proj_swiglu(a, None, w, o, write_h=write_h,
                                                                config=config),
               static_argnames="write_h")
  h_f, a_f = up(xg, w1, offs)
  assert h_f.shape == (plan.capacity, 2 * n) and a_f.shape == (plan.capacity, n)
  h64 = _gather_reference(x, plan, w1, GemmKind.VARLEN_M_GATHER_NN_BF16)
  assert _rel(h_f, h64, rows) < GATHER_TOL, "H"
  hb = np.asarray(jnp.asarray(h_f, jnp.float32), np.float64)
  a64 = _silu(hb[:, :n]) * hb[:, n:]
  assert _rel(a_f, a64, rows) < BF16_TOL, "A"
  a_unfused = ops.swiglu_from_h(ops.grouped_gemm(xg, w1, offs, GemmKind.VARLEN_M_NN_BF16), offs)
  assert _rel(a_f, a_unfused, rows) < BF16_TOL, "A vs unfused"
  h_none, a_inf = up(xg, w1, offs, write_h=False)
  assert h_none is None
  np.testing.assert_array_equal(np.asarray(a_inf, np.float32)[rows],
                                np.asarray(a_f, np.float32)[rows])
  h_again, a_again = up(xg, w1, offs)
  np.testing.assert_array_equal(np.asarray(h_again, np.float32)[rows],
                                np.asarray(h_f, np.float32)[rows])
  np.testing.assert_array_equal(np.asarray(a_again, np.float32)[rows],
                                np.asarray(a_f, np.float32)[rows])
  jax.block_until_ready(up(xg, w1, jnp.zeros_like(offs)))


@pytest.mark.gpu
@pytest.mark.parametrize("config", _FUSED_CONFIGS, ids=[c.name for c in _FUSED_CONFIGS])
def test_fused_epilogue_kernels_are_deterministic_and_handle_no_rows(config):
  x, dout, plan, w1, w2, h, s = _fused_problem("topk")
  offs, idx = plan.group_offsets, plan.gather_idx
  rows = _rows(plan)
  up = jax.jit(lambda *a: ops.up_proj_swiglu(*a, config=config))
  dh = jax.jit(lambda *a: ops.dh_dswiglu(*a, config=config))
  first = [np.asarray(v, np.float32)[rows] for v in (*up(x, idx, w1, offs),
                                                    *dh(dout, idx, w2, h, s, offs))]
  for _ in range(2):
    again = [np.asarray(v, np.float32)[rows] for v in (*up(x, idx, w1, offs),
                                                      *dh(dout, idx, w2, h, s, offs))]
    for a, b in zip(first, again):
      np.testing.assert_array_equal(a, b)
  # No live rows: no tiles, nothing written, no fault.
  offs0 = jnp.zeros_like(offs)
  jax.block_until_ready(up(x, idx, w1, offs0))
  jax.block_until_ready(dh(dout, idx, w2, h, s, offs0))


@pytest.mark.gpu
@pytest.mark.parametrize("routing", ROUTINGS)
def test_fused_epilogue_entry_points_match_xla(routing, data):
  plan = _plans(T, E)[routing]
  p = plan.capacity
  fused, ref = FfiKernels(fused_epilogue="both"), XlaKernels()
  rows = _rows(plan)
  h_ref, a_ref = ref.up_proj(data["x"], data["w1"], plan)
  for up in (fused, FfiKernels(up_proj_epilogue="gemm")):
    h, a = jax.jit(up.up_proj)(data["x"], data["w1"], plan)
    assert _rel(h, h_ref, rows) < BF16_TOL, up
    assert _rel(a, a_ref, rows) < BF16_TOL, up
    h_none, a_inf = jax.jit(lambda x, w, pl, up=up: up.up_proj(x, w, pl, inference=True))(
        data["x"], data["w1"], plan)
    assert h_none is None and _rel(a_inf, a_ref, rows) < BF16_TOL, up
  s = plan.grouped_scores()
  dh, a_prime, ds = jax.jit(fused.dh)(data["dout"], data["w2"], data["h"][:p], s, plan)
  dh_r, a_prime_r, ds_r = ref.dh(data["dout"], data["w2"], data["h"][:p], s, plan)
  assert _rel(dh, dh_r, rows) < BF16_TOL
  assert _rel(a_prime, a_prime_r, rows) < BF16_TOL
  assert _rel(ds, ds_r, rows) < F32_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("n", [128, 136, 1024], ids=["n128", "n136", "n1024"])
@pytest.mark.parametrize("routing", ROUTINGS)
def test_dswiglu_warp_per_row_matches_block_per_row(routing, n):
  """The warp-per-row dSwiGLU kernel gives the block kernel's dH and A' bit for bit and its dS to
  fp32 summation order (n = 136: lanes with two 4-column chunks and lanes with one; n = 1024:
  eight chunks a lane), and both match a float64 reference."""
  plan = _plans(T, E)[routing]
  p = plan.capacity
  ks = jax.random.split(jax.random.key(29), 3)
  da = jax.random.normal(ks[0], (p, n), jnp.float32)
  h = jax.random.normal(ks[1], (p, 2 * n), jnp.bfloat16)
  s = jax.random.uniform(ks[2], (p,), jnp.float32, 0.1, 1.0)
  rows = _rows(plan)
  f = jax.jit(lambda *a, w: ops.dswiglu(*a, warp_per_row=w), static_argnames="w")
  block = [np.asarray(v, np.float32)[rows] for v in f(da, h, s, plan.group_offsets, w=False)]
  warp = [np.asarray(v, np.float32)[rows] for v in f(da, h, s, plan.group_offsets, w=True)]
  np.testing.assert_array_equal(warp[0], block[0])  # dH
  np.testing.assert_array_equal(warp[1], block[1])  # A'
  assert _rel(warp[2], block[2]) < 1e-6  # dS
  hh = np.asarray(jnp.asarray(h, jnp.float32), np.float64)[rows]
  g, u = hh[:, :n], hh[:, n:]
  ds64 = np.sum(np.asarray(da, np.float64)[rows] * g / (1 + np.exp(-g)) * u, axis=1)
  assert _rel(warp[2], ds64) < F32_TOL


def test_combine_add_option():
  from sonic_jax.ffi.backend import COMBINE_ADD_DEFAULT
  assert FfiKernels().combine_add_impl == COMBINE_ADD_DEFAULT
  assert FfiKernels(combine_add="kernel") != FfiKernels(combine_add="xla")
  assert "combine_add='kernel'" in repr(FfiKernels(combine_add="kernel"))
  with pytest.raises(ValueError, match="combine_add"):
    FfiKernels(combine_add="fused")
