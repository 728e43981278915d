"""CPU smoke tests of the benchmark CLI, its checks, reports and the README generator."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sonic_jax.bench import cli, configs, readme, report
from sonic_jax.bench.impls import SonicBackend, make_impl
from sonic_jax.bench.problems import RoutingSpec
from sonic_jax.bench.runner import Options, Runner, check_against_xla, check_config
from sonic_jax.bench.timing import on_gpu
from sonic_jax.xla_backend import XlaKernels

SMOKE = "32,64,64,6,2"  # T, d, n, E (not a power of two), K


def test_paper_configs_and_flops():
  assert len(configs.PAPER_CONFIGS) == 12
  c = configs.parse_configs("paper-7B-n256")[0]
  assert c.shape == (24576, 1536, 256, 128, 8) and c.paper_tflops == (363, 403)
  # The spec's table: 1.4B forward = 387 GFLOP, 120B = 6597 GFLOP.
  assert round(configs.flops("fwd", 40960 * 8, 768, 256) / 1e9) == 387
  assert round(configs.flops("fwd", 32768 * 4, 4096, 2048) / 1e9) == 6597
  assert configs.flops("fwdbwd", 10, 3, 5) == 18 * 10 * 3 * 5
  names = [p.name for p in configs.parse_configs("presets")]
  assert names == ["OLMoE-1B-7B", "Qwen3-30B-A3B", "DeepSeek-V3-like", "Mixtral-8x7B"]
  both = configs.parse_configs(["all", "Mixtral-8x7B", "8,16,32,4,2"])
  assert len(both) == 17 and both[-1].shape == (8, 16, 32, 4, 2)
  with pytest.raises(ValueError, match="neither a group"):
    configs.parse_configs("nonsense")
  with pytest.raises(ValueError, match="K must be <= E"):
    configs.BenchConfig("bad", 8, 8, 8, 2, 3)


def test_zipf_routing_is_skewed_and_deterministic():
  spec = RoutingSpec(dist="zipf", zipf_s=1.2)
  b = spec.logit_bias(8)
  assert b[0] == 0 and np.all(np.diff(b) < 0)
  np.testing.assert_array_equal(b, RoutingSpec(dist="zipf", zipf_s=1.2).logit_bias(8))
  assert RoutingSpec().logit_bias(8) is None
  with pytest.raises(ValueError, match="routing method"):
    RoutingSpec(method="bogus")


def test_check_config_shrinks_big_layers():
  big = configs.parse_configs("DeepSeek-V3-like")[0]
  small = check_config(big, RoutingSpec(), Options())
  assert (small.d, small.n) == (big.d, big.n) and small.E < big.E and small.E >= 2 * small.K
  assert 3 * small.E * small.d * small.n * 2 <= 2**30 or small.E == 2 * small.K


class _BrokenKernels(XlaKernels):
  """The xla backend with a wrong down projection: the check must catch it."""
  name = "broken"

  def down_proj(self, a, w2, plan):
    return 1.1 * super().down_proj(a, w2, plan)


def test_check_catches_a_wrong_backend():
  cfg = configs.parse_configs(SMOKE)[0]
  spec = RoutingSpec(method="tr", tile=4)  # token rounding: padded rows, uneven tokens
  bad = SonicBackend("broken", "backend", spec_name="xla")
  bad._kernels = _BrokenKernels()
  cache = {}
  res = check_against_xla(bad, cfg, spec, Options(), cache)
  assert not res["ok"] and res["errs"]["out"] > 0.05
  assert res["errs"]["dw1"] < 1e-6  # the broken down_proj does not touch the backward
  good = check_against_xla(make_impl("lax-ragged"), cfg, spec, Options(), cache)
  assert good["ok"] and good["max_rel_err"] < 1e-2, good


def test_cli_smoke_json_markdown_plots_and_readme(tmp_path, capsys):
  out = tmp_path / "results"
  rc = cli.main(["--configs", SMOKE, "--backends", "xla",
                 "--baselines", "mgpu-grouped,tokamax,sonicmoe-torch,dense-ceiling",
                 "--iters", "2", "--warmup", "1", "--out-dir", str(out)])
  assert rc == 0
  text = capsys.readouterr().out
  assert "f+b TF/s" in text and "T32-d64-n64-E6-K2" in text
  (js,) = out.glob("bench-cpu-*.json")
  doc = json.loads(js.read_text())
  assert doc["meta"]["complete"] and doc["meta"]["platform"] == "cpu"
  assert doc["meta"]["route_impl"] == "xla"  # "auto" routes with xla on a CPU
  rows = {r["impl"]: r for r in doc["results"]}
  xla = rows["xla"]
  assert xla["status"] == "ok" and xla["check"]["reason"] == "reference"
  for mode, factor in (("fwd", 6), ("fwdbwd", 18)):
    m = xla["modes"][mode]
    assert m["ms"] > 0 and m["timer"] == "wall" and m["compile_s"] > 0
    assert m["tflops"] == pytest.approx(factor * 32 * 2 * 64 * 64 / m["ms"] / 1e9)
    assert m["footprint_bytes"] > 0
  assert xla["modes"]["bwd"]["ms"] == pytest.approx(
      xla["modes"]["fwdbwd"]["ms"] - xla["modes"]["fwd"]["ms"])
  # H (P, 2n) bf16 is the big saved activation of the sonic block.
  assert xla["saved_act_bytes"] >= 32 * 2 * 128 * 2
  # Memory above weights and inputs: the recorded argument bytes equal the shape estimate used
  # for rows recorded before they were stored.
  for mode in ("fwd", "fwdbwd"):
    recorded = xla["modes"][mode]["argument_bytes"]
    stripped = {**xla, "modes": {mode: {k: v for k, v in xla["modes"][mode].items()
                                        if k != "argument_bytes"}}}
    assert report._argument_bytes(stripped, mode) == recorded
  assert report.memory_bytes(xla) == (xla["modes"]["fwdbwd"]["footprint_bytes"]
                                      - xla["modes"]["fwdbwd"]["argument_bytes"])
  ceiling = rows["dense-ceiling"]
  recorded = ceiling["modes"]["fwdbwd"]["argument_bytes"]
  stripped = {**ceiling, "modes": {"fwdbwd": {"footprint_bytes": 1}}}
  assert report._argument_bytes(stripped, "fwdbwd") == recorded
  assert rows["tokamax"]["status"] == "skipped"
  assert rows["mgpu-grouped"]["status"] == "skipped" and "GPU" in rows["mgpu-grouped"]["reason"]
  assert rows["sonicmoe-torch"]["status"] == "skipped"
  assert rows["dense-ceiling"]["status"] == "ok"
  md = js.with_suffix(".md").read_text()
  assert "| T32-d64-n64-E6-K2 | xla |" in md and "Command:" in md
  try:
    import matplotlib  # noqa: F401
    assert os.path.exists(str(js)[:-5] + "-tflops.png")
    assert os.path.exists(str(js)[:-5] + "-memory.png")
  except ImportError:
    pass

  # README: only the text between the markers changes; --check sees staleness.
  rd = tmp_path / "README.md"
  rd.write_text("# t\n\nbefore\n<!-- bench:start -->\nstale\n<!-- bench:end -->\nafter\n")
  args = ["--readme", str(rd), "--results-dir", str(out), "--allow-cpu"]
  assert readme.main(args + ["--check"]) == 1
  assert readme.main(args) == 0
  new = rd.read_text()
  assert new.startswith("# t\n\nbefore\n<!-- bench:start -->\n")
  assert new.endswith("<!-- bench:end -->\nafter\n") and "stale" not in new
  assert "| T32-d64-n64-E6-K2 | 32, 64, 64, 6, 2 |" in new
  assert readme.main(args + ["--check"]) == 0
  # Without GPU results (and without --allow-cpu) the section says so instead of inventing.
  assert readme.main(["--readme", str(rd), "--results-dir", str(out)]) == 0
  assert "No GPU benchmark results" in rd.read_text()


def test_readme_needs_markers(tmp_path):
  with pytest.raises(ValueError, match="exactly one"):
    readme.splice("no markers here", "x")
  with pytest.raises(ValueError, match="comes before"):
    readme.splice(f"{readme.END} a {readme.START}", "x")
  rd = tmp_path / "README.md"
  rd.write_text("nothing\n")
  assert readme.main(["--readme", str(rd), "--results-dir", str(tmp_path)]) == 2
  assert rd.read_text() == "nothing\n"


def test_failures_are_rows_not_crashes(tmp_path, monkeypatch):
  from sonic_jax.bench import impls

  def boom(self, problem, spec):
    raise RuntimeError("kernel exploded")

  monkeypatch.setattr(impls.PlainMoE, "prepare", boom)
  cfg = configs.parse_configs(SMOKE)
  runner = Runner(cfg, ["lax-ragged", "dense-ceiling"], RoutingSpec(),
                  Options(modes=("fwd",), iters=1, warmup=0),
                  json_path=str(tmp_path / "r.json"), progress=lambda s: None)
  doc = runner.run()
  rows = {r["impl"]: r for r in doc["results"]}
  assert rows["lax-ragged"]["status"] == "failed"
  assert "kernel exploded" in rows["lax-ragged"]["reason"]
  assert rows["lax-ragged"]["check"] is None  # nothing measured, nothing to check
  assert rows["dense-ceiling"]["status"] == "ok" and set(rows["dense-ceiling"]["modes"]) == {"fwd"}
  assert "failed" in report.terminal_table(doc)
  assert json.loads((tmp_path / "r.json").read_text())["meta"]["complete"]


def test_isolated_children_rows_are_merged(tmp_path):
  out = tmp_path / "iso"
  rc = cli.main(["--configs", SMOKE, "--backends", "pallas", "--baselines", "dense-ceiling",
                 "--modes", "fwd", "--iters", "1", "--warmup", "0", "--isolate", "--no-plots",
                 "--out-dir", str(out), "--quiet"])
  assert rc == 0
  (js,) = out.glob("*.json")
  doc = json.loads(js.read_text())
  rows = {r["impl"]: r for r in doc["results"]}
  assert doc["meta"]["isolated"] and doc["meta"]["complete"]
  assert rows["dense-ceiling"]["status"] == "ok" and rows["dense-ceiling"]["modes"]["fwd"]["ms"] > 0
  if not on_gpu():
    assert rows["pallas"]["status"] == "skipped" and "unavailable" in rows["pallas"]["reason"]
  assert not list(out.glob("*parts*"))

  # A child that dies leaves "failed" rows with the reason, and the parent carries on.
  from sonic_jax.bench.isolate import run_isolated
  runner = Runner(configs.parse_configs(SMOKE), ["dense-ceiling"], RoutingSpec(),
                  Options(modes=("fwd",)), progress=lambda s: None)
  doc = run_isolated(runner, ["--configs", SMOKE, "--modes", "bogus"], str(tmp_path / "w"))
  (row,) = doc["results"]
  assert row["status"] == "failed" and "exited with code 2" in row["reason"], row


def _pallas_interpret_or_skip():
  try:
    from sonic_jax.pallas.backend import PallasKernels
    return PallasKernels(interpret=True)
  except Exception as e:  # noqa: BLE001 - the backend is still being written
    pytest.skip(f"PallasKernels(interpret=True) is not usable yet: {type(e).__name__}: {e}")


@pytest.mark.slow
def test_pallas_interpret_check_and_timing():
  _pallas_interpret_or_skip()
  # d, n: multiples of the kernels' K/N blocks (128) so the pallas backend accepts the shape
  cfg = configs.parse_configs("64,128,128,6,2")
  runner = Runner(cfg, ["pallas-interpret"], RoutingSpec(),
                  Options(modes=("fwd",), iters=1, warmup=0), progress=lambda s: None)
  doc = runner.run()
  (row,) = doc["results"]
  assert doc["meta"]["complete"]
  if row["status"] != "ok":
    # The bench recorded the backend's failure instead of crashing; the kernels' own tests
    # (tests/test_pallas_*.py) own that bug.
    assert row["status"] in ("failed", "partial") and row["reason"].startswith("failed: ")
    pytest.skip(f"pallas backend fails in the interpreter at this size: {row['reason']}")
  assert row["modes"]["fwd"]["ms"] > 0 and row["modes"]["fwd"]["timer"] == "wall"
  assert row["check"]["ok"], row["check"]


def test_check_only_run_is_merged_into_the_timed_row(tmp_path):
  """--check-only runs the checks and no timing; merge adds its check to the timed row of an
  earlier run (a full run split over device calls)."""
  from sonic_jax.bench import merge
  out = tmp_path / "r"
  common = ["--configs", SMOKE, "--backends", "xla", "--baselines", "mgpu-grouped",
            "--out-dir", str(out), "--no-plots", "--quiet"]
  assert cli.main(common + ["--no-check", "--iters", "1", "--warmup", "0", "--modes", "fwd",
                            "--tag", "timed"]) == 0
  assert cli.main(common + ["--check-only", "--tag", "checks"]) == 0
  (timed,) = out.glob("*-timed.json")
  (checks,) = out.glob("*-checks.json")
  doc = json.loads(checks.read_text())
  rows = {r["impl"]: r for r in doc["results"]}
  assert rows["xla"]["status"] == "check-only" and rows["xla"]["modes"] == {}
  assert rows["xla"]["check"] == {"ok": True, "reason": "reference"}
  assert rows["mgpu-grouped"]["status"] == "skipped"  # nothing runs where it cannot
  merged = merge.merge([(str(timed), json.loads(timed.read_text())), (str(checks), doc)])
  rows = {r["impl"]: r for r in merged["results"]}
  assert rows["xla"]["status"] == "ok" and rows["xla"]["modes"]["fwd"]["ms"] > 0
  assert rows["xla"]["check"]["ok"] and rows["xla"]["check_source"] == checks.name
  assert rows["xla"]["source"] == timed.name
  with pytest.raises(SystemExit):
    cli.main(common + ["--check-only", "--no-check"])


def _fake_gpu_doc():
  """A results document shaped like a GPU run (numbers are made up for rendering only)."""
  cfg = configs.parse_configs("paper-7B-n256")[0]
  base = {"config": cfg.name, "T": cfg.T, "d": cfg.d, "n": cfg.n, "E": cfg.E, "K": cfg.K,
          "routing": "topk", "paper_tflops": list(cfg.paper_tflops),
          "sonic_h200_tflops": list(cfg.sonic_h200_tflops)}
  ok = {"status": "ok", "reason": None, "check": {"ok": True, "max_rel_err": 4e-3},
        "saved_act_bytes": 2**30, "modes": {
            "fwd": {"ms": 1.0, "tflops": 300.0, "compile_s": 5.0, "footprint_bytes": 3 * 2**30},
            "bwd": {"ms": 2.0, "tflops": 310.0},
            "fwdbwd": {"ms": 3.0, "tflops": 305.0, "compile_s": 9.0,
                       "footprint_bytes": 5 * 2**30, "argument_bytes": 2**30}}}
  rows = [{**base, "impl": "pallas", "kind": "backend", **ok},
          {**base, "impl": "tokamax", "kind": "baseline", **ok,
           "check": {"ok": False, "max_rel_err": 5e-2}},
          {**base, "impl": "ffi", "kind": "backend", "status": "skipped",
           "reason": "unavailable: not built", "modes": {}}]
  meta = {"date": "2026-12-02 12:00 UTC", "device": "h200", "device_kind": "NVIDIA H200",
          "platform": "gpu", "versions": {"jax": "0.11.2"}, "command": "x", "routing": "topk",
          "options": {"warmup": 2, "iters": 10, "bwd_direct": False, "check_tol": 0.03},
          "timing": "cupti", "flops": "paper", "complete": True}
  return {"meta": meta, "results": rows}


def test_gpu_shaped_results_render(tmp_path):
  doc = _fake_gpu_doc()
  md = report.markdown(doc)
  assert "Against the paper" in md and "| paper-7B-n256 | pallas | 300 | 363 | 310 | 403 |" in md
  (tmp_path / "bench-h200-2026-12-02.json").write_text(json.dumps(doc))
  sec = readme.section(readme.select(readme.load_results(str(tmp_path))),
                       str(tmp_path / "README.md"))
  assert "NVIDIA H200" in sec and "paper H100 SonicMoE" in sec
  assert "| paper-7B-n256 | 24576, 1536, 256, 128, 8 | 300 / 310 / 305 | 300 / 310 / 305 ✗ |" in sec
  assert "363 / 403 | 240 / 303 | 4.00 |" in sec  # paper, original H200, pallas GiB above args
  header = next(line for line in sec.split("\n") if line.startswith("| config |"))
  assert "pallas" in header and "ffi" not in header  # a backend that never ran: no column


def test_merge_keeps_measured_rows_and_readme_shows_only_the_merge(tmp_path):
  from sonic_jax.bench import merge
  old = _fake_gpu_doc()  # pallas ok, tokamax ok, ffi skipped
  new = _fake_gpu_doc()
  new["meta"]["date"] = "2026-12-02 15:00 UTC"
  new["meta"]["notes"] = ["second run"]
  for r in new["results"]:
    if r["impl"] == "pallas":
      r["modes"]["fwd"]["tflops"] = 400.0  # newer measurement wins
    elif r["impl"] == "tokamax":
      r.update(status="skipped", reason="skipped: not asked", modes={})  # older one kept
    else:
      r.update(status="ok", reason=None, modes={"fwd": {"ms": 1.0, "tflops": 350.0}})
  a, b = tmp_path / "bench-h200-a.json", tmp_path / "bench-h200-b.json"
  a.write_text(json.dumps(old))
  b.write_text(json.dumps(new))
  out = tmp_path / "bench-h200-merged.json"
  assert merge.main([str(out), str(a), str(b), "--no-plots", "--note", "joined"]) == 0
  doc = json.loads(out.read_text())
  rows = {r["impl"]: r for r in doc["results"]}
  assert rows["pallas"]["modes"]["fwd"]["tflops"] == 400.0
  assert rows["pallas"]["source"] == b.name
  assert rows["tokamax"]["status"] == "ok" and rows["tokamax"]["source"] == a.name
  assert rows["ffi"]["status"] == "ok"
  assert [s["file"] for s in doc["meta"]["merged_from"]] == [a.name, b.name]
  assert doc["meta"]["notes"] == ["joined", f"[{b.name}] second run"]
  chosen = readme.select(readme.load_results(str(tmp_path)))
  assert [p for p, _ in chosen] == [str(out)]
  other = _fake_gpu_doc()
  other["meta"]["routing"] = "tr"
  with pytest.raises(ValueError, match="routing"):
    merge.merge([("x.json", old), ("y.json", other)])


def test_merge_extend_puts_an_earlier_merges_runs_first(tmp_path, capsys):
  """--extend: the runs of an earlier merge come first (a newer run's rows win), its own notes
  are printed and not carried; a document that is not a merge is refused."""
  from sonic_jax.bench import merge
  docs = []
  for i, tflops in enumerate((300.0, 350.0, 400.0)):
    doc = _fake_gpu_doc()
    doc["meta"]["date"] = f"2026-12-0{i + 2} 10:00 UTC"
    for r in doc["results"]:
      if r["impl"] == "pallas":
        r["modes"]["fwd"]["tflops"] = tflops
    path = tmp_path / f"bench-h200-run{i}.json"
    path.write_text(json.dumps(doc))
    docs.append(path)
  first = tmp_path / "bench-h200-merged-1.json"
  assert merge.main([str(first), str(docs[0]), str(docs[1]), "--no-plots",
                     "--note", "old summary"]) == 0
  capsys.readouterr()
  second = tmp_path / "bench-h200-merged-2.json"
  assert merge.main([str(second), str(docs[2]), "--extend", str(first), "--no-plots",
                     "--note", "new summary"]) == 0
  assert "(not carried from bench-h200-merged-1.json) old summary" in capsys.readouterr().out
  doc = json.loads(second.read_text())
  assert [s["file"] for s in doc["meta"]["merged_from"]] == [p.name for p in docs]
  assert doc["meta"]["notes"][0] == "new summary" and "old summary" not in doc["meta"]["notes"]
  rows = {r["impl"]: r for r in doc["results"]}
  assert rows["pallas"]["modes"]["fwd"]["tflops"] == 400.0
  assert rows["pallas"]["source"] == docs[2].name
  with pytest.raises(SystemExit, match="not a merged document"):
    merge.main([str(tmp_path / "x.json"), str(docs[2]), "--extend", str(docs[0])])


def test_merge_marks_rows_timed_on_the_gradients_only_step(tmp_path):
  """Runs without meta["fwdbwd_step"] timed the JAX rows on the gradients-only step: the merge
  marks those rows (not the PyTorch baseline's, which always ran the whole step, nor rows of
  newer runs), and the README flags their bwd, f+b and memory cells with a dagger."""
  from sonic_jax.bench import merge
  from sonic_jax.bench.runner import FWDBWD_STEP
  old = _fake_gpu_doc()
  for r in old["results"]:
    if r["impl"] == "ffi":  # stands in for the PyTorch baseline of an old run
      r.update(impl="sonicmoe-torch", kind="baseline", status="ok", reason=None,
               modes=dict(old["results"][0]["modes"]))
  new = _fake_gpu_doc()
  new["meta"]["date"] = "2026-12-02 15:00 UTC"
  new["meta"]["fwdbwd_step"] = FWDBWD_STEP
  new["results"] = [r for r in new["results"] if r["impl"] == "pallas"]
  doc = merge.merge([("a.json", old), ("b.json", new)])
  steps = {r["impl"]: r["fwdbwd_step"] for r in doc["results"]}
  assert steps == {"pallas": FWDBWD_STEP, "tokamax": merge.OLD_STEP,
                   "sonicmoe-torch": FWDBWD_STEP}
  out = tmp_path / "bench-h200-merged.json"
  out.write_text(json.dumps(doc))
  sec = readme.section([(str(out), doc)], str(tmp_path / "README.md"))
  row = next(line for line in sec.split("\n") if line.startswith("| paper-7B-n256 |"))
  assert "300 / 310 / 305 |" in row and "† / " in row  # pallas clean, tokamax daggered
  assert "†: timed before the benchmark's fwd+bwd step returned" in sec
  new_only = merge.merge([("b.json", new)])
  sec = readme.section([(str(out), new_only)], str(tmp_path / "README.md"))
  assert "†" not in sec and "‡" not in sec
  new["meta"]["fwdbwd_step"] = merge.UNORDERED_STEP  # session 10's first runs
  sec = readme.section([(str(out), merge.merge([("b.json", new)]))], str(tmp_path / "README.md"))
  assert "| 4.00‡ |" in sec and "300 / 310 / 305 |" in sec and "‡: memory of a step" in sec


def test_dense_ceiling_backward_runs_bf16_gemms():
  """The ceiling's fwd+bwd has only bf16 x bf16 dots (fp32 GEMMs would lower the ceiling)."""
  import jax
  import jax.numpy as jnp
  from sonic_jax.bench import impls
  t, d, n = 64, 32, 16
  layer = None

  class _P:  # the fields DenseCeiling.prepare reads
    cfg = configs.parse_configs(f"{t},{d},{n},4,2")[0]
    x = jnp.zeros((t, d), jnp.bfloat16)
    w1 = jnp.zeros((4, d, 2 * n), jnp.bfloat16)
    w2 = jnp.zeros((4, n, d), jnp.bfloat16)

  layer, args = impls.make_impl("dense-ceiling").prepare(_P, None)

  def step(*a):
    out, vjp = jax.vjp(layer, *a)
    return vjp(out)

  eqns = [e for e in jax.make_jaxpr(step)(*args).jaxpr.eqns if e.primitive.name == "dot_general"]
  assert len(eqns) == 6  # 2 forward + 4 backward GEMMs
  for e in eqns:
    assert [v.aval.dtype for v in e.invars] == [jnp.bfloat16] * 2, e


def test_readme_ceiling_cell_has_no_backward():
  """The dense ceiling's (fwd+bwd) - fwd understates its backward: its cell leaves bwd out."""
  row = {**_fake_gpu_doc()["results"][0], "impl": "dense-ceiling", "kind": "ceiling"}
  assert readme._cell(row) == "300 / – / 305"


def test_routing_impl_option():
  assert RoutingSpec(route_impl="pallas_triton").route_impl == "pallas_triton"
  with pytest.raises(ValueError, match="route_impl must be one of"):
    RoutingSpec(route_impl="cuda")
  with pytest.raises(SystemExit):
    cli.main(["--configs", SMOKE, "--backends", "xla", "--routing-impl", "cuda"])


def test_training_forward_returns_no_copy_of_the_inputs():
  """The timed forward keeps every residual but the layer's own inputs: jax.vjp's residuals
  include x and the weights, which a jitted program would copy into fresh output buffers."""
  from sonic_jax.bench.runner import training_forward
  from sonic_jax.moe import moe
  t, d, n, e, k = 32, 64, 64, 4, 2
  ks = jax.random.split(jax.random.key(0), 4)
  args = (jax.random.normal(ks[0], (t, d), jnp.bfloat16),
          jax.random.normal(ks[1], (d, e), jnp.bfloat16),
          jax.random.normal(ks[2], (e, d, 2 * n), jnp.bfloat16) * 0.1,
          jax.random.normal(ks[3], (e, n, d), jnp.bfloat16) * 0.1)
  layer = lambda *a: moe(*a, top_k=k, backend="xla")

  def forwarded(f):
    jaxpr = jax.make_jaxpr(f)(*args).jaxpr
    return sum(any(o is i for i in jaxpr.invars) for o in jaxpr.outvars)

  assert forwarded(lambda *a: jax.vjp(layer, *a)) == 4  # x, router_w, w1, w2
  assert forwarded(training_forward(layer)) == 0
  out, res = jax.jit(training_forward(layer))(*args)
  assert out.shape == (t, d) and len(res) == len(jax.tree.leaves(jax.vjp(layer, *args)[1])) - 4


# ------------------------------------------------------------------ diagnostic variant specs
def test_bench_variants_parse_gathers_and_options():
  """The variant specs of benchmarks/kernel_profile.py and memory_report.py build the backend
  they name; a bad spec exits with the grammar."""
  import dataclasses
  from sonic_jax.bench.variants import kernels_for
  from sonic_jax.pallas.dh import dh_config_for

  assert kernels_for("xla") == "xla" and kernels_for("auto") == "auto"
  assert kernels_for("pallas+ffi") == "pallas+ffi"  # a backends.COMBINED name, not a mix spec
  assert kernels_for("auto+dw1=xla", 4096, 1024).base.name == "xla"  # auto on the CPU is xla
  k = kernels_for("pallas")
  assert (k.backward_gathers, k.dw1_last, k.config.dh) == ("auto", True, None)
  k = kernels_for("pallas:fused-x:dw1-early")
  assert (k.backward_gathers, k.dw1_last) == ("fused-x", False)
  k = kernels_for("pallas::row_gather=jax_triton:dh.block_k=32", 4096, 1024)
  assert (k.row_gather, k.config.dh.block_k) == ("jax_triton", 32)
  assert kernels_for("pallas::row_gather=pallas_triton").row_gather == "pallas_triton"
  with pytest.raises(SystemExit, match="row_gather must be one of"):
    kernels_for("pallas::row_gather=cub")
  k = kernels_for("pallas::dh-ring", 4096, 1024)
  assert k.config.dh == dataclasses.replace(dh_config_for(4096, 1024), ring=True,
                                            max_concurrent_steps=3)
  k = kernels_for("pallas::dh.block_n=64:dh.ctas_per_sm=2", 4096, 1024)
  assert (k.config.dh.block_n, k.config.dh.ctas_per_sm) == (64, 2)
  # Forward kernels too, on top of their per-shape defaults; words and booleans.
  k = kernels_for("pallas::up_proj.block_k=32:down_proj.grid_tile_width=4:"
                  "dx_pairs.epilogue_swizzle=true", 4096, 1024)
  up = k._up_config(4096, 1024)
  assert up.block_k == 32 and up.gather == kernels_for("pallas")._up_config(4096, 1024).gather
  assert k.config.down_proj.grid_tile_width == 4 and k.config.dx_pairs.epilogue_swizzle is True
  with pytest.raises(SystemExit, match="wg_split"):  # GemmConfig's own validation
    kernels_for("pallas::down_proj.wg_split=m:down_proj.cross_tile=false", 4096, 1024)
  for bad in ("triton", "pallas::nope", "pallas::dh.nope=3", "pallas::dh.block_n=6.4",
              "pallas::combine.block_d=8"):
    with pytest.raises(SystemExit, match="unknown variant"):
      kernels_for(bad, 768, 512)
  with pytest.raises(SystemExit, match="DhConfig.block_n"):  # the config's own validation
    kernels_for("pallas::dh.block_n=0", 768, 512)
  with pytest.raises(SystemExit, match="needs the config's d and n"):
    kernels_for("pallas::dh-ring")
  with pytest.raises(SystemExit, match="dh-ring takes XLA's gathered dO"):
    kernels_for("pallas:fused:dh-ring", 4096, 512)
  # pingpong: the forward GEMMs named on configs.pingpong_config, fields on top.
  from sonic_jax.pallas.configs import pingpong_config
  k = kernels_for("pallas::pingpong", 4096, 1024)
  assert k.config.up_proj == pingpong_config(4096, 1024, epilogue="swiglu")
  assert k.config.down_proj == pingpong_config(1024, 4096)
  assert k.config.dx_pairs == pingpong_config(2048, 4096)
  assert k.config.up_proj.pingpong and k.config.up_proj.gather == "fused"
  assert k.config.down_proj.cross_tile and k.config.dh is None
  k = kernels_for("pallas::pingpong=up_proj:up_proj.max_concurrent_steps=4", 4096, 1024)
  assert k.config.up_proj == pingpong_config(4096, 1024, epilogue="swiglu").__class__(
      **{**pingpong_config(4096, 1024, epilogue="swiglu").__dict__, "max_concurrent_steps": 4})
  assert k.config.down_proj is None and k.config.dx_pairs is None
  with pytest.raises(SystemExit, match="pingpong= takes kernels from"):
    kernels_for("pallas::pingpong=dh", 4096, 1024)
  with pytest.raises(SystemExit, match="pingpong_config: n \\(192\\) must be a multiple"):
    kernels_for("pallas::pingpong=up_proj", 4096, 192)
  with pytest.raises(SystemExit, match="needs the config's d and n"):
    kernels_for("pallas::pingpong")


def test_bench_variants_parse_ffi_options():
  """ffi[:<option>...] builds the FfiKernels it names (no library needed to build one)."""
  from sonic_jax.bench.variants import kernels_for
  from sonic_jax.ffi.backend import FfiKernels
  assert kernels_for("ffi") == FfiKernels()
  k = kernels_for("ffi:dw1-last:row_gather=gather")
  assert k == FfiKernels(dw1_last=True, row_gather="gather") and k.dw1_last
  assert kernels_for("ffi:fused-gather").fused_gather
  assert kernels_for("ffi:fused_epilogue=dh") == FfiKernels(fused_epilogue="dh")
  assert kernels_for("ffi:dswiglu=warp").dswiglu == "warp"
  assert kernels_for("ffi:fused_epilogue=dh:gather_schedule=tma_b") == FfiKernels(
      fused_epilogue="dh", gather_schedule="tma_b")
  with pytest.raises(SystemExit, match="dswiglu must be 'block' or 'warp'"):
    kernels_for("ffi:dswiglu=grid")
  with pytest.raises(SystemExit, match="unknown variant 'ffi:nope'"):
    kernels_for("ffi:nope")
  with pytest.raises(SystemExit, match="row_gather must be 'gather' or 'scatter'"):
    kernels_for("ffi:row_gather=xla")
  k = kernels_for("ffi:schedule=VARLEN_M_NN_BF16@COOPERATIVE_128x256_C2x1:"
                  "schedule=VARLEN_K_BF16@PINGPONG_128x128_C2x1")
  assert k == FfiKernels(schedules={"VARLEN_K_BF16": "PINGPONG_128x128_C2x1",
                                    "VARLEN_M_NN_BF16": "COOPERATIVE_128x256_C2x1"})
  with pytest.raises(SystemExit, match="config must be one of .* for VARLEN_K_BF16"):
    kernels_for("ffi:schedule=VARLEN_K_BF16@PINGPONG_64x256_C2x1")
  assert kernels_for("ffi:up_proj_epilogue=gemm") == FfiKernels(up_proj_epilogue="gemm")
  with pytest.raises(SystemExit, match="up_proj_epilogue must be one of"):
    kernels_for("ffi:up_proj_epilogue=fused")
  with pytest.raises(SystemExit, match="fused_epilogue and fused_gather must not name up_proj"):
    kernels_for("ffi:up_proj_epilogue=gemm:fused_epilogue=both")


def test_timed_fwdbwd_step_runs_the_whole_forward():
  """The layer benchmark's forward+backward (runner.fwdbwd_step) returns the layer's output, so
  XLA keeps the forward's down projection and combine, which the backward does not read: with
  the gradients alone the compiled step has one GEMM fewer and the timing misses it."""
  import re

  from sonic_jax.bench.problems import make_problem, sonic_layer
  from sonic_jax.bench.runner import fwdbwd_step

  cfg = configs.BenchConfig("t", 256, 128, 64, 8, 2)
  p = make_problem(cfg)
  layer = sonic_layer("xla", cfg, RoutingSpec())

  def grads_only(*a):
    *xs, g = a
    return jax.vjp(layer, *xs)[1](g)

  def dots(fn):
    text = jax.jit(fn).lower(*p.args, p.dout).compile().as_text()
    return len(re.findall(r"\bdot\(", text))

  step = fwdbwd_step(layer)
  out, grads = jax.jit(step)(*p.args, p.dout)
  np.testing.assert_array_equal(np.asarray(out, np.float32),
                                np.asarray(jax.jit(layer)(*p.args), np.float32))
  assert len(grads) == 4
  assert dots(step) == dots(grads_only) + 1  # the down projection
  # The cotangent waits for the whole output, as a loss's would.
  assert "stablehlo.optimization_barrier" in jax.jit(step).lower(*p.args, p.dout).as_text()


def test_rel_errs_flags_non_finite_on_either_side():
  from sonic_jax.bench.runner import rel_errs
  a = jnp.ones((4, 3), jnp.bfloat16)
  b = a.at[0, 0].set(2.0)
  err = float(rel_errs(a, b))
  assert abs(err - 1.0 / np.sqrt(15.0)) < 1e-6
  assert np.isnan(float(rel_errs(a.at[1, 1].set(jnp.nan), b)))
  assert np.isnan(float(rel_errs(a, b.at[1, 1].set(jnp.inf))))


def test_kernel_profile_medians_skip_shifted_iterations():
  """timing.kernel_medians (benchmarks/kernel_profile.py, power_trace.py): an iteration with an
  extra kernel (which would shift every later index) is left out of the per-kernel medians but
  counts in the median total."""
  from sonic_jax.bench.timing import kernel_medians
  usual = [("up", 7.0), ("gather", 1.5), ("dh", 5.0)]
  shifted = [("memset", 0.1), ("up", 7.2), ("gather", 1.4), ("dh", 5.1)]
  names, med, total, kept = kernel_medians([usual, shifted, usual, usual])
  assert names == ["up", "gather", "dh"] and kept == 3
  assert med == [7.0, 1.5, 5.0]
  assert total == pytest.approx(13.5)


def test_kernel_profile_drift_is_the_median_ratio_of_matching_kernels():
  """benchmarks/kernel_profile.py's drift against the first variant: the median t / t_ref over
  kernels with the same launch index and name from min_ms up, robust to the kernel a variant
  changes; (nan, 0) when nothing matches."""
  mod = _load_benchmark("kernel_profile")
  ref = [("up", 7.0), ("tiny", 0.01), ("down", 3.0), ("dh", 4.0), ("dw", 3.5)]
  # Everything 5 % slower, dh 20 % faster: the drift is the unchanged kernels' 1.05.
  var = [("up", 7.35), ("tiny", 0.5), ("down", 3.15), ("dh", 3.2), ("dw", 3.675)]
  drift, n = mod._drift(ref, var, 0.3)
  assert n == 4 and drift == pytest.approx(1.05)
  assert mod._drift(ref, ref, 0.3) == (1.0, 4)
  drift, n = mod._drift(ref, [("other", 1.0)], 0.3)
  assert n == 0 and np.isnan(drift)


def _scored_doc():
  """Two paper configs (auto prefers pallas at 7B-n256, ffi at 30B-n512) with pallas, ffi and
  the original SonicMoE's rows; made-up f+b numbers chosen so every ratio is exact."""
  rows = []
  for name, fb in (("paper-7B-n256", {"pallas": 400.0, "ffi": 380.0, "sonicmoe-torch": 350.0}),
                   ("paper-30B-n512", {"pallas": 480.0, "ffi": 560.0, "sonicmoe-torch": 500.0})):
    cfg = configs.parse_configs(name)[0]
    base = {"config": cfg.name, "T": cfg.T, "d": cfg.d, "n": cfg.n, "E": cfg.E, "K": cfg.K,
            "routing": "topk", "paper_tflops": list(cfg.paper_tflops)}
    for impl, v in fb.items():
      rows.append({**base, "impl": impl, "status": "ok",
                   "kind": "baseline" if impl == "sonicmoe-torch" else "backend",
                   "modes": {"fwdbwd": {"tflops": v}}})
    rows.append({**base, "impl": "xla", "kind": "backend", "status": "skipped", "modes": {}})
  return {"meta": {}, "results": rows}


def test_targets_scorecard():
  from sonic_jax.bench import targets
  doc = _scored_doc()
  p7 = targets.paper_fwdbwd(configs.parse_configs("paper-7B-n256")[0].paper_tflops)
  assert p7 == pytest.approx(18 / (6 / 363 + 12 / 403))
  card = targets.scorecard(doc)
  assert list(card) == ["pallas", "ffi", "auto"]  # xla is the reference, never scored
  paper, orig, orig11 = card["auto"]
  assert paper.ratios["paper-7B-n256"] == pytest.approx(400 / p7)  # pallas first at n = 256
  assert orig.ratios == {"paper-7B-n256": pytest.approx(400 / 350),
                         "paper-30B-n512": pytest.approx(560 / 500)}  # ffi first at 30B-n512
  assert orig11.met == 2 and not orig11.misses()
  assert card["pallas"][1].cell() == "1 of 2 (30B-n512 0.960×)"
  assert card["ffi"][2].cell() == "1 of 2 (7B-n256 1.086×)"
  md = "\n".join(targets.markdown(doc))
  assert "| target (misses: ratio) | `pallas` | `ffi` | `auto` |" in md
  # An old gradients-only row is not scored; without a second backend there is no auto.
  doc["results"] = [r for r in doc["results"] if r["impl"] != "ffi"]
  doc["results"][0]["fwdbwd_step"] = "grads-only"
  card = targets.scorecard(doc)
  assert list(card) == ["pallas"] and list(card["pallas"][0].ratios) == ["paper-30B-n512"]
  assert targets.markdown({"meta": {}, "results": []}) == []


def _load_benchmark(name: str):
  import importlib.util
  path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", f"{name}.py")
  spec = importlib.util.spec_from_file_location(name, path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


_DX_HLO = """HloModule m

%fused_add (p0: bf16[4,8], p1: bf16[4,8]) -> bf16[4,8] {
  ROOT %add.1 = bf16[4,8]{1,0} add(%p0, %p1)
}

ENTRY %main (a: bf16[4,8], b: bf16[4,8]) -> (bf16[4,8], bf16[4,8]) {
  %a = bf16[4,8]{1,0} parameter(0)
  %b = bf16[4,8]{1,0} parameter(1)
  %gemm = (bf16[4,8]{1,0}, s8[64]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"alpha_real":1,"beta":1}}
  %gte = bf16[4,8]{1,0} get-tuple-element(%gemm), index=0
  %wrapped_add = bf16[4,8]{1,0} fusion(%a, %b), kind=kLoop, calls=%fused_add
  ROOT %tuple = (bf16[4,8]{1,0}, bf16[4,8]{1,0}) tuple(%wrapped_add, %gte)
}
"""


def test_dx_add_reads_the_x_gradients_producer():
  """benchmarks/dx_add.py: the root tuple's operand, through get-tuple-element, to a cuBLAS
  GEMM with its beta (the add folded in), and the count of standalone adds of a shape."""
  mod = _load_benchmark("dx_add")
  got = mod.x_grad_producer(_DX_HLO, index=1)
  assert got.startswith("custom-call gemm target=__cublas$gemm beta=1") and "gte" in got
  assert mod.x_grad_producer(_DX_HLO, index=0) == "fusion wrapped_add kLoop"
  assert mod.standalone_adds(_DX_HLO, "bf16[4,8]") == 1
  assert mod.standalone_adds(_DX_HLO, "bf16[8,8]") == 0


def test_dx_add_runs_and_names_the_producer(capsys):
  """dx_add.py on the CPU: one row per backend with a step time, the count of standalone adds
  of x's shape and the x gradient's producer read from the optimized HLO."""
  mod = _load_benchmark("dx_add")
  mod.main(["--config", "64,32,16,4,2", "--backends", "xla", "--iters", "1", "--warmup", "0"])
  out = capsys.readouterr().out
  rows = [line.split() for line in out.splitlines() if line.startswith("xla")]
  assert len(rows) == 1
  assert float(rows[0][1]) > 0 and rows[0][3].isdigit()
  assert not any(word.startswith("unknown") for word in rows[0][4:])


@pytest.mark.parametrize("path", ["", "@two-step", "@recomputed-router", "@saved-logits",
                                  "@raw-probs"])
def test_bench_layer_for_route_paths_give_moe_gradients(path):
  """The diagnostic benchmarks' route paths (sonic_jax.bench.variants.layer_for) compute the
  layer's values and gradients; an unknown path is refused."""
  import sonic_jax
  from sonic_jax.bench.variants import layer_for
  from tests.helpers import Problem, make_inputs, rel_err

  p = Problem(T=32, d=16, n=8, E=4, K=2)
  args = make_inputs(p)
  ct = jax.random.normal(jax.random.key(2), (p.T, p.d))
  layer = layer_for("xla" + path, p.d, p.n, p.K)

  def grads(fn):
    return jax.grad(lambda *a: jnp.sum(fn(*a) * ct), argnums=(0, 1, 2, 3))(*args)

  want = grads(lambda *a: sonic_jax.moe(*a, top_k=p.K, backend="xla",
                                       renormalize=path != "@raw-probs"))
  for g, r in zip(grads(layer), want):
    assert rel_err(g, r) <= 1e-5
  with pytest.raises(SystemExit, match="route paths"):
    layer_for("xla@cached", p.d, p.n, p.K)


@pytest.mark.parametrize("path", ["", "@two-step"])
def test_bench_layer_for_reads_ffi_schedules_apart_from_route_paths(path, monkeypatch):
  """'@' joins a kind to its schedule in an ffi spec: layer_for passes the whole option to
  FfiKernels and takes a route path only from a last '@' part naming one (session 30's
  kernel profile of two schedule variants failed on that)."""
  import sonic_jax.bench.variants as variants

  seen = []
  monkeypatch.setattr(variants, "kernels_for", lambda spec, d, n: seen.append(spec) or "xla")
  spec = "ffi:schedule=VARLEN_M_NN_BF16@COOPERATIVE_128x256_C2x1"
  assert callable(variants.layer_for(spec + path, 16, 8, 2))
  assert seen == [spec]
  kern = variants._ffi_kernels(spec + ":schedule=VARLEN_K_BF16@TMA_AB_128x256_C1")
  assert {k.name: c.name for k, c in kern.schedules} == {
      "VARLEN_M_NN_BF16": "COOPERATIVE_128x256_C2x1", "VARLEN_K_BF16": "TMA_AB_128x256_C1"}
  with pytest.raises(SystemExit, match="route paths"):
    variants.layer_for(spec + "@cached", 16, 8, 2)


def test_gpu_state_parses_smi_samples_and_summarizes_windows():
  """sonic_jax.bench.gpu_state (benchmarks/power_trace.py, the layer benchmark): nvidia-smi CSV rows become samples (header and cut-off lines
  skipped, '[N/A]' as NaN), and each window reports median power / clocks and every throttle
  reason seen in it."""
  import math
  from datetime import datetime
  from sonic_jax.bench import gpu_state as mod
  lines = [
      "timestamp, power.draw [W], power.limit [W], clocks.current.sm [MHz], "
      "clocks.current.memory [MHz], temperature.gpu, clocks_event_reasons.active",
      "2026/12/07 18:00:00.000, 120.50 W, 700.00 W, 1980 MHz, 3201 MHz, 40, 0x0000000000000001",
      "2026/12/07 18:00:00.500, 690.00 W, 700.00 W, 1755 MHz, 3201 MHz, 52, 0x0000000000000004",
      "2026/12/07 18:00:00.900, 700.00 W, 700.00 W, 1650 MHz, 3201 MHz, 53, 0x0000000000000000",
      "2026/12/07 18:00:01.200, [N/A], 700.00 W, 1700 MHz, 3201 MHz, 54, 0x0000000000000024",
      "2026/12/07 18:00:01.4",  # cut off by the kill
  ]
  rows = mod.parse_smi_csv(lines)
  assert len(rows) == 4
  t0 = datetime(2026, 12, 7, 18, 0, 0).timestamp()
  assert rows[0]["t"] == pytest.approx(t0) and rows[3]["t"] == pytest.approx(t0 + 1.2)
  assert (rows[1]["power_w"], rows[1]["sm_mhz"], rows[1]["reasons"]) == (690.0, 1755.0, 4)
  assert math.isnan(rows[3]["power_w"])
  wins = mod.summarize(rows, t0 + 0.4, t0 + 1.5)
  assert len(wins) == 1  # the window [1.4, 1.5) s holds no sample
  first = wins[0]
  assert (first["t"], first["samples"], first["sm_mhz"]) == (0.0, 3, 1700.0)
  assert first["power_w"] == 695.0  # the N/A sample left out of the median
  assert first["reasons"] == ["sw-power-cap", "sw-thermal"]
  assert mod.reason_names(0) == ["none"] and mod.reason_names(0x1) == ["idle"]
  # One timing's interval: padded by a period, 'idle' left out, N/A power not a median input.
  state = mod.interval_state(rows, t0 + 0.6, t0 + 1.0, pad=0.25)
  assert state == {"samples": 3, "sm_mhz": 1700.0, "sm_mhz_min": 1650.0, "power_w": 695.0,
                   "power_limit_w": 700.0, "temp_c_max": 54.0,
                   "reasons": ["sw-power-cap", "sw-thermal"]}
  assert mod.interval_state(rows, t0 + 5, t0 + 6, pad=0.25) is None
  idle = mod.interval_state(rows, t0, t0, pad=0.1)
  assert idle["reasons"] == ["none"] and idle["samples"] == 1
  na = mod.interval_state([{**rows[3], "sm_mhz": float("nan")}], t0, t0 + 2)
  assert na["sm_mhz"] is None and na["sm_mhz_min"] is None and na["power_w"] is None
  json.dumps(state)  # plain JSON values


_FAKE_SMI = """#!/usr/bin/env python3
# nvidia-smi --query-gpu=... --format=csv,noheader -lms MS: one row of SMI_FIELDS per period.
import datetime, sys, time
ms = int(sys.argv[sys.argv.index("-lms") + 1])
while True:
  now = datetime.datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
  print(f"{now}, 650.00 W, 700.00 W, 1830 MHz, 3201 MHz, 61, 0x0000000000000004", flush=True)
  time.sleep(ms / 1e3)
"""


def test_smi_sampler_records_an_interval_and_cleans_up(tmp_path, monkeypatch):
  """SmiSampler runs nvidia-smi in the background (here a fake one on PATH) and summarizes the
  samples of an interval; stop() ends the process and removes its temporary file; without
  nvidia-smi start() returns None instead of failing."""
  import time
  from sonic_jax.bench.gpu_state import SmiSampler
  fake = tmp_path / "nvidia-smi"
  fake.write_text(_FAKE_SMI)
  fake.chmod(0o755)
  monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
  smi = SmiSampler.start(period_ms=20)
  assert smi is not None
  try:
    time.sleep(0.3)
    t0 = time.time()
    time.sleep(0.2)
    t1 = time.time()
    state = smi.interval(t0, t1)
    both = smi.intervals([(t0, t1), (t0 - 100, t0 - 99)])  # the second before any sample
  finally:
    smi.stop()
  assert both == [both[0], None] and both[0]["samples"] >= state["samples"]
  assert state is not None and state["samples"] >= 3
  assert (state["sm_mhz"], state["power_w"], state["temp_c_max"]) == (1830.0, 650.0, 61.0)
  assert state["reasons"] == ["sw-power-cap"]
  assert smi._proc.poll() is not None and not os.path.exists(smi.path)
  assert SmiSampler.start(executable="no-such-nvidia-smi") is None


def test_smi_sampler_watches_the_visible_gpu_only(monkeypatch):
  """nvidia-smi prints a row per GPU unless told which: the sampler passes -i with the first
  CUDA_VISIBLE_DEVICES entry (index or UUID), else GPU 0."""
  from sonic_jax.bench import gpu_state
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  assert gpu_state.visible_device() == "0"
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
  assert gpu_state.visible_device() == "3"
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8d1e, GPU-77aa")
  assert gpu_state.visible_device() == "GPU-8d1e"
  seen = {}

  class Proc:
    def poll(self):
      return 0

  def popen(argv, **kw):
    seen["argv"] = argv
    return Proc()

  monkeypatch.setattr(gpu_state.shutil, "which", lambda exe: "/bin/" + exe)
  monkeypatch.setattr(gpu_state.subprocess, "Popen", popen)
  smi = gpu_state.SmiSampler.start(period_ms=20)
  smi.stop()
  assert seen["argv"][:3] == ["/bin/nvidia-smi", "-i", "GPU-8d1e"]
  assert seen["argv"][-2:] == ["-lms", "20"]


def test_runner_samples_nvidia_smi_over_a_whole_run(tmp_path, monkeypatch):
  """A run on a GPU (here the CPU run's platform relabelled, and a fake nvidia-smi on PATH)
  samples in the background: each timed mode gets the state of its interval, the meta says how
  many samples parsed, and the sampler's process is gone afterwards."""
  fake = tmp_path / "nvidia-smi"
  fake.write_text(_FAKE_SMI)
  fake.chmod(0o755)
  monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
  runner = Runner(configs.parse_configs(SMOKE), ["dense-ceiling"], RoutingSpec(),
                  Options(modes=("fwd", "fwdbwd"), iters=2, warmup=0, gpu_state_ms=20),
                  progress=lambda s: None)
  runner.doc["meta"]["platform"] = "gpu"
  doc = runner.run()
  assert doc["meta"]["gpu_state"].startswith("nvidia-smi every 20 ms")
  assert doc["meta"]["gpu_state_samples"] > 0 and runner._smi is None
  for r in doc["results"]:
    for mode in ("fwd", "fwdbwd"):
      g = r["modes"][mode]["gpu"]
      assert g["samples"] >= 1 and g["sm_mhz"] == 1830.0 and g["reasons"] == ["sw-power-cap"]
  assert "| f+b | 1830 (1830) | 650 | 61 | sw-power-cap |" in report.markdown(doc)


def test_runner_attaches_each_timings_gpu_state(tmp_path):
  """The layer benchmark records, per timed mode, the GPU state of its CUPTI interval when a
  sampler runs (on a GPU), and its markdown report lists it; on the CPU it records none."""
  from sonic_jax.bench.timing import Compiled, Measured, Timing
  cfg = configs.parse_configs(SMOKE)
  runner = Runner(cfg, ["dense-ceiling"], RoutingSpec(), Options(modes=("fwd",), iters=1,
                                                                 warmup=0),
                  progress=lambda s: None)
  doc = runner.run()
  assert doc["meta"]["gpu_state"] == "off"
  assert all("gpu" not in m for r in doc["results"] for m in r["modes"].values())
  assert "GPU state" not in report.markdown(doc)

  seen = []

  class Sampler:
    def interval(self, start, stop):
      seen.append((start, stop))
      return {"samples": 4, "sm_mhz": 1755.0, "sm_mhz_min": 1650.0, "power_w": 690.0,
              "power_limit_w": 700.0, "temp_c_max": 58.0, "reasons": ["sw-power-cap"]}

  runner._smi = Sampler()
  m = Measured(Compiled(None, 1.0, None), 1.5, None,
               Timing(2.0, "cupti", [2.0], window=(100.0, 101.0)))
  entry = runner._mode_entry("fwdbwd", m, 1024, cfg[0])
  assert seen == [(100.0, 101.0)] and entry["gpu"]["sm_mhz"] == 1755.0
  doc["results"][0]["modes"]["fwdbwd"] = entry
  md = report.markdown(doc)
  assert "## GPU state during the timings" in md
  assert "| f+b | 1755 (1650) | 690 | 58 | sw-power-cap |" in md


def test_tma_row_gather_probe_compiles_for_sm90a(tmp_path):
  """benchmarks/cuda/tma_row_gather.cu (the standalone gather-into-swizzled-stage probe that
  scripts/device_s36.sh's PART=tmagather runs) compiles for sm_90a with plain nvcc, no CUTLASS;
  skipped where there is no nvcc."""
  import shutil
  import subprocess
  nvcc = shutil.which("nvcc")
  if nvcc is None:
    pytest.skip("no nvcc")
  src = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "cuda", "tma_row_gather.cu")
  res = subprocess.run([nvcc, "-O3", "-std=c++17", "-arch=sm_90a", "-c", src, "-o",
                        str(tmp_path / "probe.o")], capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-2000:]
  assert (tmp_path / "probe.o").stat().st_size > 0
