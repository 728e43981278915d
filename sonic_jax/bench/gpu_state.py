"""The GPU's power, clocks, temperature and throttle reasons, sampled by nvidia-smi in the
background, so that every timing can say what clock it ran at.

Session 35's H200 runs took 1-9 % longer than earlier sessions' at every config whose step lasts
17 ms or more, for both backends, with kernels unchanged: a timing alone cannot tell a slower
kernel from a lower clock. ``SmiSampler`` runs ``nvidia-smi --query-gpu=... -lms`` for the life
of a benchmark; ``interval(t0, t1)`` summarizes the samples of one timed interval. The layer
benchmark (``runner.py``) attaches that summary to every mode it times, and
``benchmarks/power_trace.py`` uses the same parser for its sustained-load trace.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from datetime import datetime

# clocks_event_reasons bits (nvidia-smi --help-query-gpu).
REASONS = {
    0x1: "idle", 0x2: "app-clocks", 0x4: "sw-power-cap", 0x8: "hw-slowdown",
    0x10: "sync-boost", 0x20: "sw-thermal", 0x40: "hw-thermal", 0x80: "hw-power-brake",
    0x100: "display-clocks"}
SMI_FIELDS = ("timestamp", "power.draw", "power.limit", "clocks.sm", "clocks.mem",
              "temperature.gpu", "clocks_event_reasons.active")


def reason_names(mask: int) -> list[str]:
  """The names of the throttle-reason bits set in ``mask`` ('none' for 0)."""
  names = [name for bit, name in REASONS.items() if mask & bit]
  return names or ["none"]


def _number(text: str) -> float:
  """'612.34 W' / '1980 MHz' / '45' -> float; NaN for '[N/A]' and the like."""
  try:
    return float(text.strip().split()[0])
  except (ValueError, IndexError):
    return float("nan")


def parse_smi_csv(lines: list[str]) -> list[dict]:
  """nvidia-smi --format=csv,noheader rows of SMI_FIELDS -> dicts with t (the sample's time as
  seconds since the epoch, read as local time like time.time()), power_w, power_limit_w, sm_mhz,
  mem_mhz, temp_c, reasons (int mask). Rows that do not parse (a header, a cut-off last line)
  are skipped."""
  rows = []
  for line in lines:
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != len(SMI_FIELDS):
      continue
    try:
      stamp = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
      mask = int(parts[6], 16)
    except ValueError:
      continue
    rows.append({"t": stamp, "power_w": _number(parts[1]),
                 "power_limit_w": _number(parts[2]), "sm_mhz": _number(parts[3]),
                 "mem_mhz": _number(parts[4]), "temp_c": _number(parts[5]), "reasons": mask})
  return rows


def _finite(values: list[float]) -> list[float]:
  return [v for v in values if not math.isnan(v)]


def _median(values: list[float]) -> float:
  """The median of the values that are not NaN (an '[N/A]' reading); NaN if none are."""
  values = _finite(values)
  return statistics.median(values) if values else float("nan")


def summarize(rows: list[dict], start: float, stop: float, width: float = 1.0) -> list[dict]:
  """Samples with start <= t < stop in windows of ``width`` seconds (t relative to start): per
  window with samples the median power, SM clock, memory clock and temperature, and the throttle
  reasons of any sample."""
  out = []
  t = start
  while t < stop:
    win = [r for r in rows if t <= r["t"] < min(t + width, stop)]
    if win:
      mask = 0
      for r in win:
        mask |= r["reasons"]
      out.append({"t": round(t - start, 3), "samples": len(win),
                  **{k: _median([r[k] for r in win])
                     for k in ("power_w", "sm_mhz", "mem_mhz", "temp_c")},
                  "reasons": reason_names(mask)})
    t += width
  return out


def interval_state(rows: list[dict], start: float, stop: float, pad: float = 0.0) -> dict | None:
  """One timed interval's GPU state from the samples with start - pad <= t <= stop + pad (pad:
  about one sampling period, so an interval shorter than it still gets its neighbours): the
  sample count, median and lowest SM clock, median power and its limit, highest temperature
  (None where every sample read '[N/A]'), and every throttle reason seen ('idle' left out:
  CUPTI's pauses between batches set it). None when no sample falls there."""
  win = [r for r in rows if start - pad <= r["t"] <= stop + pad]
  if not win:
    return None
  mask = 0
  for r in win:
    mask |= r["reasons"]

  def col(key):
    return _finite([r[key] for r in win])

  def med(key):  # None rather than NaN: the result goes into JSON
    v = col(key)
    return statistics.median(v) if v else None

  sm, temps = col("sm_mhz"), col("temp_c")
  return {"samples": len(win), "sm_mhz": med("sm_mhz"), "sm_mhz_min": min(sm) if sm else None,
          "power_w": med("power_w"), "power_limit_w": med("power_limit_w"),
          "temp_c_max": max(temps) if temps else None, "reasons": reason_names(mask & ~0x1)}


def visible_device() -> str:
  """The GPU JAX's first device runs on, as nvidia-smi -i takes it: the first entry of
  CUDA_VISIBLE_DEVICES (an index or a UUID), else "0". Without -i, nvidia-smi prints a row per
  GPU per sample, and a multi-GPU host's rows would mix into one interval's state."""
  visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
  return visible or "0"


class SmiSampler:
  """nvidia-smi sampling SMI_FIELDS every ``period_ms`` into a file until ``stop()``.

  ``SmiSampler.start()`` returns None where nvidia-smi is missing or fails to start, so callers
  record nothing rather than fail: the GPU state annotates timings, it never gates them.
  """

  def __init__(self, proc: subprocess.Popen, path: str, period_ms: int, owns_path: bool):
    self._proc, self.path, self.period_ms, self._owns_path = proc, path, period_ms, owns_path

  @classmethod
  def start(cls, period_ms: int = 50, path: str | None = None, executable: str = "nvidia-smi",
            device: str | None = None) -> "SmiSampler | None":
    """Starts sampling GPU ``device`` (an nvidia-smi -i value; default: visible_device())."""
    exe = shutil.which(executable)
    if exe is None:
      return None
    owns = path is None
    if owns:
      fd, path = tempfile.mkstemp(prefix="smi-", suffix=".csv")
      os.close(fd)
    try:
      with open(path, "w") as out:
        proc = subprocess.Popen(
            [exe, "-i", device or visible_device(), f"--query-gpu={','.join(SMI_FIELDS)}",
             "--format=csv,noheader", "-lms", str(period_ms)],
            stdout=out, stderr=subprocess.DEVNULL)
    except OSError:
      return None
    return cls(proc, path, period_ms, owns)

  def rows(self) -> list[dict]:
    """The samples written so far (the last line may be cut off: parse_smi_csv skips it)."""
    try:
      with open(self.path) as f:
        return parse_smi_csv(f.read().splitlines())
    except OSError:
      return []

  def interval(self, start: float, stop: float) -> dict | None:
    """interval_state of [start, stop] (time.time() values), padded by one period; it waits
    out that period first so that the sample after ``stop`` has been written."""
    return self.intervals([(start, stop)])[0]

  def intervals(self, windows: list[tuple[float, float]]) -> list[dict | None]:
    """interval() of each (start, stop), waiting once, for the last: a caller that times
    back to back (interleaved rounds) collects the windows and asks afterwards, so that no
    pause between its timings lets the GPU cool."""
    pad = self.period_ms / 1e3
    wait = max((stop for _, stop in windows), default=0.0) + 2 * pad - time.time()
    if wait > 0:
      time.sleep(wait)
    rows = self.rows()
    return [interval_state(rows, start, stop, pad=pad) for start, stop in windows]

  def stop(self) -> None:
    if self._proc.poll() is None:
      self._proc.terminate()
      try:
        self._proc.wait(timeout=5)
      except subprocess.TimeoutExpired:
        self._proc.kill()
        self._proc.wait()
    if self._owns_path:
      try:
        os.remove(self.path)
      except OSError:
        pass
