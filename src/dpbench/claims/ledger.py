"""The claims ledger: probe records + the claims experiment's tables -> claims.md / claims.json.

    python -m dpbench.claims.ledger --results-dir results --tag TAG [--plan results/TAG/plan.json]

Each verdict is computed from the evidence (each claim's cN/verdict.py and text.py, found through
dpbench.claims.registry), never copied from a table of expectations. A group's runs are the rows of
runs.csv whose cell_id is one the plan gave the group's runs (an older set without runs.csv: the
summary.csv rows with the group's options label); a claim whose runs are absent says why, quoting
the skip reasons.
"""
from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

import pandas as pd

from dpbench import results
from dpbench.claims import ADVICE, CLAIMS, NOT_RUN, needs_text
from dpbench.claims import figures as claim_figures
from dpbench.claims.records import Finding, ProbeRecord, Section
from dpbench.claims.registry import REGISTRY
from dpbench.claims.settings import claim_groups
from dpbench.plan.matrix import read_identities, read_plan
from dpbench.report.markdown import md_table

# Claim -> stems of results.FIGURE_NAMES drawn over the whole tag that show its evidence
# (C1, C6, C7 and C8 have figures of their own: their cN/figure.py).
FIGURES = {"C5": ("warnings",)}


def _table(rs: results.ResultSet, name: str) -> pd.DataFrame:
    if not rs.table_path(name).exists():
        return pd.DataFrame(columns=results.TABLES[name])
    return rs.table(name)


def _runs_table(rs: results.ResultSet) -> pd.DataFrame:
    """A row a run: runs.csv, with the cell id its plan gave each run, where collect wrote it;
    else summary.csv (a set collected before runs.csv existed), whose rows carry no cell id."""
    return rs.table("runs") if rs.table_path("runs").exists() else _table(rs, "summary")


class Evidence:
    """Everything a verdict may look at, for one tag."""

    def __init__(self, results_dir: Path | str, tag: str, experiment_path: Path | str):
        self.rs = results.ResultSet(results_dir, tag)
        self.groups = read_plan(experiment_path)
        identities = read_identities(experiment_path)
        # each group's cells: the cell ids the plan gave the group's runs
        self.group_cells = {name: {identities[rid].cell_id for rid in group["runs"]}
                            for name, group in self.groups.items()}
        self.tables = {name: _table(self.rs, name) for name in ("memory", "steps", "warnings")}
        self.tables["summary"] = _runs_table(self.rs)
        self.provenance = self.rs.provenance() if self.rs.provenance_path.exists() else {}
        self.probes = {cid: ProbeRecord.from_json(results.read_json(path))
                       for cid, path in self.rs.probe_paths().items()}
        self._metrics: dict[str, dict] = {}

    def _record(self, run_id: str) -> dict[str, Any]:
        if run_id not in self._metrics:
            self._metrics[run_id] = self.rs.metrics(run_id) or {}
        return self._metrics[run_id]

    def run_config(self, run_id: str) -> dict[str, Any] | None:
        """The config a run actually trained with (its metrics.json), None where the record is absent."""
        return self._record(run_id).get("config")

    def model_size(self, run_id: str) -> tuple[int | None, int | None]:
        """The run's model as its record counted it: (parameters, their bytes); None for what a
        record from before workloads (issue 25) did not count."""
        rec = self._record(run_id)
        return rec.get("parameters"), rec.get("param_bytes")

    def train_size(self, run_id: str) -> int | None:
        """Images in the run's training set: as its record's provenance counted them, else as its
        config sizes a synthetic set; None where neither says (no size is assumed)."""
        rec = self._record(run_id)
        size = ((rec.get("provenance") or {}).get("dataset") or {}).get("train_size")
        cfg = rec.get("config") or {}
        if size is None and cfg.get("dataset") == "synthetic":
            size = cfg.get("synthetic_size")
        return int(size) if size else None

    def claim_groups(self, cid: str) -> list[str]:
        """The experiment's groups for a claim (settings.claim_groups)."""
        return claim_groups(self.groups, cid)

    def runs_of(self, groups: list[str]) -> pd.DataFrame:
        """The runs of these groups, whatever their status: by the cell ids the plan gave them,
        or, in a set without cell ids (no runs.csv), by the groups' options labels."""
        s = self.tables["summary"]
        if "cell_id" in s.columns:
            return s[s["cell_id"].isin(set().union(*(self.group_cells[g] for g in groups)))]
        return s[s["options"].isin({self.groups[g]["label"] for g in groups})]

    def rows(self, group: str, variant: str | None = None, gpus: int | None = None) -> pd.DataFrame:
        """The group's ok runs, optionally of one variant and GPU count."""
        df = self.runs_of([group])
        df = df[df["status"] == results.STATUS_OK]
        if variant is not None:
            df = df[df["variant"] == variant]
        if gpus is not None:
            df = df[df["gpus"] == gpus]
        return df

    def gpus_found(self) -> int:
        """GPUs seen here: the probes' count, else the largest GPU count an ok CUDA run used."""
        seen = [p.ran_on.get("gpus_visible", 0) for p in self.probes.values()]
        s = self.tables["summary"]
        seen += s[(s["status"] == results.STATUS_OK) & (s["device_type"] == "cuda")]["gpus"].tolist()
        return int(max(seen, default=0))

    def not_run(self, needed: int, groups: list[str]) -> str:
        """`not run here: needs N GPUs (found M)`, plus the engine's own reasons for its runs."""
        found = self.gpus_found()
        mine = self.runs_of(groups)
        not_ok = mine[mine["status"] != results.STATUS_OK]
        parts = [needs_text(needed, found)] if found < needed else []
        if mine.empty:
            table = self.rs.table_path("runs" if "cell_id" in self.tables["summary"].columns else "summary").name
            parts.append(f"{table} has no runs of {', '.join(groups) or 'any group for this claim'}")
        elif len(not_ok):
            reasons = sorted({f"{r.status}: {r.reason}" for r in not_ok.itertuples()})
            parts.append(f"{len(not_ok)} runs {'/'.join(sorted(set(not_ok['status'])))}, e.g. "
                         + "; ".join(f'"{r}"' for r in reasons[:3]))
        return f"{NOT_RUN}: " + ("; ".join(parts) or "the runs lack the numbers this claim needs")

    def measured_on_runs(self) -> str:
        p = self.provenance
        if not p:
            return "runs: no provenance.json"
        names = results.widest_gpu_names(p)   # runs that saw different sets: the largest
        gpus = ", ".join(f"{names.count(n)}x {n}" for n in sorted(set(names)))
        return "runs: " + _versions(p.get("torch"), p.get("cuda"), p.get("cudnn"),
                                    gpus or "no GPU", p.get("driver") and f"driver {p['driver']}")

    def measured_on_probe(self, cid: str) -> str:
        r = self.probes[cid].ran_on
        where = f"{r['gpus_visible']}x {r['gpu_names'][0]}" if r["gpus_visible"] else "CPU only"
        return "probe: " + _versions(r["torch"], r["cuda"] if r["gpus_visible"] else None, r.get("cudnn"),
                                     where, f"Python {r.get('python')}")

    def figures(self, cid: str) -> list[str]:
        """The tag's figures (results.FIGURE_NAMES) that bear on this claim, where drawn, relative
        to the tag's folder (where claims.md is)."""
        paths = [self.rs.figure_path(name) for name in FIGURES.get(cid, ())]
        return [self.rs.relative(p) for p in paths if p.exists()]


