"""tools/device/advise_check.sh --tiny: the device script's CPU path writes the advice and its
check under $OUT, and the check's counted tensors are the memory model's."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow   # a probe and one launch of two gloo ranks: ~35 s
def test_the_device_script_runs_its_tiny_part_on_the_cpu(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([str(ROOT / "tools" / "device" / "advise_check.sh"), "--tiny"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "advise-tiny-g2.json").read_text())
    assert doc["chosen"] == doc["rows"][0]["setup"] and doc["gpus"] == 2
    assert {r["setup"] for r in doc["check"]} == {doc["chosen"]}
    assert all(r["status"] == "ok" for r in doc["check"])
    counted = [r for r in doc["check"] if r["what"] in ("parameters", "gradients", "optimizer")]
    assert len(counted) == 3 and all(r["error"] == pytest.approx(0, abs=1e-9) for r in counted)
    assert doc["chosen"] in (tmp_path / "advise-tiny-g2.md").read_text()
