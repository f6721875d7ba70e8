"""Named queries on the committed references: every number docs/findings.md and docs/sharding.md
quote, computed from the reference folder it comes from (its tables, records or bench json), never
typed by hand. A page's template (docs/templates/<page>.md.in) names them as {{query}}; the
renderer (dpbench.report.docs_render) fills them in and a test re-renders and diffs. Other pages'
queries register here with `query` from their own modules (dpbench.advise.docs for advise.md,
dpbench.report.bisect_queries for bisect.md, dpbench.claims.c9.docs for sharding.md's rehearsed ranks).

Each query names the one reference it reads; the page links that folder where it quotes it.
"""
from __future__ import annotations

import glob
import json
import re
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dpbench.analysis import memory_model
from dpbench.analysis.collect import memory_component_rows
from dpbench.results.formats import step_bound


@dataclass(frozen=True)
class Query:
    name: str
    reference: str
    """The folder under results/reference the value comes from ("" where it spans several)."""
    fn: Callable[[Path], str]


QUERIES: dict[str, Query] = {}


def query(name: str, reference: str = ""):
    def register(fn: Callable[[Path], str]) -> Callable[[Path], str]:
        QUERIES[name] = Query(name, reference, fn)
        return fn
    return register


def _k(x: float) -> str:
    """Images/s in thousands to one decimal: 36.7k."""
    return f"{x / 1000:.1f}k"


def _range(lo: float, hi: float, fmt: str = "{:.3g}", dash: str = "–") -> str:
    a, b = fmt.format(lo), fmt.format(hi)
    return a if a == b else f"{a}{dash}{b}"


def _summary(ref: Path, name: str) -> pd.DataFrame:
    s = pd.read_csv(ref / name / "summary.csv")
    s["options"] = s["options"].astype("string").fillna("")
    return s[s["status"] == "ok"]


# -- one H200, the default experiment -------------------------------------------------------------

H200 = "h200-torch-2.11.0+cu130"


def _fast_gaps(ref: Path) -> tuple[pd.Series, int]:
    """|loss - single's of the same seed| per (variant, seed, step) of the fast one-GPU runs."""
    steps = pd.read_csv(ref / H200 / "steps.csv")
    s = _summary(ref, H200)
    fast = steps.merge(s[["run_id", "deterministic", "seed"]], on="run_id")
    fast = fast[(~fast["deterministic"].astype(bool)) & (fast["gpus"] == 1)]
    single = fast[fast["variant"] == "single"].set_index(["seed", "step"])["loss_global"]
    parts = []
    for variant, g in fast[fast["variant"] != "single"].groupby("variant"):
        g = g.set_index(["seed", "step"])["loss_global"]
        d = (g - single.reindex(g.index)).abs()
        parts.append(pd.concat({variant: d}, names=["variant"]))
    return pd.concat(parts), int(fast["step"].max())


@query("determinism_table", H200)
def determinism_table(ref: Path) -> str:
    """Per one-GPU variant: fast and deterministic images/s (median, with the interval medians.csv
    gives and its confidence) and what determinism costs."""
    m = pd.read_csv(ref / H200 / "medians.csv")
    m["options"] = m["options"].astype("string").fillna("")
    m = m[(m["gpus"] == 1) & (m["quantity"] == "images_per_s")]
    fast, det = m[m["options"] == ""].set_index("variant"), m[m["options"] == "deterministic=True"].set_index("variant")
    n_f, n_d = int(fast["n"].iloc[0]), int(det["n"].iloc[0])
    lv_f, lv_d = fast["ci_level"].iloc[0], det["ci_level"].iloc[0]
    lines = [f"| variant, 1 GPU | fast images/s, {n_f} seeds (their range: a {lv_f:.0%} CI) | deterministic images/s, "
             f"{n_d} seeds (range: {lv_d:.0%}) | cost of determinism |", "|---|---|---|---|"]
    cell = lambda r: f"{r['value']:,.0f} ({r['ci_low']:,.0f}–{r['ci_high']:,.0f})"
    for v in ("single", "dp", "dp_mean", "dp_sum", "ddp"):
        f, d = fast.loc[v], det.loc[v]
        lines.append(f"| {v} | {cell(f)} | {cell(d)} | {100 * (d['value'] / f['value'] - 1):+.1f}% |"
                     .replace("+-", "−").replace("| -", "| −"))
    return "\n".join(lines)


