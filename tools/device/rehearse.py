"""Rehearsed ranks on one GPU (issue 38): the memory of ddp, zero1, fsdp (with and without
resharding) and hsdp per rank at N = 1, 2, 4, 8 against the memory model, their collectives
against the traffic model, and C9's largest per-rank batch within two budgets naming real
devices, with the crossover along the model size. tools/device/rehearse.sh runs it in two parts
(one device call each); --combine draws the tables, figures and C9's text from both parts'
tars on any machine (torch-free).

    python tools/device/rehearse.py --part 1 --out $OUT          # N = 1, 2, 4 (+ one dpbench launch)
    python tools/device/rehearse.py --part 2 --out $OUT          # N = 8
    python tools/device/rehearse.py --ranks 4 8 --out $OUT       # only these N, no launcher run
    python tools/device/rehearse.py --ranks 1 2 --variants fsdp fsdp-keep --out $OUT   # only these cases
    python tools/device/rehearse.py --combine A.tar.gz B.tar.gz --out DIR   # oldest first: B wins
    python tools/device/rehearse.py --part 1 --tiny --out /tmp/r  # the CPU check: tiny models, gloo
    python tools/device/rehearse.py --ranks 1 2 4 8 --sizes 2b --variants fsdp --fake --out /tmp/f   # any size, no GPU

Each N is one torchrun of dpbench.claims.c9.rehearsal (every case in one launch: start-up is
paid once per N); each case is a warm step, one profiled step and, on CUDA, the budgets'
searches. Budgets whose N x (SAFE x budget + context) do not fit the GPU are rows that say so.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

# name -> (width, layers), per-rank batch of the profiled step: ~12M, ~42M, ~235M parameters
# (seq_len 512, vocab 32768, tied; the C9 probe's family)
SIZES = {"12m": ((256, 4), 8), "42m": ((512, 8), 4), "235m": ((1024, 16), 2)}
# beyond the two calls' time (FSDP2 over gloo ~16 ms a step per M parameters): --sizes 1b 2b
MORE = {"1b": ((2048, 20), 1), "2b": ((2560, 24), 1),
        # 1.08B's units (width 2048) on 4 blocks: its gathers and reduce-scatters at N = 4 on the CPU tracker
        "wide4": ((2048, 4), 1)}
TINY = {"tiny": ((32, 2), 2)}
PARTS = {"1": (1, 2, 4), "2": (8,)}
HSDP_SHARD = 2
# past the budget: the case under way, its collectives' timeout (env below) included; a search
# starts no trial after rehearsal.TRIAL_GRACE_S of it, so its case is written within it
LAUNCH_GRACE_S = 150
# what each rank runs: name, variant, options, fewest ranks where it differs from another case
VARIANTS = (("ddp", "ddp", {}, 1), ("zero1", "zero1", {}, 1), ("fsdp", "fsdp", {}, 1),
            ("fsdp-keep", "fsdp", {"reshard_after_forward": False}, 2),
            ("hsdp", "hsdp", {"hsdp_shard_size": HSDP_SHARD}, 4))


def budgets_for(ranks: int, device_gib: float | None) -> tuple[dict[str, float], dict[str, str]]:
    """The budgets searched at this N, and why each other one is not (the sum against the GPU)."""
    from dpbench.analysis.memory_model import CONTEXT_BYTES
    from dpbench.claims.c9.predicted import BUDGETS
    from dpbench.claims.c9.rehearsal import SAFE
    if device_gib is None:
        return {}, {}
    ok, why = {}, {}
    for name, (gib, _) in BUDGETS.items():
        need = ranks * (SAFE * gib + CONTEXT_BYTES / 2**30)
        if need <= device_gib:
            ok[name] = gib
        else:
            why[name] = (f"{ranks} rehearsed ranks do not fit one GPU: {ranks} x ({SAFE:g} x {gib:g} GiB budget + "
                         f"{CONTEXT_BYTES / 2**30:g} GiB context) = {need:.1f} GiB > the device's {device_gib:.1f} GiB")
    return ok, why


def plan(sizes: dict, ranks: int, budgets: dict[str, float], seq_len: int | None = None,
         only: tuple[str, ...] | None = None) -> list[dict]:
    """Every (size, variant) case at this N; `only`: these VARIANTS names."""
    cases = []
    for size, ((width, layers), batch) in sizes.items():
        args = {"width": width, "layers": layers, "heads": max(2, width // 64)}
        if seq_len:
            args.update(seq_len=seq_len, vocab=64)
        for name, variant, options, fewest in VARIANTS:
            if ranks < fewest or (variant == "hsdp" and ranks % HSDP_SHARD) or (only and name not in only):
                continue
            cases.append({"name": f"{size}-{name}", "variant": variant, "options": options, "args": args,
                          "batch": batch, "budgets": budgets})
    return cases


def device_gib() -> float | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout.split()
        return int(out[0]) / 1024 if out else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def run_part(part: str, out: Path, tiny: bool, budget_s: float, sizes: dict | None = None,
             ranks_list: tuple[int, ...] | None = None, only: tuple[str, ...] | None = None,
             fake: bool = False) -> list[dict]:
    """The part's launches (or only `ranks_list`'s: a part whose N were not reached, again);
    the records, and not_fitting.json under `out` (the work folder). `fake`: each N is one
    process standing for rank 0 on fake tensors (dpbench.claims.c9.fake), no budget searched."""
    started = time.time()
    gib = None if fake else device_gib()
    records, not_fitting = [], []
    work = out / "runs"
    work.mkdir(parents=True, exist_ok=True)
    from dpbench.claims.c9.rehearsal import DEADLINE_ENV, TIMEOUT_ENV, missing_records
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           DEADLINE_ENV: str(started + budget_s), TIMEOUT_ENV: os.environ.get(TIMEOUT_ENV, "120")}
    if part == "1" and not ranks_list and not fake:   # the run option through dpbench's own launcher first: one rehearsed fsdp run on 2 ranks
        records.append(launched_run(work, tiny, env))
    for ranks in ranks_list or PARTS[part]:
        if tiny and ranks > 2:
            continue
        if time.time() > started + budget_s:
            print(f"N={ranks}: not started (time budget spent)", flush=True)
            continue
        budgets, why = budgets_for(ranks, gib)
        cases = plan(TINY if tiny else (sizes or SIZES), ranks, budgets, seq_len=16 if tiny else None, only=only)
        not_fitting += [{"ranks": ranks, "budget": b, "reason": w, "cases": [c["name"] for c in cases]}
                        for b, w in why.items()]
        if gib is not None:   # whether N ranks fit the GPU: the allocator's replay of each sharded case too
            from dpbench.claims.c9.alloc_trace import replayed_reserved_mib
            replayed = replayed_reserved_mib(cases, ranks, work)
            cases = [{**c, "replayed_reserved_mib": replayed[c["name"]]} if c["name"] in replayed else c
                     for c in cases]
        plan_file, lines = work / f"plan-{ranks}.json", work / f"cases-{ranks}.jsonl"
        plan_file.write_text(json.dumps(cases))
        lines.unlink(missing_ok=True)
        t = time.time()
        cmd = ([sys.executable, "-m", "dpbench.claims.c9.fake", "--ranks", str(ranks)] if fake else
               [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                "-m", "dpbench.claims.c9.rehearsal"]) + ["--plan", str(plan_file), "--out", str(lines)]
        # bounded: the budget, plus one case's worst (a collective's timeout), then the whole
        # process group goes (a rank left alive holds its GPU memory for whatever runs next)
        limit = max(60.0, started + budget_s + LAUNCH_GRACE_S - time.time())
        # every rank's output, whole, in the work folder (it travels back in the tar): a failed
        # launch is diagnosed from the first rank that failed, not from the launcher's last lines
        log_path = work / f"launch-{ranks}.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)
            try:
                proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                log.write(f"\nN={ranks}: killed after {limit:.0f} s (the budget and a collective's timeout spent)\n")
        print(f"N={ranks}: {len(cases)} cases, exit {proc.returncode}, {time.time() - t:.0f} s (log: {log_path})",
              flush=True)
        log_text = log_path.read_text(errors="replace")
        if proc.returncode:
            print(log_text[-3000:], flush=True)
        wrote = [json.loads(x) for x in lines.read_text().splitlines() if x.strip()] if lines.exists() else []
        records += wrote + missing_records(cases, ranks, wrote, proc.returncode, log_text)
    (out / "not_fitting.json").write_text(json.dumps(not_fitting, indent=1))
    print(f"part {part}: {time.time() - started:.0f} s", flush=True)
    return records


def launched_run(work: Path, tiny: bool, env: dict) -> dict:
    """fsdp on 2 rehearsed ranks through python -m dpbench.run.launch (the record a pipeline
    run writes, marked rehearsed), beside the harness's own fsdp case at the same batch."""
    size, ((width, layers), batch) = next(iter((TINY if tiny else {"235m": SIZES["235m"]}).items()))
    args = {"width": width, "layers": layers, "heads": max(2, width // 64), **({"seq_len": 16, "vocab": 64} if tiny else {})}
    cfg = {"variant": "fsdp", "gpus": 2, "rehearse": True, "workload": {"name": "transformer-lm", "args": args},
           "per_gpu_batch": batch, "global_batch": 2 * batch, "dataset": "synthetic", "synthetic_size": 8 * batch,
           "max_steps": 3, "warmup_steps": 2, "eval_each_epoch": False, "lr_schedule": "constant"}
    rdir = work / "launched-fsdp-g2"
    subprocess.run([sys.executable, "-m", "dpbench.run.launch", "--config", json.dumps(cfg), "--out", str(rdir)],
                   env=env, capture_output=True, text=True)
    try:
        rec = json.loads((rdir / "metrics.json").read_text())
    except (OSError, ValueError):
        return {"run_id": "launched-fsdp-g2", "variant": "fsdp", "gpus": 2, "status": "failed",
                "reason": "no record", "size": f"{width}x{layers}", "launched": True}
    rec.update(size=f"{width}x{layers}", launched=True, run_id="launched-fsdp-g2")
    return rec


# -- tables, figures and C9's words (torch-free) ----------------------------------------------------

def write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def fmt(v, spec="{:,.1f}") -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "–"
    return spec.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def memory_markdown(table: list[dict]) -> str:
    from dpbench.report.markdown import md_table
    body = [[r["size"], r["variant"], r["gpus"], r["component"], fmt(r["measured_mib"]), fmt(r["predicted_mib"]),
             "–" if r["relative_difference"] is None
             else fmt(100 * r["relative_difference"], "{:+.1f}%") + (" !" if r["beyond_tolerance"] else "")]
            for r in table]
    return md_table(["size", "variant", "N", "component", "measured MiB/rank", "model MiB/rank", "error"], body)


def analyse(records: list[dict], out: Path, not_fitting: list[dict]) -> str:
    from dpbench.analysis import rehearsal
    from dpbench.claims.c9 import text, verdict
    from dpbench.claims.c9.rehearsed import finding, largest_batch_rows
    from dpbench.report.figstyle import save, style
    from dpbench.report.markdown import md_table
    from dpbench.report.sharding_plots import plot_rehearsed_batches, plot_rehearsed_memory
    from dpbench.results import LARGEST_BATCH_COLUMNS

    cases = [r for r in records if not r.get("launched")]
    mem = rehearsal.memory_table(cases)
    traffic = rehearsal.traffic_table(cases)
    rows = largest_batch_rows(cases, not_fitting)
    v = verdict.verdict_from(rows)
    crossings = [dict(c.__dict__) for c in v.crossovers]
    write_csv(out / "memory_per_rank.csv", mem, rehearsal.MEMORY_COLUMNS)
    write_csv(out / "collectives.csv", traffic, rehearsal.TRAFFIC_COLUMNS)
    write_csv(out / "largest_batch.csv", rows, LARGEST_BATCH_COLUMNS)
    # no allocator on the CPU: its ranks' peaks are PyTorch's memory tracker's (run.live_memory)
    on_gpu = any(m.get("reserved_peak_mib") is not None for r in cases for m in r.get("memory_components") or [])
    where = "on one GPU" if on_gpu else "on the CPU (gloo; peaks from PyTorch's memory tracker)"
    with style():
        for size in sorted({r["size"] for r in mem}):
            save(plot_rehearsed_memory(mem, size, failed=rehearsal.not_run_at(cases, size), where=where),
                 out / f"memory_per_rank-{size}.png")
        save(plot_rehearsed_batches(rows, crossings), out / "largest_batch.png")
    f = finding(rows)
    cross_rows = [[c.name, c.gpus, c.budget, fmt(c.cap_gib, "{:g}"), text.params(c.first_exceeds) if c.first_exceeds
                   else "none", text.params(c.predicted_first_exceeds) if c.predicted_first_exceeds else "none",
                   ", ".join(f"{text.params(p)} {s:g}/{b:g}" for p, s, b in zip(c.parameters, c.sharded, c.baseline))]
                  for c in v.crossovers]
    launched = [r for r in records if r.get("launched")]
    parts = ["# Rehearsed ranks on one GPU (issue 38)", "",
             "## Memory per rank (mean over ranks) against the memory model", "", memory_markdown(mem), "",
             "## Collectives counted on rank 0 against the traffic model", "",
             md_table(["size", "variant", "N", "collective", "count", "bytes", "model", "error", "source"],
                      [[t["size"], t["variant"], t["gpus"], t["collective"], t["count"], fmt(t["bytes"], "{:,.0f}"),
                        fmt(t["predicted_bytes"], "{:,.0f}"), fmt(None if t["relative_difference"] is None
                                                                   else 100 * t["relative_difference"], "{:+.1f}%"),
                        t["source"]] for t in traffic]), "",
             "## C9: where each sharded variant's largest batch first exceeds DDP's", "",
             md_table(["variant", "N", "budget", "GiB", "measured", "model", "sharded/ddp per size"], cross_rows), "",
             f"**C9 ({f.verdict})**: {f.summary}", "", *[f"- {e}" for e in f.evidence], "",
             "## Not run", "", *[f"- {n['reason']} ({n['budget']})" for n in not_fitting],
             *[f"- {r['run_id']}: {r['status']}: {r.get('reason')}" + (f" ({r[rehearsal.SOURCE]})" if r.get(rehearsal.SOURCE) else "")
               for r in records if r.get("status") != "ok"], "",
             "## Through dpbench's launcher (run option rehearse)", "",
             *[f"- {r['run_id']}: {r.get('status')} {r.get('reason') or ''}; config rehearse="
               f"{(r.get('config') or {}).get('rehearse')}; memory_components per rank: "
               f"{[round(m.get('parameters_mib') or 0, 1) for m in r.get('memory_components') or []]} MiB of "
               f"parameters" for r in launched], ""]
    md = "\n".join(parts)
    (out / "rehearsal.md").write_text(md)
    return md


def pack(out: Path, records: list[dict], tag: str) -> Path:
    """records (JSON lines) + the tables, figures and launch logs under `out`, as one tar."""
    tar = out / f"rehearsal-{tag}.tar.gz"
    with tarfile.open(tar, "w:gz") as t:
        data = "\n".join(json.dumps(r, default=str) for r in records).encode()
        info = tarfile.TarInfo("records.jsonl")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
        for p in sorted(out.iterdir()):
            if p.is_file() and p.suffix in (".csv", ".md", ".png", ".json"):
                t.add(p, arcname=p.name)
        for p in sorted((out / "runs").glob("launch-*.log")):   # the ranks' own output
            t.add(p, arcname=p.name)
    return tar


def unpack(tars: list[Path]) -> tuple[list[dict], list[dict]]:
    """The launches' tars, oldest first, as one set (analysis.rehearsal.combine: the newest
    launch's record of a case wins) and their budgets that did not fit."""
    from dpbench.analysis.rehearsal import combine, combine_not_fitting, read_launch
    parts = [(str(path), *read_launch(path)) for path in tars]
    return combine([(name, recs) for name, recs, _ in parts]), combine_not_fitting(nf for _, _, nf in parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=sorted(PARTS))
    ap.add_argument("--combine", nargs="+", type=Path,
                    help="the launches' tars, oldest first (a later tar's record of a case wins)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/rehearse")))
    ap.add_argument("--tiny", action="store_true", help="tiny models on at most 2 ranks (the CPU check)")
    ap.add_argument("--budget-s", type=float, default=420, help="start no case after this many seconds")
    ap.add_argument("--sizes", nargs="+", choices=[*SIZES, *MORE], help="model sizes (default: 12m 42m 235m)")
    ap.add_argument("--ranks", nargs="+", type=int, choices=[n for p in PARTS.values() for n in p],
                    help="only these N (no launcher run): the N a part did not reach, in a call of their own")
    ap.add_argument("--variants", nargs="+", choices=[v[0] for v in VARIANTS], help="only these cases' variants")
    ap.add_argument("--work", type=Path, default=Path("/tmp/rehearse-work"), help="runs, tables and figures")
    ap.add_argument("--fake", action="store_true",
                    help="on fake tensors, one process per N as its rank 0: memory by phase and kind, no budget")
    args = ap.parse_args(argv)
    if not (args.part or args.ranks) and not args.combine:
        ap.error("give --part, --ranks or --combine")
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work / (args.part or ("n" + "-".join(map(str, args.ranks)) if args.ranks else "combined"))
    work.mkdir(parents=True, exist_ok=True)
    if args.combine:
        records, not_fitting = unpack(args.combine)
        tag = "combined"
        (work / "not_fitting.json").write_text(json.dumps(not_fitting, indent=1))
    else:
        sizes = {k: {**SIZES, **MORE}[k] for k in args.sizes} if args.sizes else None
        ranks = tuple(args.ranks) if args.ranks else None
        records = run_part(args.part or "1", work, args.tiny, args.budget_s, sizes, ranks,
                           tuple(args.variants) if args.variants else None, fake=args.fake)
        not_fitting = json.loads((work / "not_fitting.json").read_text())
        tag = f"part{args.part}" if not ranks else "n" + "-".join(map(str, ranks))
    md = analyse(records, work, not_fitting)
    tar = pack(work, records, tag)
    # $OUT: at most 8 files: the tar (records, tables, figures), the text, the two kinds of figure
    keep = [tar, work / "rehearsal.md", work / "largest_batch.png", *sorted(work.glob("memory_per_rank-*.png"))[-2:]]
    for p in keep:
        if p.exists():
            (args.out / p.name).write_bytes(p.read_bytes())
    print(f"wrote {', '.join(p.name for p in keep if p.exists())} to {args.out}")
    print(md.split("## Collectives")[0] + md[md.index("## C9"):md.index("## Not run")])   # the table, last
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
