"""Writes README.md into each folder under results/reference/ that has none, from what the
folder's own files (provenance.json, the run records) and its git history say. Never overwrites
a README and touches no other file (the evidence stays as committed):
    python tools/reference_readmes.py            # writes the missing ones, prints their names
A command this repository did not record is said to be unrecorded, never guessed."""
from __future__ import annotations

import glob
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "results" / "reference"

DEFAULT = ("The default experiment (`experiments/scaling.yaml`: groups `scaling` and `curves`, ResNet18 on "
           "CIFAR-10, global batch 512, one epoch) on one H200; the 2-4 GPU cells are skipped records.")
SESSION = "bash tools/device/session.sh $OUT scaling {name} 510   # DPBENCH_GIT_SHA set to the commit below"
CPU_AA = ("One of three CPU A/A launches of `experiments/cpu_check.yaml` (the CPU plan, 3 repeats) under torch "
          "{torch}, the versions alternating on this 2-core machine, from a clean clone (docs/compare.md).")
CPU_CMD = "python -m snakemake --cores all --config experiment=cpu_check tag={name}   # the venv of torch {torch}"

# folder -> (what, command); the command where a commit message or doc names it, else unrecorded.
KNOWN = {
    "compare": ("The committed `dpbench compare` reports (markdown and json twin) between reference sets; each "
                "json records its baseline, candidate, thresholds, A/A launches (`noise_from`) and format.",
                "dpbench compare --results-dir results/reference --baseline A --candidate B [--noise-from ...]"
                "   # per report: the arguments its json records"),
    "cpu_check-torch-2.13.0+cpu": ("The first CPU regression example: `experiments/cpu_check.yaml` under torch "
                                   "2.13.0+cpu (docs/compare.md, 'An example without GPUs').",
                                   "/tmp/v213/bin/python -m snakemake --cores all --config experiment=cpu_check"),
    "cpu_check-torch-2.14.1+cu130": ("The first CPU regression example: `experiments/cpu_check.yaml` under torch "
                                     "2.14.1+cu130 running on the CPU (docs/compare.md).",
                                     "python -m snakemake --cores all --config experiment=cpu_check"),
    "h200-torch-2.11.0+cu130": (DEFAULT + " The first of two launches with exclusive timing (its A/A twin: "
                                "`h200-aa2-torch-2.11.0+cu130`).", None),
    "h200-aa2-torch-2.11.0+cu130": (DEFAULT + " The second of two launches (A/A with "
                                    "`h200-torch-2.11.0+cu130`).", None),
    "h200-67dd99a-torch-2.11.0+cu130": (DEFAULT + " At 67dd99a, start-up times recorded.", None),
    "h200-2951eab-torch-2.11.0+cu130": (DEFAULT + " At 2951eab, with start-up phases.", None),
    "h200-92a6737-torch-2.11.0+cu130": (DEFAULT + " A fifth launch, at 92a6737.", None),
    "h200-92a6737-aa2-torch-2.11.0+cu130": (DEFAULT + " 92a6737 launched again on a second machine lease: a "
                                            "pure A/A with `h200-92a6737-torch-2.11.0+cu130`.", None),
    "h200-compile-torch-2.11.0+cu130": ("torch.compile modes (eager, default, reduce-overhead, max-autotune) for "
                                        "single bf16 + channels_last on one H200, measured together, with the "
                                        "targets table (docs/performance.md).", None),
    "h200-perf-torch-2.11.0+cu130": ("The perf experiment's single-GPU cells (`experiments/perf.yaml`), batch 512, "
                                     "with the step benchmarks and the targets table; the DDP cells need two "
                                     "GPUs and are skipped records.", None),
    "h200x2-curves-torch-2.11.0+cu130": ("The default experiment's 2-GPU cells on 2x H200, one seed for both "
                                         "repeats: each variant's deterministic pair compared bit for bit.", None),
    "h200x2-engine-torch-2.11.0+cu130": ("The engine check on 2x H200: 23 runs, one folder a run "
                                         "(`<cell>/metrics.json`), made before runs recorded a git sha.", None),
    "h200x2-torch-2.11.0+cu130": ("The default experiment on 2x H200 (2 epochs, every repeat with seed 0); its "
                                  "memory peaks include the test pass (NOTE.md).", None),
}