@query("fast_gap_last", H200)
def fast_gap_last(ref: Path) -> str:
    gaps, last = _fast_gaps(ref)
    at = gaps.xs(last, level="step")
    return _range(at.min(), at.max(), "{:.2g}")


@query("fast_gap_early", H200)
def fast_gap_early(ref: Path) -> str:
    gaps, _ = _fast_gaps(ref)
    early = gaps[gaps.index.get_level_values("step") < 20]
    variant, _, step = early.idxmax()
    return f"{early.max():.2g} in the loss within its first 20 steps ({variant}, step {step})"


# -- two H200, the curves set ---------------------------------------------------------------------

X2 = "h200x2-curves-torch-2.11.0+cu130"


def _x2_dp_memory(ref: Path) -> pd.DataFrame:
    m = pd.read_csv(ref / X2 / "memory.csv")
    return m[m["variant"].isin(["dp", "dp_mean", "dp_sum"])]


@query("x2_dp_runs", X2)
def x2_dp_runs(ref: Path) -> str:
    return str(_x2_dp_memory(ref)["run_id"].nunique())


@query("x2_dp_dev0_mib", X2)
def x2_dp_dev0_mib(ref: Path) -> str:
    return f"{_x2_dp_memory(ref).query('device == 0')['allocated_mib'].median():,.0f}"


@query("x2_dp_dev1_mib", X2)
def x2_dp_dev1_mib(ref: Path) -> str:
    return f"{_x2_dp_memory(ref).query('device == 1')['allocated_mib'].median():,.0f}"


@query("x2_dp_ratio", X2)
def x2_dp_ratio(ref: Path) -> str:
    m = _x2_dp_memory(ref)
    return f"{m.query('device == 0')['allocated_mib'].median() / m.query('device == 1')['allocated_mib'].median():.2f}"


@query("x2_dp_data_mib", X2)
def x2_dp_data_mib(ref: Path) -> str:
    return f"{_x2_dp_memory(ref).query('device == 0')['data_mib'].median():.0f}"


@query("x2_dp_ratio_without_data", X2)
def x2_dp_ratio_without_data(ref: Path) -> str:
    m = _x2_dp_memory(ref)
    d0 = m.query("device == 0")
    return f"{(d0['allocated_mib'] - d0['data_mib']).median() / m.query('device == 1')['allocated_mib'].median():.2f}"


# -- one H200, the mixed experiment and the launch-bound bf16 cell --------------------------------

MIXED = "h200-mixed-ada7e41-torch-2.11.0+cu130"


@query("mixed_fp32_range", MIXED)
def mixed_fp32_range(ref: Path) -> str:
    s = _summary(ref, MIXED).query("precision == 'fp32'")["images_per_s"]
    return f"{_k(s.min())[:-1]}–{_k(s.max())}"


@query("mixed_bf16_range", MIXED)
def mixed_bf16_range(ref: Path) -> str:
    s = _summary(ref, MIXED).query("precision == 'bf16'")["images_per_s"]
    return f"{_k(s.min())[:-1]}–{_k(s.max())}"


BF16_EAGER = "channels_last=True,global_batch=512,precision=bf16"


def _bf16_eager(ref: Path) -> dict[str, list[float]]:
    """single bf16 + channels_last, batch 512, eager, one GPU: images/s per reference that ran it."""
    out = {}
    for path in sorted(glob.glob(str(ref / "h200-*" / "summary.csv"))):
        name = Path(path).parent.name
        s = _summary(ref, name)
        s = s[(s["variant"] == "single") & (s["gpus"] == 1) & (s["options"] == BF16_EAGER)]
        if len(s):
            out[name] = sorted(s["images_per_s"].tolist())
    return out


@query("bf16_eager_range")
def bf16_eager_range(ref: Path) -> str:
    runs = _bf16_eager(ref)
    values = [v for vs in runs.values() for v in vs]
    return f"{_k(min(values))[:-1]}–{_k(max(values))} images/s over {len(values)} runs in {len(runs)} launches"


# -- one H200, the sharding bench -----------------------------------------------------------------

SHARDING = "h200-sharding-f611959"


def _bench(ref: Path) -> list[dict]:
    return [r for r in json.loads((ref / SHARDING / "sharding_bench.json").read_text()) if r["status"] == "ok"]


def _record(ref: Path, cell: str, variant: str) -> dict:
    return json.loads((ref / SHARDING / "records" / f"{cell}-{variant}" / "metrics.json").read_text())


