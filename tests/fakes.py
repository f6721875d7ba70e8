"""Fake result sets for tests: run records written the way the engine writes them (metrics.json
and steps.csv through dpbench.results), then the real collect over them.

    rs = fake_result_set(tmp_path, [dict(variant="single", images_per_s=[990, 1010]),
                                    dict(variant="ddp", gpus=2, images_per_s=[1760, 1780]),
                                    dict(variant="ddp", gpus=4, status="skipped",
                                         reason="needs 4 GPUs, 2 visible")])
    rs.table("summary")          # a DataFrame read back through dpbench.analysis.tables

A spec entry holds write_fake_run's keyword arguments; `images_per_s` may be a list, one value
per repeat (then `repeat` is not given).

Checks of a drawn figure as a reader sees it (after fig.canvas.draw(), at the saved dpi): each
returns what is wrong, [] for nothing, so a test can also show that a check fails on a broken
figure:

    outside_points(fig), empty_panels(fig), untagged(fig), notes_over_data(fig),
    overlapping_texts(fig); is_placeholder(fig) for a figure that says why it is empty

A dpbench command line run as `python -m` runs it, in this process (no fresh interpreter's
seconds of imports), for the cases of a command line whose own start is tested in a process:

    proc = run_module("dpbench.analysis.collect", "--results-dir", str(root), "--tag", "t")

The workflow in a temporary folder, for the tests that run the real Snakemake:

    wd = copy_workflow(tmp_path / "wf", extra=("profiles",))
    proc = run_snakemake(wd, "-n", "--config", "experiment=smoke")
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import runpy
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
from matplotlib.collections import Collection, LineCollection, PathCollection
from matplotlib.patches import Rectangle

from dpbench import results
from dpbench.analysis import collect
from dpbench.report.figstyle import DATA, PLACEHOLDER, REFERENCE

REPO = Path(__file__).resolve().parents[1]
TAG = "fake"
SYNTHETIC_PROVENANCE = {
    "torch": "2.14.1+cu130", "cuda": "13.0", "cudnn": 91900, "nccl": "2.28.9",
    "driver": "580.159.04", "gpu_names": ["NVIDIA H200", "NVIDIA H200"], "python": "3.11.7",
    "hostname": "node-7", "git_sha": "abc1234",
}
DP_WARNING = ("Was asked to gather along dimension 0, but all input tensors were scalars; "
              "will instead unsqueeze and return a vector.")


def default_loss(step: int, repeat: int) -> float:
    return 2.3 * math.exp(-step / 15) + 0.01 * repeat


def launched_run(out: Path, config: dict) -> tuple[dict, list[float]]:
    """One real run through the launcher's command line (in this process): its record and its
    global losses, a step each."""
    from dpbench.run.launch import main   # the engine and torch: only the tests that train
    assert main(["--config", json.dumps(config), "--out", str(out)]) == 0
    rec = results.read_json(out / results.METRICS)
    steps = (out / results.STEPS).read_text().splitlines() if (out / results.STEPS).exists() else []
    col = steps[0].split(",").index("loss_global") if steps else 0
    return rec, [float(line.split(",")[col]) for line in steps[1:]]


def write_fake_run(runs_dir: Path | str, variant: str = "single", gpus: int = 1, repeat: int = 0,
                   options: dict[str, Any] | None = None, images_per_s: float | None = 1000.0,
                   status: str = results.STATUS_OK, reason: str = "",
                   memory: Sequence[float | dict] | None = None,
                   global_batch: int | None = None, per_gpu_batch: int | None = None,
                   precision: str | None = None, steps: int = 40,
                   loss: Callable[[int, int], float] = default_loss,
                   warnings: Iterable[dict] = (), epochs: int = 2,
                   accuracy: Sequence[float] | None = None, device_type: str = "cuda",
                   seed: int | None = None, deterministic: bool = False,
                   config: dict[str, Any] | None = None, legacy: bool = False,
                   provenance: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> Path:
    """One run's folder as the engine leaves it; returns the folder.

    options: the run's swept options (they label the run id and override the config, like the
    plan does). memory: allocated MiB per device (or the memory entries themselves); default
    1300 MiB on every device. per_gpu_batch makes the run weak-scaling (global = per-GPU × gpus).
    A skipped run has no measurements; a failed run keeps what it measured. legacy=True writes a
    record from before seeds, scaling and per_gpu_batch were recorded. extra: more record keys
    (the sizes, memory_components, collectives).
    """
    options = dict(options or {})
    cfg = {"variant": variant, "gpus": gpus, "repeat": repeat, "options": options,
           "dataset": "synthetic", "feed": "gpu", "epochs": epochs, "global_batch": 128,
           "per_gpu_batch": None, "precision": "fp32", "channels_last": False, "lr": 0.1,
           "seed": repeat if seed is None else seed, "deterministic": deterministic,
           **(config or {}), **options}
    if precision is not None:
        cfg["precision"] = precision
    if per_gpu_batch is not None:
        cfg["per_gpu_batch"] = per_gpu_batch
    if cfg["per_gpu_batch"] is not None:
        cfg["global_batch"] = cfg["per_gpu_batch"] * gpus
    if global_batch is not None:
        cfg["global_batch"] = global_batch
    ran = status != results.STATUS_SKIPPED and images_per_s is not None
    if memory is None:
        memory = [1300.0] * gpus if ran else []
    mem = [m if isinstance(m, dict) else {"device": d, "allocated_mib": float(m),
                                          "reserved_mib": float(m) * 1.2, "nvml_used_mib": None,
                                          "data_mib": 0.0}
           for d, m in enumerate(memory)]
    step_rows = [{"epoch": 1 + s * epochs // steps, "step": s, "loss_global": loss(s, repeat),
                  "loss_reported": loss(s, repeat), "lr": 0.1, "step_ms": 5.0}
                 for s in range(steps)] if ran else []
    acc = accuracy if accuracy is not None else ([0.3 + 0.1 * e for e in range(1, epochs + 1)]
                                                 if ran else [])
    timed = max(0, steps - 2)
    step_ms = cfg["global_batch"] / images_per_s * 1e3 if ran and images_per_s else None
    rid = results.run_id(variant, gpus, repeat, options)
    rec = {
        "run_id": rid, "status": status, "reason": reason, "variant": variant, "gpus": gpus,
        "repeat": repeat, "options": options, "config": cfg, "device_type": device_type,
        "throughput": {"images_per_s": images_per_s if ran else None,
                       "timed_steps": timed if ran else 0, "step_ms_p50": step_ms,
                       "step_ms_p95": step_ms * 1.1 if step_ms else None, "step_ms_mean": step_ms},
        "memory": mem, "warnings": [dict(w) for w in warnings],
        "accuracy": [{"epoch": e, "test_acc": a, "test_loss": 2 - a} for e, a in enumerate(acc, 1)],
        "final_loss": step_rows[-1]["loss_global"] if step_rows else None,
        "steps": len(step_rows), "wall_s": 1.0,
        "provenance": dict(provenance or SYNTHETIC_PROVENANCE),
    }
    if not legacy:
        rec.update(seed=cfg["seed"], deterministic=deterministic,
                   scaling="weak" if cfg["per_gpu_batch"] is not None else "strong",
                   per_gpu_batch=cfg["global_batch"] / gpus)
    rec.update(extra or {})
    rdir = Path(runs_dir) / rid
    if step_rows:
        results.write_csv(rdir / results.STEPS, results.STEP_COLUMNS, step_rows)
    results.write_json(rdir / results.METRICS, rec)
    return rdir


def sharded_run(variant: str, gpus: int, parameters: int = 11_173_962, workload: str = "resnet18-cifar10",
                options: dict[str, Any] | None = None, images_per_s: float = 1000.0) -> dict:
    """A write_fake_run entry for a run with memory_components and collectives that are what the
    closed forms say (largest unit 3 MiB, 500 MiB of activations, 10 MiB of data), except device
    1's optimizer state, 20% over (ZeRO-1's uneven partition), and all-gathers 10% short."""
    from dpbench.analysis import memory_model, traffic_model
    options = dict(options or {})
    mib, sharded = memory_model.MIB, variant in ("fsdp", "hsdp")
    s = memory_model.Setting(variant=variant, parameters=parameters, ranks=gpus,
                             largest_unit_bytes=3 * mib if sharded else None,
                             reshard_after_forward=options.get("reshard_after_forward", True))
    b = {k: (v or 0) / mib for k, v in memory_model.predicted_bytes(s).items()}
    comps = [{"device": d, "parameters_mib": b["parameters"], "gradients_mib": b["gradients"],
              "optimizer_mib": b["optimizer"] * (1.2 if d == 1 else 1.0),
              "largest_unit_mib": 3.0 if sharded else None,
              "forward_peak_mib": b["state"] + 410, "backward_peak_mib": b["state"] + 510,
              "step_peak_mib": b["state"] + 10, "activation_peak_mib": 500.0, "reserved_peak_mib": 2000.0}
             for d in range(gpus)]
    colls = [{"collective": c, "count": 3, "bytes": int(t["payload"] * (0.9 if c == "all_gather" else 1))}
             for c, t in traffic_model.predicted_traffic(variant, parameters, gpus).items()]
    return dict(variant=variant, gpus=gpus, options=options, config={**options, "momentum": 0.9},
                images_per_s=images_per_s,
                memory=[{"device": d, "allocated_mib": 1300.0, "reserved_mib": 1500.0,
                         "nvml_used_mib": None, "data_mib": 10.0} for d in range(gpus)],
                extra={"parameters": parameters, "param_bytes": 4 * parameters,
                       "workload": {"name": workload, "args": {}, "source_sha256": None},
                       "memory_components": comps, "collectives": colls})


def dp_warning(count: int = 98) -> dict:
    """The warning nn.DataParallel gives when replicas return scalar losses."""
    return {"category": "UserWarning", "message": DP_WARNING, "count": count, "first_step": 0,
            "rank": 0, "location": "torch/nn/parallel/_functions.py:70"}


@dataclass
class FakeResultSet:
    root: Path
    tag: str

    @property
    def runs_dir(self) -> Path:
        return results.runs_dir(self.root, self.tag)

    def table(self, name: str):
        from dpbench.analysis.tables import load_table
        return load_table(self.root, self.tag, name)

    def collect(self) -> dict[str, Path]:
        """Collect again (after adding or damaging runs)."""
        return collect.collect(self.root, self.tag)


def expand(spec: Iterable[dict]) -> list[dict]:
    """Entries whose images_per_s is a list become one entry per repeat."""
    out = []
    for entry in spec:
        speeds = entry.get("images_per_s")
        if isinstance(speeds, (list, tuple)):
            out += [{**entry, "images_per_s": v, "repeat": r} for r, v in enumerate(speeds)]
        else:
            out.append(dict(entry))
    return out


def fake_result_set(tmp_path: Path | str, spec: Iterable[dict], tag: str = TAG,
                    collect_runs: bool = True) -> FakeResultSet:
    """Writes every run of `spec` under <tmp_path>/<tag>/runs and collects them."""
    rs = FakeResultSet(Path(tmp_path), tag)
    for entry in expand(spec):
        write_fake_run(rs.runs_dir, **entry)
    if collect_runs:
        rs.collect()
    return rs


# -- the workflow in a temporary folder ------------------------------------------------------

# What Snakemake needs beside the Snakefile: the pipeline's own files, and the package the rules
# import (a copy, so that a test may damage it without touching the repository).
WORKFLOW_FILES = ("Snakefile", "rules", "config.yaml", "experiments", "report", "envs", "src")


def copy_workflow(wd: Path | str, extra: Iterable[str] = ()) -> Path:
    """Copies the workflow (and the repository paths in `extra`, e.g. "profiles") into wd,
    made if missing; returns wd."""
    wd = Path(wd)
    wd.mkdir(parents=True, exist_ok=True)
    for name in (*WORKFLOW_FILES, *extra):
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, wd / name)
    return wd


def run_module(module: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m module args` in this process: runpy runs the module as __main__, as -m does;
    its exit code, stdout and stderr as a finished process's. An uncaught exception propagates
    (where a process would print its traceback and exit 1)."""
    out, err = io.StringIO(), io.StringIO()
    argv, code = sys.argv, 0
    sys.argv = [module, *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            # runpy's note that the module was imported before (by the tests): not the command's output
            warnings.filterwarnings("ignore", message=".*found in sys.modules after import of package",
                                    category=RuntimeWarning)
            try:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            except SystemExit as exc:   # as the interpreter ends on it
                if isinstance(exc.code, int) or exc.code is None:
                    code = exc.code or 0
                else:
                    print(exc.code, file=sys.stderr)
                    code = 1
    finally:
        sys.argv = argv
    return subprocess.CompletedProcess([sys.executable, "-m", module, *args], code, out.getvalue(), err.getvalue())


def run_snakemake(wd: Path | str, *args: str, cores: int | None = 2, env: dict | None = None,
                  timeout: int = 600, check: bool = False) -> subprocess.CompletedProcess:
    """`python -m snakemake --cores <cores> <args>` in wd, its output captured.

    cores=None leaves --cores out (a profile, or args, sets it). env=None inherits this
    process's environment. check=True fails the test when Snakemake fails, with the end of
    its output.
    """
    cmd = [sys.executable, "-m", "snakemake", *(["--cores", str(cores)] if cores is not None else []),
           *args]
    proc = subprocess.run(cmd, cwd=wd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n"
                             f"{proc.stderr[-6000:]}")
    return proc


# -- checks of a drawn figure ----------------------------------------------------------------

def display_points(artist) -> np.ndarray:
    """Where an artist's data land on the canvas, in pixels."""
    if isinstance(artist, Rectangle):   # a bar's value is the middle of its top edge
        (x0, y0), (x1, y1) = artist.get_bbox().get_points()
        return artist.get_data_transform().transform([[(x0 + x1) / 2, y1]])
    if isinstance(artist, LineCollection):
        segs = [s for s in artist.get_segments() if len(s)]
        pts = np.concatenate(segs) if segs else np.empty((0, 2))
        return artist.get_transform().transform(pts)
    if isinstance(artist, PathCollection):
        return artist.get_offset_transform().transform(artist.get_offsets())
    if isinstance(artist, Collection):
        return np.concatenate([artist.get_transform().transform(p.vertices)
                               for p in artist.get_paths()] or [np.empty((0, 2))])
    xy = artist.get_xydata()
    return artist.get_transform().transform(xy[np.isfinite(xy).all(axis=1)])


def drawn_artists(ax, prefix: str = "") -> list:
    """A panel's lines, collections and bars; with `prefix` (figstyle.DATA, REFERENCE) only
    those whose gid starts with it."""
    every = list(ax.lines) + list(ax.collections) + [p for p in ax.patches if isinstance(p, Rectangle)]
    return [a for a in every if (a.get_gid() or "").startswith(prefix)] if prefix else every


def outside_points(fig, tol: float = 1.0) -> list:
    """(artist, panel title, x, y) of every drawn point, measured or reference, outside its panel."""
    bad = []
    for ax in fig.axes:
        box = ax.bbox
        for artist in drawn_artists(ax):
            for x, y in display_points(artist):
                if not (box.x0 - tol <= x <= box.x1 + tol and box.y0 - tol <= y <= box.y1 + tol):
                    bad.append((type(artist).__name__, ax.get_title(), x, y))
    return bad


def is_placeholder(fig) -> bool:
    """A figure that says why it has nothing to draw (figstyle.placeholder)."""
    return any(ax.get_gid() == PLACEHOLDER for ax in fig.axes)


def empty_panels(fig) -> list[str]:
    """Titles of panels that are switched off or draw no variant's data: reference lines (ideal,
    1.0, 0) do not count, nor do artists that draw no point."""
    return [ax.get_title() for ax in fig.axes
            if not ax.axison or not any(len(display_points(a)) for a in drawn_artists(ax, DATA))]


def untagged(fig) -> list:
    """Drawn artists that say neither a variant nor a reference in their gid (the checks above
    would not know what they are)."""
    return [(ax.get_title(), type(a).__name__) for ax in fig.axes for a in drawn_artists(ax)
            if not (a.get_gid() or "").startswith((DATA, REFERENCE))]


def points_along(ax, samples: int = 24) -> np.ndarray:
    """display_points of a panel's artists, plus points along the segments of drawn lines."""
    pts = [display_points(a) for a in drawn_artists(ax)]
    for line in ax.lines:
        xy = display_points(line)
        if line.get_linestyle() not in ("None", "none", "") and len(xy) > 1:
            t = np.linspace(0, 1, samples)[:, None, None]
            pts.append((xy[:-1] + t * (xy[1:] - xy[:-1])).reshape(-1, 2))
    return np.concatenate(pts) if pts else np.empty((0, 2))


def note_boxes(ax) -> list:
    """(text, box) of a panel's notes: its texts on a box (bar labels have none)."""
    renderer = ax.figure.canvas.get_renderer()
    return [(t.get_text(), t.get_bbox_patch().get_window_extent(renderer))
            for t in ax.texts if t.get_bbox_patch() is not None]


def notes_over_data(fig) -> list:
    """(panel title, note, points) for every note whose box covers drawn points."""
    bad = []
    for ax in fig.axes:
        pts = points_along(ax)
        for text, box in note_boxes(ax):
            hit = (pts[:, 0] >= box.x0) & (pts[:, 0] <= box.x1) & (pts[:, 1] >= box.y0) & (pts[:, 1] <= box.y1)
            if hit.any():
                bad.append((ax.get_title(), text, int(hit.sum())))
    return bad


def text_boxes(fig) -> tuple[list, list]:
    """What a reader must be able to read, as (owner, what, box): per panel (owner: its index)
    the title, each axis with its tick labels and label, and the notes; for the figure (owner
    None) the title, the footnote and the legends. Also the panels' plotting areas."""
    renderer = fig.canvas.get_renderer()
    texts, areas = [], []
    for i, ax in enumerate(fig.axes):
        if ax.get_title():
            texts.append((i, f"title {ax.get_title()!r}", ax.title.get_window_extent(renderer)))
        for name, axis in (("x axis", ax.xaxis), ("y axis", ax.yaxis)):
            box = axis.get_tightbbox(renderer)
            if ax.axison and axis.get_visible() and box is not None and box.width and box.height:
                texts.append((i, f"{name} of {ax.get_title()!r}", box))
        texts += [(i, f"note {text!r}", box) for text, box in note_boxes(ax)]
        areas.append((i, f"panel {ax.get_title()!r}", ax.bbox))
    for what, art in (("figure title", fig._suptitle), ("footnote", fig._supxlabel)):
        if art is not None and art.get_text():
            texts.append((None, f"{what} {art.get_text()!r}", art.get_window_extent(renderer)))
    texts += [(None, "legend", leg.get_window_extent(renderer)) for leg in fig.legends]
    return texts, areas


def overlapping_texts(fig) -> list:
    """Pairs that overlap, and texts cut off by the canvas' edge: a panel's texts against another
    panel's texts and plotting area, a panel's title against its own axes' labels, the figure's
    texts (title, footnote, legend) against everything."""
    texts, areas = text_boxes(fig)
    canvas = fig.bbox
    bad = [(what, "canvas edge") for _, what, box in texts
           if box.x0 < canvas.x0 - 1 or box.x1 > canvas.x1 + 1 or box.y0 < canvas.y0 - 1 or box.y1 > canvas.y1 + 1]
    for k, (own_a, a, box_a) in enumerate(texts):
        for own_b, b, box_b in texts[k + 1:]:
            same_panel = own_a == own_b and own_a is not None
            own_title = same_panel and (a.startswith("title") or b.startswith("title"))
            if (not same_panel or own_title) and box_a.overlaps(box_b):
                bad.append((a, b))
        for own_b, b, box_b in areas:
            if own_a != own_b and box_a.overlaps(box_b):
                bad.append((a, b))
    return bad


def pids_naming(marker: str) -> list[int]:
    """Live processes (not zombies) whose command line names `marker` (a run's out folder): its
    launcher, torchrun and the ranks."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in cmd and state not in ("Z", "X"):
            pids.append(int(proc.name))
    return pids

# -- compare's synthetic pairs: three run groups x 3 repeats, written as collect lays them out
# (tests/analysis/compare and the knobs' compare test edit make_runs()'s list, then write_set)

BASE_IPS = {("single", 1): 10_000.0, ("dp", 2): 15_000.0, ("ddp", 2): 19_000.0}
JITTER = (1.0, 1.01, 0.99)  # ~1% spread between the 3 repeats
N_STEPS = 40
PAIR_PROVENANCE = {"torch": "2.14.1+cu130", "torch_git": "abc123", "cuda": "13.0", "cudnn": 91900,
              "nccl": "2.28.9", "driver": "580.159.04", "gpu_names": ["NVIDIA H200", "NVIDIA H200"],
              "python": "3.11.7", "hostname": "node1", "git_sha": "deadbeef"}
PAIR_DP_WARNING = {"category": "UserWarning", "message": "Was asked to gather along dimension 0",
              "count": 98, "first_step": 0, "location": "torch/nn/parallel/_functions.py:70", "rank": 0}


def curve(repeat: int, noise: float = 0.02, salt: int = 0) -> list[float]:
    """A decaying loss with repeat-to-repeat noise, as different seeds would give."""
    rng = np.random.default_rng(1000 * salt + repeat)
    steps = np.arange(N_STEPS)
    return list(2.3 * np.exp(-steps / 15) + 0.4 + rng.normal(0, noise, N_STEPS))


def make_runs(deterministic: bool | None = None) -> list[dict]:
    """3 repeats of three run groups; tests edit this list before writing the candidate.

    deterministic=None writes records as they were before the field existed (no seed either)."""
    runs = []
    for (variant, gpus), ips in BASE_IPS.items():
        for repeat, jitter in enumerate(JITTER):
            runs.append({
                "variant": variant, "gpus": gpus, "repeat": repeat, "options": {},
                "status": results.STATUS_OK, "reason": "", "images_per_s": ips * jitter,
                "memory": [2000.0 + 300 * (d == 0) for d in range(gpus)],
                "warnings": [dict(PAIR_DP_WARNING)] if variant == "dp" else [],
                "losses": curve(repeat), "test_acc": 0.60 + 0.01 * repeat,
                "config": {"variant": variant, "gpus": gpus, "repeat": repeat, "options": {},
                           "lr": 0.1, "global_batch": 128, "precision": "fp32", "seed": repeat,
                           **({} if deterministic is None else {"deterministic": deterministic})},
                "record": {} if deterministic is None else {"seed": repeat, "deterministic": deterministic},
                "device_type": "cuda",
            })
    return runs


def write_set(root, tag: str, runs: list[dict], provenance: dict | None = None) -> None:
    """Per-run metrics.json + steps.csv and the tidy tables, with results' columns and writers."""
    tables: dict[str, list[dict]] = {name: [] for name in results.TABLES}
    for run in runs:
        rid = results.run_id(run["variant"], run["gpus"], run["repeat"], run["options"])
        ok = run["status"] == results.STATUS_OK
        key = {"run_id": rid, "variant": run["variant"], "gpus": run["gpus"],
               "options": results.options_label(run["options"]), "repeat": run["repeat"]}
        steps = [{"epoch": 1, "step": s, "loss_global": loss, "loss_reported": loss, "lr": 0.1,
                  "step_ms": 10.0} for s, loss in enumerate(run["losses"])]
        tables["summary"].append({**key, "status": run["status"], "reason": run["reason"],
                                  "images_per_s": run["images_per_s"] if ok else None,
                                  "peak_mem_mib": max(run["memory"]), "n_warnings": len(run["warnings"]),
                                  "final_loss": run["losses"][-1], "test_acc": run["test_acc"] if ok else None,
                                  "global_batch": 128, "device_type": run["device_type"]})
        tables["memory"] += [{**key, "device": d, "allocated_mib": m, "reserved_mib": m + 100}
                             for d, m in enumerate(run["memory"])]
        tables["warnings"] += [{**key, **w} for w in run["warnings"]]
        tables["accuracy"].append({**key, "epoch": 1, "test_acc": run["test_acc"], "test_loss": 1.0})
        tables["steps"] += [{**key, **s} for s in steps]
        results.write_json(results.run_dir(root, tag, rid) / results.METRICS,
                     {"run_id": rid, "status": run["status"], "config": run["config"], **key,
                      **run["record"]})
        results.write_csv(results.run_dir(root, tag, rid) / results.STEPS, results.STEP_COLUMNS, steps)
    for name, rows in tables.items():
        results.write_csv(results.table_path(root, tag, name), results.TABLES[name], rows)
    prov = {**PAIR_PROVENANCE, **(provenance or {}), "tag": tag, "n_runs": len(runs)}
    results.write_json(results.provenance_path(root, tag), prov)
