"""Turns a results document (runner JSON) into a terminal table, Markdown and PNG plots.

``python -m sonic_jax.bench.report RESULTS.json`` regenerates the Markdown and plots next to
the JSON (used after an interrupted run).
"""

from __future__ import annotations

import argparse
import json
import math
import os

GiB = 2**30

COLUMNS = ("config", "impl", "fwd ms", "fwd TF/s", "bwd ms", "bwd TF/s", "f+b ms", "f+b TF/s",
           "mem GiB", "saved GiB", "compile s", "check", "note")


def _fmt(v, spec=".3f", none="-"):
  if v is None or (isinstance(v, float) and math.isnan(v)):
    return none
  return format(v, spec)


def _tf(v):
  """TFLOP/s with precision that suits both GPU (hundreds) and CPU (thousandths) values."""
  if v is None or (isinstance(v, float) and math.isnan(v)):
    return "-"
  return format(v, ".0f") if abs(v) >= 100 else format(v, ".1f") if abs(v) >= 1 else format(
      v, ".2g")


def _gib(v):
  if not v:
    return "-"
  g = v / GiB
  return format(g, ".2f") if g >= 0.1 else format(g, ".2g")


def _mode(row, mode, key):
  return (row.get("modes") or {}).get(mode, {}).get(key)


def _check_str(row) -> str:
  c = row.get("check")
  if not c:
    return "-"
  if c.get("reason") == "reference":
    return "ref"
  if c.get("ok") is None:
    return "skip"
  if "max_rel_err" not in c:
    return "FAIL"
  return f"{'ok' if c['ok'] else 'FAIL'} {c['max_rel_err']:.1e}"


def _argument_bytes(row, mode: str) -> int:
  """Bytes of the step's inputs (x, router, w1, w2, dO; the ceiling: X, w1, w2, dO): recorded
  since session 3, else from the shapes (bf16 operands, as every recorded run used)."""
  recorded = _mode(row, mode, "argument_bytes")
  if recorded is not None:
    return recorded
  t, d, n, e, k = (row[f] for f in ("T", "d", "n", "E", "K"))
  if row.get("kind") == "ceiling":
    return 2 * (2 * t * k * d + 3 * d * n)
  return 2 * ((2 if mode == "fwdbwd" else 1) * t * d + d * e + 3 * e * d * n)


def memory_bytes(row) -> int | None:
  """Peak memory of one training step above its weights and inputs: the fwd+bwd executable's
  footprint (arguments + outputs + temporaries) minus its arguments, so outputs (the weight
  gradients among them) and temporaries; for the PyTorch baseline its allocator peak above the
  weights and inputs, the same quantity."""
  if row.get("torch_peak_extra_bytes") is not None:
    return row["torch_peak_extra_bytes"]
  for mode in ("fwdbwd", "fwd"):
    total = _mode(row, mode, "footprint_bytes")
    if total:
      return total - _argument_bytes(row, mode)
  return None


def table_rows(doc: dict) -> list[list[str]]:
  out = []
  for r in doc["results"]:
    compile_s = [v for v in (_mode(r, "fwd", "compile_s"), _mode(r, "fwdbwd", "compile_s"))
                 if v is not None]
    if not compile_s:
      compile_s = [v for v in (_mode(r, "fwd", "first_call_s"),
                               _mode(r, "fwdbwd", "first_call_s")) if v is not None]
    mem = memory_bytes(r)
    saved = r.get("saved_act_bytes")
    note = r.get("reason") or ""
    if (r["status"] == "ok" and r["kind"] != "ceiling" and r.get("imbalance")
        and r["imbalance"] > 1.5):
      note = f"load max/mean {r['imbalance']:.1f}"
    out.append([
        r["config"], r["impl"],
        _fmt(_mode(r, "fwd", "ms")), _tf(_mode(r, "fwd", "tflops")),
        _fmt(_mode(r, "bwd", "ms")), _tf(_mode(r, "bwd", "tflops")),
        _fmt(_mode(r, "fwdbwd", "ms")), _tf(_mode(r, "fwdbwd", "tflops")),
        _gib(mem), _gib(saved),
        _fmt(sum(compile_s) if compile_s else None, ".1f"), _check_str(r), note[:90]])
  return out


