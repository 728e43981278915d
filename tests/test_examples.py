"""The main job runs end to end on the CPU and its loss falls."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import train_lm  # noqa: E402


def test_train_lm_loss_falls(tmp_path):
  r = train_lm.main(["--steps", "40", "--batch", "8", "--seq-len", "64", "--d-model", "64",
                     "--d-ff", "64", "--out", str(tmp_path)])
  assert r["backend"] == "xla"
  assert r["last_loss"] < r["first_loss"] - 1.0, r
  assert os.path.getsize(tmp_path / "loss.png") > 1000


def test_train_lm_token_rounding(tmp_path):
  r = train_lm.main(["--steps", "15", "--batch", "8", "--seq-len", "64", "--d-model", "64",
                     "--d-ff", "64", "--routing", "token_rounding", "--out", str(tmp_path)])
  assert r["last_loss"] < r["first_loss"]


def test_train_sharded_on_host_devices():
  import jax
  import train_sharded
  assert jax.device_count() == 8  # tests/conftest.py
  r = train_sharded.main(["--steps", "8", "--batch", "8", "--seq-len", "32", "--d-model", "32",
                          "--d-ff", "32", "--fsdp", "2", "--expert", "2", "--exchange", "ragged",
                          "--check"])
  assert r["mesh"] == dict(data=2, fsdp=2, expert=2)
  assert r["last_loss"] < r["first_loss"]


def test_lm_backend_choices_are_every_backend_name():
  """The example's --backend choices are a literal list (lm_cli imports no jax before the
  scripts set their platform): they must stay "auto" plus every name backend= takes."""
  import argparse

  import lm_cli

  from sonic_jax.backends import NAMES
  p = argparse.ArgumentParser()
  lm_cli.add_lm_args(p, steps=1)
  (action,) = [a for a in p._actions if a.dest == "backend"]
  assert list(action.choices) == ["auto", *NAMES]
