"""The device-call shell helpers (scripts/device_env.sh) that can be checked without a GPU."""

import os
import re
import subprocess
import sys
import textwrap

ROOT = os.path.join(os.path.dirname(__file__), "..")

_TESTS = textwrap.dedent("""
    import os
    import signal

    import pytest

    @pytest.mark.gpu
    def test_a():
      pass

    @pytest.mark.gpu
    def test_b():
      pass

    @pytest.mark.gpu
    def test_c():
      # The first run dies here as XLA under compute-sanitizer sometimes does.
      flag = os.path.join(os.path.dirname(__file__), "crashed")
      if not os.path.exists(flag):
        open(flag, "w").close()
        os.kill(os.getpid(), signal.SIGSEGV)

    @pytest.mark.gpu
    def test_d():
      pass

    def test_not_gpu():
      pass
""")


def test_memcheck_each_resumes_past_a_crash(tmp_path):
  """memcheck_each: when the sanitized pytest dies, the test it was running is named and
  deselected with those that finished, and pytest starts again on the rest; the summary counts
  the passes of every round."""
  tests = tmp_path / "t"
  tests.mkdir()
  (tests / "test_fake.py").write_text(_TESTS)
  fake = tmp_path / "bin"
  fake.mkdir()
  (fake / "compute-sanitizer").write_text('#!/bin/bash\nshift 2\nexec "$@"\n')  # drop --tool X
  (fake / "compute-sanitizer").chmod(0o755)
  out = tmp_path / "out"
  out.mkdir()
  env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", PYTHON=sys.executable,
             OUT=str(out))
  script = ("source scripts/device_env.sh; cd " + str(tmp_path) +
            "; memcheck_each 120 t/test_fake.py test_")
  res = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
  assert res.returncode == 0, res.stderr
  assert "round 1: rc 139 after 3 tests; running: t/test_fake.py::test_c" in res.stdout
  assert "memcheck: 3 tests passed under the sanitizer" in res.stdout
  first, second = ((out / f"memcheck-{i}.log").read_text() for i in (1, 2))
  assert "test_a PASSED" in first and "test_b PASSED" in first
  assert "test_d PASSED" in second
  assert "test_a" not in second and "test_c" not in second
  assert not (out / "memcheck-3.log").exists()


def _newest_device_script() -> str:
  names = [n for n in os.listdir(os.path.join(ROOT, "scripts"))
           if re.fullmatch(r"device_s\d+\.sh", n)]
  return os.path.join(ROOT, "scripts", max(names, key=lambda n: int(n[8:-3])))


def test_newest_device_script_variants_parse():
  """Every variant list quoted in the newest device script names variants that
  ``sonic_jax.bench.variants.kernels_for`` builds (a typo would otherwise cost a device call):
  each spec at an n = 256 and an n = 512 shape."""
  from sonic_jax.bench.variants import kernels_for
  with open(_newest_device_script()) as f:
    quoted = re.findall(r'"([^"]*)"', f.read())
  specs = {item for q in quoted for item in q.split(",")
           if re.match(r"(pallas|ffi|xla)([:+]|$)", item) and "$" not in item}
  assert specs, "no quoted variant list found"
  for spec in sorted(specs):
    for d, n in ((1536, 256), (4096, 512)):
      kernels_for(spec, d, n)  # SystemExit on a bad spec