def terminal_table(doc: dict) -> str:
  rows = table_rows(doc)
  widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
            for i, h in enumerate(COLUMNS)]
  widths[-1] = min(widths[-1], 90)

  def line(cells):
    return "  ".join(c.ljust(w) if i in (0, 1, len(cells) - 1) else c.rjust(w)
                     for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

  sep = "  ".join("-" * w for w in widths)
  out = [line(list(COLUMNS)), sep]
  last = None
  for r in rows:
    if last is not None and r[0] != last:
      out.append("")
    last = r[0]
    out.append(line(r))
  return "\n".join(out)


def _md_table(header, rows) -> str:
  esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
  lines = ["| " + " | ".join(header) + " |",
           "| " + " | ".join("---" if i < 2 or i == len(header) - 1 and header[i] == "note"
                             else "---:" for i in range(len(header))) + " |"]
  lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
  return "\n".join(lines)


def meta_lines(doc: dict) -> list[str]:
  m = doc["meta"]
  v = ", ".join(f"{k} {val}" for k, val in m["versions"].items())
  o = m["options"]
  return [
      f"- Date: {m['date']}; device: {m['device_kind']} ({m['platform']}); {v}"
      + (f"; git {m['git_commit']}" if m.get("git_commit") else ""),
      f"- Command: `{m['command']}`",
      f"- Routing: {m['routing']}"
      + (f" (routing kernels: {m['route_impl']})" if m.get("route_impl") else "")
      + "; bf16, x and dO = 0.2·randn, expert weights N(0, 0.02), "
      "router logits ~N(0, 1); the timed layer includes router, routing metadata, gather and "
      "combine.",
      f"- Timing: {m['timing']}; {o['warmup']} warm-up calls, median of {o['iters']}. "
      f"Backward = {'measured alone' if o['bwd_direct'] else '(fwd+bwd) − fwd, as in the paper'}. "
      f"Forward is the training forward (residuals for the backward are written; the layer's "
      f"inputs are not copied out).",
      f"- TFLOP/s: {m['flops']} (kept pairs with token rounding).",
      "- mem GiB: memory of one fwd+bwd step above its weights and inputs: the compiled "
      "step's outputs (gradients included) + temporaries, from XLA's memory analysis (its "
      "footprint minus its arguments); the PyTorch baseline: allocator peak above weights and "
      "inputs. saved GiB: what jax.vjp keeps for the backward beyond the layer's inputs.",
      f"- Check: relative error ‖a−b‖/‖b‖ of out, dx, drouter_w, dw1, dw2 against the xla "
      f"backend at a T where its densified ragged_dot fits (tolerance {o['check_tol']}); "
      "'ref' = the reference itself.",
  ] + ([f"- GPU state: {m['gpu_state']}."] if m.get("gpu_state") not in (None, "off") else []
  ) + ([] if m.get("complete") else ["- **Incomplete run**: the process stopped before the end."]
  ) + [f"- Note: {note}" for note in m.get("notes", [])]


def gpu_state_rows(doc: dict) -> list[list[str]]:
  """Per timed mode with a recorded GPU state (runner: mode entries' 'gpu'), its table row."""
  out = []
  for r in doc["results"]:
    for mode in ("fwd", "fwdbwd"):
      g = (r.get("modes") or {}).get(mode, {}).get("gpu")
      if g:
        out.append([r["config"], r["impl"], "f+b" if mode == "fwdbwd" else mode,
                    f"{_fmt(g.get('sm_mhz'), '.0f')} ({_fmt(g.get('sm_mhz_min'), '.0f')})",
                    _fmt(g.get("power_w"), ".0f"), _fmt(g.get("temp_c_max"), ".0f"),
                    "/".join(g.get("reasons") or [])])
  return out


def markdown(doc: dict, plots: list[str] | None = None) -> str:
  m = doc["meta"]
  parts = [f"# sonic_jax benchmark: {m['device_kind']}, {m['date']}", "", *meta_lines(doc), ""]
  paper = [r for r in doc["results"] if r.get("paper_tflops")]
  parts += ["## Results", "", _md_table(COLUMNS, table_rows(doc)), ""]
  if paper:
    def h200(r, i):
      v = r.get("sonic_h200_tflops")
      return f"{v[i]:.0f}" if v else ""

    parts += ["## Against the paper and the recorded original",
              "",
              "Paper: SonicMoE on an H100 (Fig. 14), fwd / bwd. Original on H200: the PyTorch "
              "SonicMoE measured on one H200 on 2026-12-02 (sonicmoe-spec.md §7.2b), fwd / "
              "fwd+bwd.", "",
              _md_table(["config", "impl", "fwd TF/s", "paper fwd", "bwd TF/s", "paper bwd",
                         "f+b TF/s", "original H200 fwd", "original H200 f+b"],
                        [[r["config"], r["impl"], _tf(_mode(r, "fwd", "tflops")),
                          f"{r['paper_tflops'][0]:.0f}", _tf(_mode(r, "bwd", "tflops")),
                          f"{r['paper_tflops'][1]:.0f}", _tf(_mode(r, "fwdbwd", "tflops")),
                          h200(r, 0), h200(r, 1)]
                         for r in paper if r["status"] in ("ok", "partial")
                         and r["kind"] != "ceiling"]), ""]
  state = gpu_state_rows(doc)
  if state:
    parts += ["## GPU state during the timings", "",
              "nvidia-smi samples over each timing's CUPTI calls: median SM clock (lowest), "
              "median power, highest temperature, throttle reasons seen ('idle' left out).", "",
              _md_table(["config", "impl", "mode", "SM MHz", "W", "°C", "reasons"], state), ""]
  for p in plots or []:
    parts += [f"![{os.path.basename(p)}]({os.path.basename(p)})", ""]
  return "\n".join(parts)


def plots(doc: dict, stem: str) -> list[str]:
  """TFLOP/s per config per implementation (fwd and fwd+bwd) and memory per config."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except Exception:  # noqa: BLE001 - plots are optional
    return []
  configs = list(dict.fromkeys(r["config"] for r in doc["results"]))
  impls = list(dict.fromkeys(r["impl"] for r in doc["results"]))
  by = {(r["config"], r["impl"]): r for r in doc["results"]}
  written = []

  def bars(ax, values_of, ylabel, title):
    width = 0.8 / max(len(impls), 1)
    for i, impl in enumerate(impls):
      vals = [values_of(by.get((c, impl))) for c in configs]
      xs = [j + (i - (len(impls) - 1) / 2) * width for j in range(len(configs))]
      ax.bar(xs, [v if v is not None else 0 for v in vals], width, label=impl)
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels(configs, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(axis="y", alpha=0.3)

  def tf(mode):
    return lambda r: _mode(r, mode, "tflops") if r else None

  fig, axes = plt.subplots(2, 1, figsize=(max(8, len(configs) * 0.8), 8), sharex=True)
  bars(axes[0], tf("fwd"), "TFLOP/s", f"forward ({doc['meta']['device_kind']})")
  bars(axes[1], tf("fwdbwd"), "TFLOP/s", "forward + backward")
  paper_rows = [(j, by.get((c, impls[0]))) for j, c in enumerate(configs)]
  pts = [(j, r["paper_tflops"]) for j, r in paper_rows if r and r.get("paper_tflops")]
  if pts:
    axes[0].scatter([j for j, _ in pts], [p[0] for _, p in pts], marker="_", s=200, c="k",
                    label="paper H100 SonicMoE", zorder=3)
  axes[0].legend(fontsize=7, ncol=3)
  fig.tight_layout()
  path = f"{stem}-tflops.png"
  fig.savefig(path, dpi=110)
  plt.close(fig)
  written.append(path)

  fig, ax = plt.subplots(figsize=(max(8, len(configs) * 0.8), 4.5))
  bars(ax, lambda r: (memory_bytes(r) / GiB if r and memory_bytes(r) else None), "GiB",
       "peak memory of one fwd+bwd step")
  ax.legend(fontsize=7, ncol=3)
  fig.tight_layout()
  path = f"{stem}-memory.png"
  fig.savefig(path, dpi=110)
  plt.close(fig)
  written.append(path)
  return written


def write_outputs(doc: dict, stem: str, make_plots: bool = True) -> list[str]:
  """Writes STEM.json, STEM.md and STEM-*.png; returns the paths."""
  os.makedirs(os.path.dirname(os.path.abspath(stem)), exist_ok=True)
  with open(stem + ".json", "w") as f:
    json.dump(doc, f, indent=1, default=str)
  pngs = plots(doc, stem) if make_plots else []
  with open(stem + ".md", "w") as f:
    f.write(markdown(doc, pngs))
  return [stem + ".json", stem + ".md", *pngs]


def main(argv=None):
  ap = argparse.ArgumentParser(prog="python -m sonic_jax.bench.report",
                               description="Regenerate Markdown + plots from a results JSON.")
  ap.add_argument("json", help="results JSON written by python -m sonic_jax.bench")
  ap.add_argument("--no-plots", action="store_true")
  args = ap.parse_args(argv)
  with open(args.json) as f:
    doc = json.load(f)
  stem = args.json[:-5] if args.json.endswith(".json") else args.json
  print(terminal_table(doc))
  for p in write_outputs(doc, stem, make_plots=not args.no_plots):
    print("wrote", p)


if __name__ == "__main__":
  main()