def _git_log(name: str) -> list[str]:
    out = subprocess.run(["git", "log", "--format=%h %ad %s", "--date=short", "--", f"results/reference/{name}"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line]


def facts(folder: Path) -> dict:
    prov = {}
    if (folder / "provenance.json").is_file():
        prov = json.loads((folder / "provenance.json").read_text())
    recs = sorted(glob.glob(str(folder / "runs" / "*" / "metrics.json")) + glob.glob(str(folder / "*" / "metrics.json")))
    first = json.loads(Path(recs[0]).read_text()).get("provenance", {}) if recs else {}
    shas = set()
    for r in recs:
        sha = (json.loads(Path(r).read_text()).get("provenance") or {}).get("git_sha")
        shas.add(sha or "not recorded")
    gpus = prov.get("gpu_names") or first.get("gpu_names") or []
    flat = [g for x in gpus for g in (x if isinstance(x, list) else [x])]
    most = max([len(x) for x in gpus if isinstance(x, list)] or [len(flat)])
    dataset = prov.get("dataset") or first.get("dataset") or {}
    return {"shas": sorted(shas) or [prov.get("git_sha") or "not recorded"], "torch": prov.get("torch") or first.get("torch"),
            "gpus": flat, "most_gpus": most, "driver": prov.get("driver") or first.get("driver"), "host": prov.get("hostname"),
            "runs": len(recs), "checksum": dataset.get("checksum") if isinstance(dataset, dict) else None}


def readme(name: str) -> str:
    folder = REF / name
    what, command = KNOWN.get(name, ("(not described)", None))
    f = facts(folder)
    log = _git_log(name)
    torch = f["torch"] or (name.split("torch-")[-1] if "torch-" in name else "not recorded")
    if command is None and name.startswith("h200-") and "torch-" in name and "compile" not in name and "perf" not in name:
        command = SESSION.format(name=name)
    if command is None and name.startswith("cpu_check-aa"):
        command = CPU_CMD.format(name=name, torch=torch)
    if name.startswith("cpu_check-aa"):
        what = CPU_AA.format(torch=torch)
    machine = f"{f['most_gpus']}x {f['gpus'][0]}" if f["gpus"] else "a 2-core CPU machine (no GPU)"
    data = ""
    if f["checksum"] == "mismatch":
        data = ("\n\nData: CIFAR-10 as the runs found it was **not the official release** (`checksum: mismatch` in "
                "provenance): the lossy JPEG rebuild of it, so accuracies and losses are of that copy.")
    lines = [f"# {name}", "", "Written after the fact by `tools/reference_readmes.py` from this folder's own files and "
             "its git history; nothing else here was changed.", "", f"**What.** {what}", "",
             "**Command.**" + (f"\n\n    {command}" if command else
                                " not recorded in this repository; the commit that added the folder says what was "
                                "run (below)."), "",
             f"**Commit.** {', '.join(f['shas'])} (the runs' recorded `git_sha`" + ("; `+dirty`: a tree with changes)"
                                                                                    if any('dirty' in s for s in f['shas']) else ")"),
             "", f"**Machine.** {machine}; torch {torch}" + (f", driver {f['driver']}" if f["driver"] else "")
             + (f", host `{f['host']}`" if f["host"] else "") + f"; {f['runs']} run records." + data, "",
             f"**Date.** committed {log[-1].split()[1] if log else 'unknown'} (the records carry no timestamp); "
             "git log of this folder, oldest last:", ""]
    lines += [f"    {entry[:160]}" for entry in log]
    return "\n".join(lines) + "\n"


def main() -> int:
    for folder in sorted(p for p in REF.iterdir() if p.is_dir()):
        if not (folder / "README.md").exists():
            (folder / "README.md").write_text(readme(folder.name))
            print(folder.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
