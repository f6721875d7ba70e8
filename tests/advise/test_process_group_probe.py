"""advise.process_group_probe without CUDA: the CPU's answer (0, a reason, no process started),
the child's output read, and a child that fails or outlives its timeout becoming a reason."""
from __future__ import annotations

import subprocess
import sys
import time

from dpbench.advise import process_group_probe as pgp


def test_on_the_cpu_nothing_is_started_and_nothing_added(monkeypatch):
    def no_child(*a, **kw):
        raise AssertionError("a process was started for a CPU run")
    monkeypatch.setattr(subprocess, "Popen", no_child)
    got = pgp.start("cpu").result()
    assert got["process_group_mib"] == 0.0 and got["reason"] and got["nccl"] is None


def test_without_nvml_nothing_is_started(monkeypatch):
    monkeypatch.setattr(pgp, "nvml", lambda: None)
    monkeypatch.setattr(pgp.shutil, "which", lambda name: None)
    m = pgp.start("cuda")
    assert m.proc is None and m.result()["process_group_mib"] == 0.0 and m.result()["reason"]


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_the_childs_last_result_line_is_read():
    printed = 'print("NCCL INFO a line of its own"); print(\'{"process_group_mib": 512.5, "nccl": "2.28.9", "reason": ""}\')'
    got = pgp.Measurement(python(printed), timeout_s=20).result()
    assert (got["process_group_mib"], got["nccl"], got["reason"]) == (512.5, "2.28.9", "")


def test_a_child_without_a_result_is_a_reason():
    got = pgp.Measurement(python("import sys; sys.stderr.write('NCCL error: boom\\n'); sys.exit(3)"), 20).result()
    assert got["process_group_mib"] == 0.0 and "3" in got["reason"] and "boom" in got["reason"]


def test_a_child_past_its_timeout_is_ended_and_a_reason():
    started = time.monotonic()
    m = pgp.Measurement(python("import time; time.sleep(30)"), timeout_s=1.0)
    got = m.result()
    assert time.monotonic() - started < 3
    assert got["process_group_mib"] == 0.0 and got["reason"]
    assert m.proc is not None and m.proc.poll() is not None   # the child is gone


def test_the_child_reports_a_failure_as_a_result(monkeypatch, capsys):
    def fails(index):
        raise RuntimeError("no NCCL here")
    monkeypatch.setattr(pgp, "measure_here", fails)
    assert pgp.main(["--child"]) == 1
    got = pgp.parse(capsys.readouterr().out, "", 1)
    assert got["process_group_mib"] == 0.0 and "no NCCL here" in got["reason"]


def test_a_caller_that_gives_up_ends_the_child():
    with pgp.Measurement(python("import time; time.sleep(30)"), timeout_s=20) as m:
        pass
    assert m.proc is not None and m.proc.poll() is not None