def _precision(ref: Path, cell: str, variant: str) -> str:
    return str(_record(ref, cell, variant).get("config", {}).get("precision", "fp32"))


def _state_excess(ref: Path) -> list[tuple[str, float, float]]:
    """(run, measured - predicted state MiB, relative) per record (one device each)."""
    out = []
    for path in sorted((ref / SHARDING / "records").glob("*/metrics.json")):
        for row in memory_component_rows(json.loads(path.read_text())):
            m, p = row.get("state_mib"), row.get("predicted_state_mib")
            if memory_model.is_number(m) and memory_model.is_number(p) and p:
                out.append((path.parent.name, m - p, m / p - 1))
    return out


@query("sharding_state_excess_mib", SHARDING)
def sharding_state_excess_mib(ref: Path) -> str:
    x = [d for _, d, _ in _state_excess(ref)]
    return f"{min(x):.1f}–{max(x):.1f} MiB"


@query("sharding_state_excess_large", SHARDING)
def sharding_state_excess_large(ref: Path) -> str:
    x = [r for run, _, r in _state_excess(ref) if run.startswith("lm-125m")]
    return f"{100 * min(x):.1f}–{100 * max(x):.1f}%"


@query("sharding_state_excess_small", SHARDING)
def sharding_state_excess_small(ref: Path) -> str:
    x = [r for run, _, r in _state_excess(ref) if not run.startswith("lm-125m")]
    return f"{100 * min(x):.0f}–{100 * max(x):.0f}%"


@query("sharding_activation_share", SHARDING)
def sharding_activation_share(ref: Path) -> str:
    x = [r["activation_peak_mib"] / max(r["forward_peak_mib"], r["backward_peak_mib"]) for r in _bench(ref)]
    return f"{100 * min(x):.0f}–{100 * max(x):.0f}%"


CELL_NAMES = {"resnet18": "ResNet18, batch 256", "lm-12m": "transformer 12M, batch 16",
              "lm-125m": "transformer 110M, batch 16"}
COLUMNS = [("ddp", "ddp"), ("zero1", "zero1"), ("fsdp", "fsdp"), ("fsdp-keep", "fsdp, no resharding"),
           ("fsdp-bf16", "fsdp bf16")]


@query("sharding_own_cost_table", SHARDING)
def sharding_own_cost_table(ref: Path) -> str:
    """Each variant's samples/s over `single`'s of the same cell and the same precision; where
    no such single ran, the variant's own rate and why no ratio."""
    rows = _bench(ref)
    by = {(r["cell"], r["variant"]): r for r in rows}
    lines = ["| workload | " + " | ".join(title for _, title in COLUMNS) + " |",
             "|---|" + "--:|" * len(COLUMNS)]
    for cell, title in CELL_NAMES.items():
        single = by.get((cell, "single"))
        if single:
            rate = _k(single["samples_per_s"]) + " images" if cell == "resnet18" else f"{single['samples_per_s']:,.0f} seq"
            title += f" (single {rate}/s)"
        cells = []
        for variant, _ in COLUMNS:
            r = by.get((cell, variant))
            if r is None:
                cells.append("not run")
                continue
            mine = _precision(ref, cell, variant)
            same = [s for (c, v), s in by.items() if c == cell and v == "single" and _precision(ref, c, v) == mine]
            if same:
                cells.append(f"{r['samples_per_s'] / same[0]['samples_per_s']:.2f}")
            else:
                unit = "images/s" if cell == "resnet18" else "seq/s"
                cells.append(f"{r['samples_per_s']:,.0f} {unit} (no {mine} single: no ratio)")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- harness parity (issue 35) -------------------------------------------------------------------

PARITY = "h200-parity-37110a0"


def _parity(ref: Path) -> list[dict]:
    """The bench's rows with both loops measured, each's regime by today's rule."""
    rows = json.loads((ref / PARITY / "parity.json").read_text())["summary"]
    return [dict(r, bound=step_bound(r["host_ms"], r["dpbench_ms"])) for r in rows if r["ratio"] is not None]