def _versions(torch, cuda, cudnn, *rest) -> str:
    parts = [f"torch {torch}", cuda and f"CUDA {cuda}", cudnn and f"cuDNN {cudnn}", *rest]
    return ", ".join(str(p) for p in parts if p)


def render_md(tag: str, sections: list[Section]) -> str:
    out = [f"# Claims ledger: {tag}", "",
           "Each verdict is computed from the evidence below: probes in `claims/C*.json`, "
           "runs of `experiments/claims.yaml` in the tidy tables.", "",
           md_table(["id", "claim", "verdict", "evidence"],
                    [[s.id, s.title, s.verdict, s.summary] for s in sections])]
    for s in sections:
        out += ["", render_section(s).rstrip(), ""]
    return "\n".join(out).rstrip() + "\n"


def render_section(s: Section) -> str:
    """One claim's part of claims.md: claim, verdict, evidence, figures, where measured, advice."""
    out = [f"## {s.id}: {s.title}", "", f"**Claim.** {s.claim}", "", f"**Verdict: {s.verdict}.**", ""]
    if s.not_run:
        out += [f"**Not measured here:** {s.not_run.removeprefix(NOT_RUN + ': ')}", ""]
    if s.evidence:
        out += ["**Evidence.**", ""] + [f"- {line}" for line in s.evidence] + [""]
    out += [f"![{s.id}: {Path(f).stem}]({f})" for f in s.figures] + ([""] if s.figures else [])
    out += [f"**Measured on.** {'; '.join(s.measured_on) or 'nothing measured here'}", ""]
    out += [f"**What to do.** {s.advice}", ""]
    return "\n".join(out)


def build_sections(ev: Evidence) -> list[Section]:
    built = []
    for cid, claim in REGISTRY.items():
        f: Finding = claim.finding(ev)
        built.append(Section(id=cid, title=CLAIMS[cid][0], claim=CLAIMS[cid][1], verdict=f.verdict,
                             summary=f.summary or f.not_run or "", advice=f.advice or ADVICE[cid],
                             evidence=f.evidence, data=f.data, measured_on=f.measured_on, not_run=f.not_run,
                             figures=ev.figures(cid) if f.runs_used else [], runs_used=f.runs_used))
    return built


def write_ledger(results_dir: Path | str, tag: str,
                 experiment_path: Path | str | None = None) -> tuple[Path, Path]:
    experiment_path = experiment_path or results.ResultSet(results_dir, tag).plan_path
    ev = Evidence(results_dir, tag, experiment_path)
    built = build_sections(ev)
    drawn = claim_figures.draw(results_dir, tag, built)
    for s in built:
        s.figures[:0] = [path for key, path in drawn.items() if claim_figures.claim_of(key) == s.id]
    for claim in REGISTRY.values():
        for name, where in claim.tables.items():
            module, function = where.split(":")
            ev.rs.write_claim_table(name, getattr(importlib.import_module(f"dpbench.claims.{module}"), function)(ev))
    md_path, json_path = ev.rs.claims_md, ev.rs.claims_json
    results.write_atomic(md_path, render_md(tag, built))
    results.write_json(json_path, {"tag": tag, "experiment": str(experiment_path),
                                   "probes": sorted(ev.probes), "claims": [s.to_json() for s in built]})
    return md_path, json_path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results-dir", default="results")
    ap.add_argument("--tag", required=True)
    ap.add_argument("--plan", help="the experiment as planned (default: the tag's plan.json)")
    args = ap.parse_args(argv)
    md_path, json_path = write_ledger(args.results_dir, args.tag, args.plan)
    print(f"wrote {md_path} and {json_path}")


if __name__ == "__main__":
    main()
