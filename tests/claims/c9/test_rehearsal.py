"""A rehearsal case that did not run to its end is a record that still names its model, so that
the tables drawn from a launch whose ranks lost step are drawn (seen on one H200 at N = 8: the
cases after the first were written without a size, and the tables' reader stopped on them)."""
from __future__ import annotations

import json
import socket

from dpbench.analysis.memory_model import CONTEXT_BYTES
from dpbench.claims.c9 import rehearsal, rehearsed
from dpbench.claims.c9.rehearsal import device_full, failed_case, measured_context_bytes

CASE = {"name": "42m-ddp", "variant": "ddp", "options": {}, "args": {"width": 512, "layers": 8, "heads": 8},
        "batch": 4, "budgets": {"16GB": 14.0}}


def test_a_case_never_reached_names_its_model_and_why():
    rec = failed_case(CASE, 8, "not run: the ranks lost step in case 235m-ddp (RuntimeError)")
    assert (rec["run_id"], rec["status"], rec["size"], rec["gpus"]) == ("42m-ddp-g8", "failed", "512x8", 8)
    assert rec["parameters"] > 40_000_000
    rows = rehearsed.c9_rows([rec], {"16GB": 14.0})
    assert [(r["variant"], r["gpus"], r["budget"], r["largest_batch"]) for r in rows] == [("ddp", 8, "16GB", None)]


def test_a_budget_not_even_batch_1_fits_names_its_peak_in_whole_mib():
    rec = failed_case(CASE, 2, "") | {"status": "ok", "reason": None,
                                      "search": {"16GB": {"largest": 0, "trials": [[1, False, 37891.05224609375]]}}}
    (row,) = rehearsed.c9_rows([rec], {"16GB": 14.0})
    assert row["largest_batch"] is None and "37,891 MiB" in row["reason"] and "37891.05" not in row["reason"]


def test_older_records_without_a_size_are_left_out_of_the_rows():
    old = {"run_id": "12m-ddp-g8", "case": "12m-ddp", "variant": "ddp", "gpus": 8, "status": "failed",
           "reason": "not run: the ranks lost step"}
    assert rehearsed.c9_rows([old, failed_case(CASE, 8, "x")], {"16GB": 14.0})[0]["gpus"] == 8
    assert len(rehearsed.c9_rows([old], {"16GB": 14.0})) == 0


def test_the_device_guard_uses_the_context_the_ranks_measured():
    """Eight 12M ranks on one H200 held 812 MiB each beyond their reserved memory, not the 0.5
    GiB assumed: a trial whose reserved memory fits with the assumed context but not with the
    measured one is not run."""
    rows = [{"nvml_process_mib": 3286.0, "reserved_peak_mib": 2474.0}] * 7 + [{"nvml_process_mib": 3292.0,
                                                                              "reserved_peak_mib": 2474.0}]
    context = measured_context_bytes(rows)
    assert context == 818 * 2 ** 20
    total = 143_771 * 2 ** 20   # the H200's memory as the driver gives it
    assert not device_full(16_400, 8, CONTEXT_BYTES, total)
    assert device_full(16_400, 8, context, total)
    assert measured_context_bytes([{"nvml_process_mib": None, "reserved_peak_mib": 10.0}]) == CONTEXT_BYTES
    assert measured_context_bytes([{"nvml_process_mib": 100.0, "reserved_peak_mib": 90.0}]) == CONTEXT_BYTES