@query("parity_table", PARITY)
def parity_table(ref: Path) -> str:
    """Per cell and variant: bare and dpbench step ms, the throughput ratio with its range over the
    repeat pairs, and the step's regime."""
    measured = {(r["cell"], r["variant"]): r for r in _parity(ref)}
    lines = ["| cell | variant | bare ms | dpbench ms | dpbench / bare | range | host issue / step | bound |",
             "|---|---|--:|--:|--:|---|--:|---|"]
    for r in json.loads((ref / PARITY / "parity.json").read_text())["summary"]:
        if (m := measured.get((r["cell"], r["variant"]))) is None:
            lines.append(f"| {r['cell']} | {r['variant']} | | | | | | failed in both loops (FSDP2 refuses channels_last weights) |")
            continue
        lines.append(f"| {m['cell']} | {m['variant']} | {m['bare_ms']:.2f} | {m['dpbench_ms']:.2f} | {m['ratio']:.3f} | "
                     f"{m['ratio_low']:.3f}–{m['ratio_high']:.3f} | {m['host_ms'] / m['dpbench_ms']:.2f} | {m['bound']} |")
    return "\n".join(lines)


@query("parity_device_bound", PARITY)
def parity_device_bound(ref: Path) -> str:
    """The range of dpbench / bare over the device-bound cells."""
    rows = [r for r in _parity(ref) if r["bound"] == "device"]
    return f"{_range(min(r['ratio_low'] for r in rows), max(r['ratio_high'] for r in rows), '{:.3f}')} in {len(rows)} cells"


@query("parity_host_bound", PARITY)
def parity_host_bound(ref: Path) -> str:
    """The range of dpbench / bare over the repeat pairs of the host-bound cells."""
    rows = [r for r in _parity(ref) if r["bound"] == "host"]
    return f"{_range(min(r['ratio_low'] for r in rows), max(r['ratio_high'] for r in rows), '{:.2f}')} over {len(rows)} cells"


def _activation_peak(ref: Path, cell: str, variant: str) -> float:
    rows = memory_component_rows(_record(ref, cell, variant))
    return float(rows[0]["activation_peak_mib"])


@query("one_rank_fsdp_activations", SHARDING)
def one_rank_fsdp_activations(ref: Path) -> str:
    """One rank's activation peak under fsdp against single's, at 12M and 110M."""
    parts = [f"{_activation_peak(ref, cell, 'fsdp'):.1f} vs {_activation_peak(ref, cell, 'single'):.1f} MiB at {size}"
             for cell, size in (("lm-12m", "12M"), ("lm-125m", "110M"))]
    return ", ".join(parts)


# -- rehearsed ranks on one H200 (issue 38): dpbench.claims.c9.docs (the combined references) ------


# -- committed comparisons ------------------------------------------------------------------------

def _change_range(ref: Path, report: str) -> str:
    d = json.loads((ref / "compare" / f"{report}.json").read_text())
    ch = [r["change"] for r in d["throughput"]]
    sign = lambda x: f"{100 * x:+.1f}%".replace("-", "−")
    return f"{sign(min(ch))} to {sign(max(ch))}"


@query("aa_change_range", "compare")
def aa_change_range(ref: Path) -> str:
    return _change_range(ref, "h200-torch-2.11.0+cu130_vs_h200-aa2-torch-2.11.0+cu130")


@query("re_housed_change_range", "compare")
def re_housed_change_range(ref: Path) -> str:
    return _change_range(ref, "h200-92a6737-torch-2.11.0+cu130_vs_h200-1178c54-torch-2.11.0+cu130")


# -- wall-clock times, from the Snakemake log the set keeps ----------------------------------------

def _pipeline_wall_s(ref: Path, name: str) -> int:
    """The seconds session.sh logged for the set's Snakemake call ("pipeline wall time: N s")."""
    with tarfile.open(ref / name / "logs.tar.gz") as tar:
        for member in tar.getmembers():
            if member.name.endswith("snakemake.log"):
                text = tar.extractfile(member).read().decode(errors="replace")
                found = re.findall(r"pipeline wall time: (\d+) s", text)
                if found:
                    return sum(map(int, found))
    raise LookupError(f"{name}: no pipeline wall time in logs.tar.gz")


RE_HOUSED = "h200-1178c54-torch-2.11.0+cu130"


@query("wall_re_housed", RE_HOUSED)
def wall_re_housed(ref: Path) -> str:
    s = _pipeline_wall_s(ref, RE_HOUSED)
    return f"{s // 60} min {s % 60:02d} s"


def value(name: str, ref: Path) -> str:
    return QUERIES[name].fn(ref)


__all__ = ["QUERIES", "Query", "query", "value"]
