"""host.nvml's per-process reading without a GPU: NVML's accounting where it names the pid,
else nvidia-smi's, else None (never an exception)."""
from __future__ import annotations

import subprocess
from types import SimpleNamespace

from dpbench.host import nvml as host_nvml


class FakeNvml:
    """pynvml's calls that nvml_process_mib makes, over one GPU with the given (pid, bytes)."""

    def __init__(self, processes):
        self.processes = [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in processes]

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return self.processes


def smi(stdout):
    return lambda *a, **kw: subprocess.CompletedProcess(a, 0, stdout=stdout, stderr="")


def test_nvml_names_the_pid(monkeypatch):
    monkeypatch.setattr(host_nvml, "nvml", lambda: FakeNvml([(11, 3 * 2 ** 20), (12, 512 * 2 ** 20)]))
    assert host_nvml.nvml_process_mib(12) == 512.0
    assert host_nvml.nvml_process_mib(11) == 3.0


def test_nvidia_smi_where_nvml_does_not_name_it(monkeypatch):
    monkeypatch.setattr(host_nvml, "nvml", lambda: FakeNvml([(11, 2 ** 20)]))
    monkeypatch.setattr(host_nvml.subprocess, "run", smi("11, 1\n42, 1024\n"))
    assert host_nvml.nvml_process_mib(42) == 1024.0


def test_none_where_nothing_names_it_or_nothing_answers(monkeypatch):
    monkeypatch.setattr(host_nvml, "nvml", lambda: None)
    monkeypatch.setattr(host_nvml.subprocess, "run", smi("11, 1\n"))
    assert host_nvml.nvml_process_mib(42) is None

    def missing(*a, **kw):
        raise FileNotFoundError("nvidia-smi")
    monkeypatch.setattr(host_nvml.subprocess, "run", missing)
    assert host_nvml.nvml_process_mib() is None