def test_cases_past_the_launchs_time_budget_are_rows_with_their_reason(tmp_path, monkeypatch):
    """One gloo rank, a deadline already past: no case runs, and each is a skipped record that
    names its model and why (the launch used to leave them out)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, val in {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(port), "DPBENCH_REHEARSAL_DEADLINE": "0"}.items():
        monkeypatch.setenv(key, val)
    plan, out = tmp_path / "plan.json", tmp_path / "cases.jsonl"
    plan.write_text(json.dumps([CASE, {**CASE, "name": "42m-fsdp", "variant": "fsdp"}]))
    assert rehearsal.main(["--plan", str(plan), "--out", str(out)]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["run_id"], r["status"], r["size"]) for r in recs] == [("42m-ddp-g1", "skipped", "512x8"),
                                                                     ("42m-fsdp-g1", "skipped", "512x8")]
    assert all("time budget" in r["reason"] for r in recs)


def searched_row(variant: str, gpus: int, largest: int | None, reason: str = "", budget: str = "16GB") -> dict:
    return {"workload": "transformer-lm-2048x20", "parameters": 1_080_000_000, "variant": variant, "gpus": gpus,
            "reshard_after_forward": variant == "fsdp", "precision": "fp32", "largest_batch": largest,
            "samples_per_s_at_largest": None, "cap_gib": 14.0, "reason": reason, "budget": budget,
            "rehearsed": True, "predicted_largest_batch": 0, "smallest_failing": None}


NOT_EVEN = "not even batch 1 fits (peak 20,575 MiB at batch 1)"
NO_ROOM = "8 rehearsed ranks do not fit one GPU: 8 x (1.15 x 14 GiB budget + 0.5 GiB context) = 132.8 GiB"


def test_a_budget_one_gpu_could_not_search_leaves_what_a_larger_gpu_found():
    """An H100's not_fitting entry for 16GB at N = 8 must not erase an H200's search there,
    the one that found no batch included."""
    rows = [searched_row("zero1", 8, None, NOT_EVEN), searched_row("fsdp", 8, 9), searched_row("hsdp", 8, None,
                                                                                                "not searched")]
    marked = rehearsed.mark_not_fitting(rows, [{"ranks": 8, "budget": "16GB", "reason": NO_ROOM}])
    assert [r["reason"] for r in marked] == [NOT_EVEN, "", NO_ROOM]


def test_ddp_where_its_ranks_do_not_fit_is_zero_only_when_one_rank_held_not_even_batch_1():
    rows = [searched_row("ddp", 1, None, NOT_EVEN), searched_row("fsdp", 8, 9), searched_row("fsdp", 4, 7),
            searched_row("ddp", 4, 3),                                             # measured at N = 4: kept
            searched_row("ddp", 1, 4, budget="24GB"), searched_row("fsdp", 2, 8, budget="24GB")]
    out = rehearsed.ddp_from_one_rank(rows)
    ddp = {(r["gpus"], r["budget"]): r for r in out if r["variant"] == "ddp"}
    assert set(ddp) == {(1, "16GB"), (4, "16GB"), (8, "16GB"), (1, "24GB")}   # a batch that fits is not carried
    assert ddp[(8, "16GB")]["largest_batch"] is None and ddp[(8, "16GB")][rehearsed.DDP_FROM_ONE_RANK]
    assert ddp[(8, "16GB")]["smallest_failing"] == 1 and ddp[(4, "16GB")]["largest_batch"] == 3
    from dpbench.claims.c9 import verdict
    (x,) = [c for c in verdict.crossovers(out) if c.gpus == 8]
    assert (x.sharded, x.baseline, x.first_exceeds) == ([9.0], [0.0], 1_080_000_000)
    # nothing is carried where no sharded variant's search ran at that N and budget
    unsearched = rehearsed.ddp_from_one_rank([searched_row("ddp", 1, None, NOT_EVEN), searched_row("fsdp", 8, None,
                                                                                                    NO_ROOM)])
    assert [r["gpus"] for r in unsearched if r["variant"] == "ddp"] == [1]
    cut = searched_row("fsdp", 8, None, "search cut short by the launch's time budget")
    assert [r["gpus"] for r in rehearsed.ddp_from_one_rank([rows[0], cut]) if r["variant"] == "ddp"] == [1]
    # a DDP row at N whose ranks did not fit is replaced, not doubled
    out = rehearsed.ddp_from_one_rank(rows + [searched_row("ddp", 8, None, NO_ROOM)])
    assert len([r for r in out if r["variant"] == "ddp" and r["gpus"] == 8]) == 1


def sized_row(size: str, params: int, variant: str, largest: int | None, reason: str = "") -> dict:
    return {**searched_row(variant, 8, largest, reason), "workload": f"transformer-lm-{size}", "parameters": params}


def components_record(size: str, params: int, variant: str, mib: float) -> dict:
    """A record of the variant at this size whose rank held mib of parameters and of gradients."""
    return {"variant": variant, "size": size, "parameters": params, "gpus": 2,
            "memory_components": [{"parameters_mib": mib, "gradients_mib": mib}]}


SIZES = (("256x4", 11_700_000), ("1024x16", 236_000_000), ("2048x20", 1_080_000_000), ("2560x24", 1_970_000_000))


def test_a_size_a_crossover_lacks_is_open_below_it_or_closed_by_the_state_no_variant_divides():
    """Seen at 16GB, N = 8: zero1's crossover is 'none' through 236M while its 1.08B and 1.97B
    searches never ran to their end; fsdp crosses at the smallest size, so what it lacks above
    cannot move it."""
    from dpbench.claims.c9 import verdict
    rows = [sized_row("256x4", 11_700_000, "ddp", 59), sized_row("256x4", 11_700_000, "zero1", 59),
            sized_row("256x4", 11_700_000, "fsdp", 63), sized_row("1024x16", 236_000_000, "ddp", 16),
            sized_row("1024x16", 236_000_000, "zero1", 16), sized_row("2048x20", 1_080_000_000, "ddp", None, NOT_EVEN),
            sized_row("2048x20", 1_080_000_000, "zero1", None, "the launch stopped before the case wrote its record")]
    records = [components_record(size, params, v, mib) for size, params in SIZES for v, mib in
               (("zero1", params * 4 / 2 ** 20), ("fsdp", params * 4 / 2 ** 20 / 8))]
    cells = rehearsed.open_cells(verdict.crossovers(rows), records)
    assert {(c["label"], c["size"]) for c in cells} == {("zero1", "2048x20"), ("zero1", "2560x24")}
    by_size = {c["size"]: c for c in cells}
    assert by_size["2048x20"]["floor_mib"] is None                      # 8,240 MiB: a batch may fit 14 GiB
    assert by_size["2560x24"]["floor_mib"] == 2 * 1_970_000_000 * 4 / 2 ** 20   # 15,030 MiB: none can
    # within a budget that holds it, the largest size is open too
    wide = [{**r, "cap_gib": 22.0, "budget": "24GB"} for r in rows]
    assert all(c["floor_mib"] is None for c in rehearsed.open_cells(verdict.crossovers(wide), records))
    # fsdp divides its parameters and gradients: no floor from them
    assert rehearsed.undivided_floor_mib(records, "fsdp", "2560x24") is None
    assert rehearsed.undivided_floor_mib(records, "ddp", "2560x24") is None   # no record of it


def torchrun_entry(i: int, time: str, rank: int, code: int, signal: str) -> str:
    """One entry of torchrun's failure report, as it prints them."""
    return (f"[{i}]:\n  time      : 2026-12-06_{time}\n  host      : localhost\n  rank      : {rank} (local_rank: "
            f"{rank})\n  exitcode  : {code} (pid: {580 + rank})\n  error_file: <N/A>\n  traceback : Signal {-code} "
            f"({signal}) received by PID {580 + rank}\n")


