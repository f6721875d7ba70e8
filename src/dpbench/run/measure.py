"""Timers, memory readings (allocator and NVML) and warning capture for one run."""
from __future__ import annotations

import statistics
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from dpbench.host.nvml import nvml
from dpbench.results.formats import NO_THROUGHPUT, step_bound

MIB = 1024 * 1024


class StepClock:
    """Marks the end of every step on the device.

    A step's time is the gap between its end mark and the previous step's, so a feed that
    makes the device wait shows up in the step time instead of hiding between steps. On CUDA
    the marks are events on the current stream (no host synchronisation per step); on the CPU,
    where work is synchronous, a plain clock.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self._marks: list = []

    def mark(self) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            self._marks.append(ev)
        else:
            self._marks.append(time.perf_counter())

    def step_ms(self) -> list[float]:
        """Milliseconds between consecutive marks (one fewer than the marks)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return [a.elapsed_time(b) for a, b in zip(self._marks, self._marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self._marks, self._marks[1:])]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def throughput(step_ms: list[float], batch_sizes: list[int], unit: str = "images",
               units_per_sample: int = 1, host_ms: list[float] | None = None) -> dict:
    """Samples/s over the timed steps, in the workload's unit too (images_per_s for image
    workloads, as every record before workloads; tokens_per_s = samples x seq_len for token
    ones), the step-time median / p95 / mean, and the step's regime: host_step_ms, the host's
    time to issue a step from an idle device (median of the warm-up probes), and `bound`
    (results.step_bound: "host" or "device"; None without probes, as on the CPU)."""
    host = statistics.median(host_ms) if host_ms else None
    if not step_ms:
        return {**NO_THROUGHPUT, "host_step_ms": host}
    total_s = sum(step_ms) / 1e3
    samples = sum(batch_sizes) / total_s if total_s > 0 else None
    return {"images_per_s": samples if unit == "images" else None, "samples_per_s": samples,
            "tokens_per_s": samples * units_per_sample if unit == "tokens" and samples is not None else None,
            "timed_steps": len(step_ms), "step_ms_p50": percentile(step_ms, 0.5),
            "step_ms_p95": percentile(step_ms, 0.95), "step_ms_mean": statistics.fmean(step_ms),
            "host_step_ms": host, "bound": step_bound(host, percentile(step_ms, 0.5))}


# -- memory -----------------------------------------------------------------------------------

class NvmlSampler:
    """Samples NVML's used memory of the given CUDA devices in a background thread.

    NVML counts everything on the device (CUDA context, other processes), which the allocator's
    own peak does not; the two together tell what a run really occupies. A failure of NVML is
    kept in `error` and never ends the run.
    """

    def __init__(self, devices: list[int], period_s: float = 0.05):
        self.peak_mib: dict[int, float | None] = {d: None for d in devices}
        self.error = ""
        self._stop = threading.Event()
        self._nvml = nvml()
        self._handles = {}
        try:
            if self._nvml is None:
                raise RuntimeError("no NVML (driver or nvidia-ml-py missing)")
            self._handles = {d: _nvml_handle(self._nvml, d) for d in devices}
        except Exception as exc:
            self.error = f"NVML unavailable: {type(exc).__name__}: {exc}"
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)

    def __enter__(self):
        if self._handles:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._sample()

    def _sample(self) -> None:
        try:
            for d, h in self._handles.items():
                used = self._nvml.nvmlDeviceGetMemoryInfo(h).used / MIB
                self.peak_mib[d] = max(used, self.peak_mib[d] or 0.0)
        except Exception as exc:   # keep the peaks so far; say why the rest is missing
            self.error = f"NVML sampling stopped: {type(exc).__name__}: {exc}"
            self._handles = {}

    def _run(self, period_s: float) -> None:
        while not self._stop.wait(period_s) and self._handles:
            self._sample()


def _nvml_handle(pynvml, cuda_index: int):
    """NVML numbers devices by PCI order, CUDA by CUDA_VISIBLE_DEVICES: match them by UUID."""
    uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
    return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")


def reset_peaks(devices: list[int]) -> None:
    for d in devices:
        torch.cuda.reset_peak_memory_stats(d)


class TrainingPeaks:
    """Per device, the caching allocator's peak allocated and reserved memory over the training
    steps only. Evaluation runs the bare module on device 0 alone with its own batch; left in,
    its activations were charged to training: on 2×H200 a DataParallel run at global batch 128
    showed device 0 at 1709 MiB against 428 MiB on device 1, nearly all of it the test pass."""

    def __init__(self, devices: list[int]):
        self.devices = devices
        self.allocated = dict.fromkeys(devices, 0.0)
        self.reserved = dict.fromkeys(devices, 0.0)
        self.measuring = True
        reset_peaks(devices)

    def fold(self) -> None:
        """Take in the allocator's peaks since the last reset, unless a left-out phase runs."""
        if not self.measuring:
            return
        for d in self.devices:
            self.allocated[d] = max(self.allocated[d], torch.cuda.max_memory_allocated(d) / MIB)
            self.reserved[d] = max(self.reserved[d], torch.cuda.max_memory_reserved(d) / MIB)

    @contextmanager
    def left_out(self):
        """A phase (evaluation) whose allocations are not the training's. Blocks it leaves in the
        cache still count as reserved afterwards: reserved is an upper bound after a mid-run eval."""
        self.fold()
        self.measuring = False
        try:
            yield
        finally:
            reset_peaks(self.devices)
            self.measuring = True


def memory_rows(peaks: TrainingPeaks, sampler: NvmlSampler | None) -> list[dict]:
    """Per device: the allocator's peak allocated and reserved memory over training, and NVML's
    peak used over the whole run, evaluation included (with NVML's error, where it had one)."""
    peaks.fold()
    rows = []
    for d in peaks.devices:
        row = {"device": d,
               "allocated_mib": peaks.allocated[d],
               "reserved_mib": peaks.reserved[d],
               "nvml_used_mib": sampler.peak_mib.get(d) if sampler else None}
        if sampler and sampler.error:
            row["nvml_error"] = sampler.error
        rows.append(row)
    return rows


# -- warnings ---------------------------------------------------------------------------------

@dataclass
class _Seen:
    category: str
    message: str
    location: str
    first_step: int
    count: int = 0


@dataclass
class WarningRecorder:
    """Records every Python warning of the run, with the filter set to "always".

    Python's default filter shows a warning once per call site, which would hide how often
    DataParallel's gather warning fires; "always" lets us count. `step` tags the first
    occurrence (-1: set-up, before the first step).
    """

    step: int = -1
    _seen: dict = field(default_factory=dict)

    def __enter__(self):
        self._ctx = warnings.catch_warnings(record=True)
        self._log = self._ctx.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self.drain()
        self._ctx.__exit__(*exc)

    def drain(self) -> None:
        """Fold the warnings raised since the last call into the counts."""
        while self._log:
            w = self._log.pop(0)
            key = (w.category.__name__, str(w.message), f"{w.filename}:{w.lineno}")
            if key not in self._seen:
                self._seen[key] = _Seen(*key, first_step=self.step)
            self._seen[key].count += 1

    def rows(self, rank: int = 0) -> list[dict]:
        self.drain()
        return [{"category": s.category, "message": s.message, "count": s.count,
                 "first_step": s.first_step, "location": _short_path(s.location), "rank": rank}
                for s in self._seen.values()]


def _short_path(location: str) -> str:
    """Trim site-packages prefixes so locations compare across machines."""
    for marker in ("site-packages/", "dist-packages/", "/src/"):
        if marker in location:
            return location.split(marker, 1)[1]
    return location
