"""The original PyTorch SonicMoE (``sonicmoe`` package) as a baseline, when torch and it import.

Its training-mode ``MoE`` module (router + softmax top-K + the CuTe-DSL kernels, SwiGLU, no
bias) on the same sizes, bf16, x and dO = 0.2·randn, weights N(0, 0.02). Timed with CUDA events
(median after warm-up, host gaps included), peak memory from torch's allocator. QuACK's GEMM
autotuning is switched off (it can spend minutes per shape; reference notes §7.2b), so its
default tile config runs. Uniform top-K routing only (the module has no logit bias or token
rounding entry point).
"""

from __future__ import annotations

import dataclasses
import importlib
import statistics
import time

from sonic_jax.bench.impls import Impl


def _disable_quack_autotuning() -> str:
  try:
    autotuner = importlib.import_module("quack.autotuner")
  except Exception as e:  # noqa: BLE001
    return f"quack.autotuner not importable ({type(e).__name__})"
  cls = getattr(autotuner, "Autotuner", None)
  if cls is None or getattr(cls, "_sonic_jax_untuned", False):
    return "ok"

  def call(self, *args, **kwargs):
    kwargs.pop("config", None)
    return self.fn(*args, config=None, **kwargs)

  cls.__call__ = call
  cls._sonic_jax_untuned = True
  return "ok"


@dataclasses.dataclass
class TorchSonicMoE(Impl):

  def skip_reason(self, cfg, spec, opts):
    try:
      torch = importlib.import_module("torch")
      importlib.import_module("sonicmoe")
    except Exception as e:  # noqa: BLE001
      return f"unavailable: torch/sonicmoe do not import ({type(e).__name__}: {str(e)[:80]})"
    if not torch.cuda.is_available():
      return "unavailable: needs a CUDA GPU"
    if spec.method != "topk" or spec.dist != "uniform":
      return "skipped: the PyTorch module runs uniform top-K routing only"
    return None

  def measure(self, cfg, modes, warmup: int, iters: int) -> dict:
    """Returns {mode: {ms, compile_s}, 'peak_bytes': ..., 'timer': 'cuda-events'}."""
    import torch
    from sonicmoe import MoE
    from sonicmoe.enums import ActivationType
    note = _disable_quack_autotuning()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    # Parameters are made on the GPU in bf16 directly: an fp32 copy on the host would take
    # minutes (and 45 GB) for the DeepSeek-V3-like preset.
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
      with dev:
        moe = MoE(num_experts=cfg.E, num_experts_per_tok=cfg.K, hidden_size=cfg.d,
                  intermediate_size=cfg.n, activation_function=ActivationType.SWIGLU,
                  add_bias=False, std=0.02)
    finally:
      torch.set_default_dtype(default_dtype)
    moe = moe.to(device=dev, dtype=torch.bfloat16)
    moe.train()
    x = (0.2 * torch.randn(cfg.T, cfg.d, device=dev, dtype=torch.bfloat16)).requires_grad_()
    dout = 0.2 * torch.randn(cfg.T, cfg.d, device=dev, dtype=torch.bfloat16)

    def fwd():
      return moe(x)[0]

    def fwdbwd():
      moe.zero_grad(set_to_none=True)
      x.grad = None
      moe(x)[0].backward(dout)

    def timed(fn):
      t0 = time.perf_counter()
      fn()
      torch.cuda.synchronize()
      first = time.perf_counter() - t0
      for _ in range(warmup):
        fn()
      torch.cuda.synchronize()
      samples = []
      for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b))
      return {"ms": statistics.median(samples), "first_call_s": first, "samples_ms": samples}

    out: dict = {"timer": "cuda-events", "autotuning": "off" if note == "ok" else note}
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    if "fwd" in modes or "bwd" in modes:
      out["fwd"] = timed(fwd)
    if "fwdbwd" in modes or "bwd" in modes:
      out["fwdbwd"] = timed(fwdbwd)
    out["peak_extra_bytes"] = int(torch.cuda.max_memory_allocated() - base)
    moe = x = dout = None  # frees the GPU memory (the closures above hold these cells)
    torch.cuda.empty_cache()
    return out