# seen on one H200 (h200-rehearsal-72e1378/n8-1b-zero1.tar.gz), ranks 3 to 6 left out
TORCHRUN_REPORT = ("dpbench.claims.c9.rehearsal FAILED\nFailures:\n" + torchrun_entry(1, "10:09:35", 0, -15, "SIGTERM")
                   + torchrun_entry(2, "10:09:24", 7, -9, "SIGKILL") + "Root Cause (first observed failure):\n"
                   + torchrun_entry(0, "10:09:24", 2, -9, "SIGKILL"))


def test_a_case_whose_launch_was_killed_is_a_failed_record_naming_the_ranks_that_failed_first():
    """Seen on one H200 (1.08B zero1 at N = 8): two ranks were killed by signal 9, torchrun
    stopped the rest, rank 0 wrote no record, and the launch used to leave the case out."""
    ok = failed_case(CASE, 8, "") | {"status": "ok", "reason": None}
    other = {**CASE, "name": "42m-zero1", "variant": "zero1"}
    (rec,) = rehearsal.missing_records([CASE, other], 8, [ok], 1, TORCHRUN_REPORT)
    assert (rec["case"], rec["status"], rec["gpus"], rec["size"]) == ("42m-zero1", "failed", 8, "512x8")
    assert "ranks 2, 7: exit code -9, Signal 9 (SIGKILL)" in rec["reason"] and "exit 1" in rec["reason"]
    assert "rank 0" not in rec["reason"]
    (silent,) = rehearsal.missing_records([CASE], 8, [], 1, "no report")
    assert "no rank reported a failure" in silent["reason"]
    assert rehearsal.missing_records([CASE], 8, [ok], 0, "") == []
