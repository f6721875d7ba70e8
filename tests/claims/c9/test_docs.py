"""docs/sharding.md's rehearsed ranks (issue 38), from the committed references: the combined
launches give every N measured (11.7M, 42.3M and 236M at 1, 2, 4, 8; 1.08B and 1.97B where they
ran), the page holds those tables as rendered, the failed cases are rows with reasons, and the page's
figures exist where it links them."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dpbench.analysis import memory_model as M
from dpbench.analysis import rehearsal
from dpbench.claims.c9 import docs

REPO = Path(__file__).resolve().parents[3]
REF = REPO / "results" / "reference"
PAGE = REPO / "docs" / "sharding.md"


def n_column(table: str) -> set[int]:
    rows = [line.split("|") for line in table.splitlines()[2:]]
    return {int(cells[2]) for cells in rows}


def test_the_page_holds_every_n_the_references_measured_per_size():
    """Per model size, the table's N are those at which some launch's record ran (read from the
    launches' tars here, not through the page's combination)."""
    measured: dict[str, set[int]] = {}
    for reference, tar in docs.LAUNCHES:
        records, _ = rehearsal.read_launch(REF / reference / tar)
        for r in records:
            if r.get("status") == "ok" and r.get("size"):
                measured.setdefault(r["size"], set()).add(r["gpus"])
    assert measured["256x4"] == {1, 2, 4, 8}   # the smallest model ran at every N rehearsed on the H200
    page = PAGE.read_text()
    for size, ns in measured.items():
        table = docs.memory_table(REF, size)
        assert n_column(table) == ns, size
        assert table in page


def test_failed_cases_are_rows_from_the_newest_launch_with_reasons():
    c = docs.combined(REF)
    failed = rehearsal.not_ok_rows(c.records)
    # what no launch could run: four ranks of DDP's and ZeRO-1's whole 2560x24 state on an H100
    assert {(f["size"], f["gpus"], f["variant"]) for f in failed} == {("2560x24", 4, "ddp"), ("2560x24", 4, "zero1")}
    assert all("do not fit one GPU" in f["reason"] and "the device's 79.18 GiB" in f["reason"] for f in failed)
    # cases an earlier launch left not started (its time budget) ran in a later one, whose record wins
    for size, gpus, variant in (("1024x16", 8, "hsdp"), ("2048x20", 1, "zero1"), ("2048x20", 1, "fsdp")):
        (r,) = [r for r in c.records if (r["size"], r["gpus"], rehearsal.variant_label(r)) == (size, gpus, variant)]
        # (1.08B's fsdp at N = 1 ran again alone at ceb1b88, its backward part by part, and at
        # 11dc2db, its cache emptied after sharding, and at ab61c43 with its history: the newest wins)
        assert r["status"] == "ok" and r[rehearsal.SOURCE].split("/")[0] in (
            "h100-rehearsal-1307c9b", "h100-rehearsal-ceb1b88", "h100-rehearsal-11dc2db", "h100-rehearsal-ab61c43")
        assert any(x["status"] != "ok" for launch, recs in c.launches.items() if launch.startswith("h200-")
                   for x in recs if (x.get("size"), x.get("gpus"), x.get("variant")) == (size, gpus, variant))
    # 236M at N = 4: ddp failed in 4036c92's launch of every variant and ran to its end at a7dce61,
    # whose record wins; the sharded variants' records are 4036c92's later launch's
    n4 = {r["variant"]: r[rehearsal.SOURCE] for r in c.records if r["size"] == "1024x16" and r["gpus"] == 4}
    assert n4["ddp"] == "h200-rehearsal-a7dce61/n4-235m-ddp.tar.gz"
    assert {n4[v] for v in ("zero1", "fsdp", "hsdp")} == {"h200-rehearsal-4036c92/n4-235m-sharded.tar.gz"}
    assert any(r["status"] == "failed" and r["variant"] == "ddp"
               for r in c.launches["h200-rehearsal-4036c92/n4-235m.tar.gz"])
    # 1.08B zero1 at N = 4: a later launch's ok record wins over an earlier one's not started
    (zero1,) = [r for r in c.records if r["size"] == "2048x20" and r["gpus"] == 4 and r["variant"] == "zero1"]
    assert (zero1["status"], zero1[rehearsal.SOURCE]) == ("ok", "h200-rehearsal-72e1378/n4-1b-zero1-hist.tar.gz")
    assert any(r["status"] != "ok" for r in c.launches["h200-rehearsal-a7dce61/n4-1b-ddp-zero1.tar.gz"]
               if r["variant"] == "zero1")
    for size in ("256x4", "512x8"):   # every variant ran at N = 8 (42.3M's hsdp in the newest launch)
        ok8 = {rehearsal.variant_label(r) for r in c.records
               if r.get("status") == "ok" and r["gpus"] == 8 and r["size"] == size}
        assert ok8 == {"ddp", "zero1", "fsdp", "fsdp-keep", "hsdp"}, size
    sentences = docs.rehearsal_not_run(REF)
    assert all(s in PAGE.read_text() for s in sentences.splitlines())
    # a case whose search was cut short ran (its memory is in the tables) and is listed once
    cut = sorted((r for r in c.records if any(x.get("cut_short") for x in (r.get("search") or {}).values())),
                 key=lambda r: r["gpus"])
    assert [(r["size"], r["gpus"], r["variant"], r["status"]) for r in cut] == [("2048x20", 4, "fsdp", "ok"),
                                                                                 ("2560x24", 8, "fsdp", "ok")]
    # 1.08B fsdp at N = 2, cut short at a7dce61 and ab61c43, ran to its end with the edge search
    (n2,) = [r for r in c.records if r["size"] == "2048x20" and r["gpus"] == 2 and r["variant"] == "fsdp"
             and rehearsal.variant_label(r) == "fsdp"]
    assert n2[rehearsal.SOURCE] == "h100-rehearsal-cb9adc2/n2-1b-fsdp.tar.gz"
    assert all(not s["cut_short"] and s["smallest_failing"] == s["largest"] + 1 for s in n2["search"].values())
    # N = 4's 16GB search the H200 (72e1378) cut short ran to its end on an H100 (1307c9b): the
    # finished one is kept, named; the sentence names the launch whose search was cut short
    n4 = next(r for r in cut if r["gpus"] == 4)
    assert (n4["search"]["16GB"]["largest"], n4[rehearsal.SEARCH_FROM]) == (7, {"16GB": "h100-rehearsal-1307c9b/n4-1b-fsdp.tar.gz"})
    searched = [(r.get(rehearsal.SEARCH_FROM) or {}).get("24GB", r[rehearsal.SOURCE]) for r in cut]
    assert searched == ["h200-rehearsal-72e1378/n4-1b-fsdp.tar.gz", "h200-rehearsal-72e1378/n8-1b-2b-fsdp.tar.gz"]
    assert all(sum(x in line and "cut short" in line for line in sentences.splitlines()) == 1 for x in searched)


def test_the_crossover_table_has_every_budget_and_n_searched():
    table = docs.rehearsal_crossover_table(REF)
    pairs = {(cells[1].strip(), int(cells[3])) for cells in (line.split("|") for line in table.splitlines()[2:])}
    assert pairs == {("16GB", 2), ("16GB", 4), ("16GB", 8), ("24GB", 2), ("24GB", 4)}


def test_the_pages_figures_exist_where_it_links_them():
    linked = set(re.findall(r"\((figures/rehearsal-[^)]+\.png)\)", PAGE.read_text()))
    assert linked == {p.relative_to(REPO / "docs").as_posix() for p in docs.figure_paths(REPO).values()}
    assert all((REPO / "docs" / p).stat().st_size > 10_000 for p in linked)


def test_the_cpu_tracker_reproduces_the_h200s_peaks_and_says_what_they_hold():
    """The same cases on the CPU, peaks from PyTorch's memory tracker: each phase's peak above the
    step's start within 1% of the H200 allocator's; the smaller models' backward peaks hold no
    gradients (zero_grad freed them), the 236M forward peak at N = 2 an all-gather buffer."""
    parts = [(docs.launch_name(r, t), rehearsal.read_launch(REF / r / t)[0]) for r, t in docs.CPU_TRACKER]
    cpu = {rehearsal.case_key(r): r for r in rehearsal.combine(parts) if r.get("status") == "ok"}
    # the newest GPU record of each case whose backward was measured as the CPU's (from the forward's end)
    h200 = {rehearsal.case_key(r): r for recs in docs.combined(REF).launches.values() for r in recs
            if r.get("status") == "ok" and "zero_grad_end_mib" not in r["memory_components"][0]}
    both = sorted(set(cpu) & set(h200))
    assert len(both) == 15
    for key in both:
        a, b = docs.above_start(h200[key]), docs.above_start(cpu[key])
        assert all(abs(b[p] - a[p]) <= 0.01 * a[p] for p in a), key
    kinds = {k: cpu[k]["memory_components"][0] for k in both}
    small = [m for (size, _, _, _), m in kinds.items() if size in ("256x4", "512x8")]
    assert all(m["backward_peak_mib"] > m["forward_peak_mib"] for m in small)
    assert all(sum(v for k, v in m["backward_peak_by_kind_mib"].items() if "Grad" in k) == 0 for m in small)
    big = kinds[("1024x16", "fsdp", 2, False)]
    assert big["forward_peak_by_kind_mib"]["All Gather"] > 0 and big["forward_peak_mib"] > big["backward_peak_mib"]


def test_at_2048x20_the_model_predicts_the_backward_and_the_forward_as_the_last_block_gathers():
    """The CPU tracker's 2048x20 fsdp cases: the backward's peak at N = 2, predicted from N = 1 with
    the share of gradients written again by then, within 1 MiB. The forward's, in the model's
    forward at both N, comes at N = 2 as the last block gathers: one rank's level at that block's
    start plus the block before it (kept), then two more of it (its all-gather output and its
    parameters copied out), as the model predicts within 1 MiB. The earlier cases missed it: with
    the kept block alone by less than without it."""
    cpu = {int(r["gpus"]): r for r in docs.ok_cases(REF, docs.CPU_BEYOND)}
    assert set(cpu) == {1, 2}
    rows = {row["gpus"]: row for row in M.with_references(
        [row for r in cpu.values() for row in rehearsal.component_rows(r)]) if row["device"] == 0}
    one, two = rows[1], rows[2]
    measured = docs.above_start(cpu[2])
    assert 0.5 < M.gradients_at_backward_peak(one) < 1.0   # the backward peaks late: most written again
    assert measured["backward"] == pytest.approx(two["predicted_backward_above_start_mib"], abs=1.0)
    for row in (one, two):   # the forward's peak is the model's, not the loss's
        assert row["model_forward_peak_mib"] == row["forward_peak_mib"]
    kept = two["forward_last_gather_mib"]
    assert kept > 0 and two["predicted_gather_kept_mib"] == kept
    level = {row["gpus"]: row["forward_last_unit_start_mib"] - M.step_start(row) for row in (one, two)}
    assert level[2] == pytest.approx(level[1] + kept, abs=1.0)
    assert measured["forward"] == pytest.approx(level[2] + 2 * kept, abs=1.0)
    assert two["predicted_forward_above_start_mib"] == pytest.approx(measured["forward"], abs=1.0)
    kept_only = float(docs.rehearsal_cpu_tracker_1b_kept_only(REF).split("%")[0])
    before = float(docs.rehearsal_cpu_tracker_1b_before(REF).split("%")[0])
    assert before > kept_only > 1.0   # percent


def test_fsdp2s_side_streams_hold_the_reserved_slack_and_zero1_has_none():
    """Reserved by stream (4036c92): ZeRO-1 caches on the default stream alone, its reserved peak
    within 1% of its allocated peak; at 236M, N = 4, FSDP2's side streams hold at least 95% of
    each sharded variant's slack; the page holds the table."""
    c = docs.combined(REF)
    rows = {(r["size"], rehearsal.variant_label(r), r["gpus"]): r["memory_components"][0]
            for r in c.launches["h200-rehearsal-4036c92/n4-235m-sharded.tar.gz"]
            if r.get("status") == "ok" and (r.get("memory_components") or [{}])[0].get("reserved_by_stream_mib")}
    zero1 = rows[("1024x16", "zero1", 4)]
    assert set(zero1["reserved_by_stream_mib"]) == {"0"}
    peak = max(zero1["forward_peak_mib"], zero1["backward_peak_mib"])
    assert zero1["reserved_peak_mib"] == pytest.approx(peak, rel=0.01)
    for variant in ("fsdp", "fsdp-keep", "hsdp"):
        m = rows[("1024x16", variant, 4)]
        side = sum(v for k, v in m["reserved_by_stream_mib"].items() if k != "0")
        slack = m["reserved_peak_mib"] - max(m["forward_peak_mib"], m["backward_peak_mib"])
        assert slack > 0.15 * m["reserved_peak_mib"] and side >= 0.95 * slack, variant
    assert docs.rehearsal_reserved_by_stream(REF) in PAGE.read_text()


def test_reserved_is_checked_above_the_fewest_communicating_ranks_and_blind_rows_follow_the_rule():
    c = docs.combined(REF)
    reserved = [m for m in docs.predicted_rows(c) if m["component"] == "reserved_peak"]
    fewest: dict[tuple, int] = {}
    for m in reserved:
        if m["gpus"] >= 2:
            fewest[(m["size"], m["variant"])] = min(m["gpus"], fewest.get((m["size"], m["variant"]), 99))
    for m in reserved:
        assert m["reference_gpus"] == (1 if m["gpus"] == 1 else fewest[(m["size"], m["variant"])])
    checked = docs.reserved_checked(c)
    assert checked and all(m["gpus"] > m["reference_gpus"] for m in checked)
    worst = max(abs(m["relative_difference"]) for m in checked)
    assert docs.rehearsal_reserved_error(REF) == f"±{100 * worst:.1f}%"
    assert docs.launch_name(*docs.RESERVED_RULE_SAW) in c.launches
    blind = docs.rehearsal_reserved_blind(REF)
    after = list(c.launches)[list(c.launches).index(docs.launch_name(*docs.RESERVED_RULE_SAW)) + 1:]
    assert (blind == "none yet") == (not after)


def test_at_236m_the_kept_block_is_the_forwards_whole_rise_from_one_rank():
    """236M on the CPU tracker with the model's forward marked: fsdp's forward peak at N = 2 is one
    rank's plus the block FSDP2 keeps (48 MiB, measured), as the model predicts; without
    resharding the units held predict it, the kept block not added."""
    cpu = docs.ok_cases(REF, docs.CPU_KEPT)
    rows = {(row["variant_label"], row["gpus"]): row for row in M.with_references(
        [row for r in cpu for row in rehearsal.component_rows(r)]) if row["device"] == 0}
    one, two, keep = rows[("fsdp", 1)], rows[("fsdp", 2)], rows[("fsdp-keep", 2)]
    kept = two["forward_last_gather_mib"]
    assert kept == pytest.approx(48.05, abs=0.01) and keep["predicted_gather_kept_mib"] == 0.0
    rise = (two["forward_peak_mib"] - M.step_start(two)) - (one["forward_peak_mib"] - M.step_start(one))
    assert rise == pytest.approx(kept, abs=0.01)
    for row in (two, keep):
        measured = row["forward_peak_mib"] - M.step_start(row)
        assert measured == pytest.approx(row["predicted_forward_above_start_mib"], rel=0.005)


def test_the_h200s_1b_fsdp_forward_is_the_cpus_and_the_models_last_block_gathering():
    """fsdp at 2048x20 on 4 H200 ranks (no one-rank case there): its forward above the step's start
    is predicted from the CPU tracker's one-rank case (0.1%), its last block starts at one rank's
    level plus the kept block, and the page holds the table."""
    cpu = docs.ok_cases(REF, docs.CPU_BEYOND)
    (one,) = [r for r in cpu if int(r["gpus"]) == 1]
    (gpu,) = docs.ok_cases(REF, docs.GPU_BEYOND)
    assert gpu["gpus"] == 4 and gpu["memory_components"][0]["device"] == 0
    rows = docs.predicted_by_run([one, gpu])[gpu["run_id"]]
    model = sum(x["predicted_forward_above_start_mib"] for x in rows) / len(rows)
    assert docs.above_start(gpu)["forward"] == pytest.approx(model, rel=1e-3)
    m, m1 = gpu["memory_components"][0], one["memory_components"][0]
    level = m["forward_last_unit_start_mib"] - M.step_start(m)
    assert level == pytest.approx(m1["forward_last_unit_start_mib"] - M.step_start(m1) + m["forward_last_gather_mib"], rel=1e-3)
    assert docs.rehearsal_h200_1b_fsdp(REF) in PAGE.read_text()


def test_fsdps_backward_at_236m_rises_with_n_and_passes_the_forward_at_8():
    """What the page says of the 236M fsdp miss at N = 8: the forward stays within 2 MiB from
    N = 2 on, the backward rises at every N from 2 and is above the forward at N = 8."""
    c = docs.combined(REF)
    by_n = {n: docs.above_start(r) for n, r in docs.gpu_fsdp_by_n(c, "1024x16").items()}
    assert sorted(by_n) == [1, 2, 4, 8]
    assert max(by_n[n]["forward"] for n in (2, 4, 8)) - min(by_n[n]["forward"] for n in (2, 4, 8)) <= 2
    assert by_n[2]["backward"] < by_n[4]["backward"] < by_n[8]["backward"]
    assert by_n[8]["backward"] > by_n[8]["forward"] and by_n[4]["backward"] < by_n[4]["forward"]
    assert docs.rehearsal_fsdp_phases_by_n(REF) in PAGE.read_text()


def test_the_cpu_tracker_shows_fsdps_backward_peak_at_its_start_at_every_n():
    """236M fsdp on the CPU tracker at N = 1, 2, 4, 8: the backward's peak holds no gradient; it is
    the GPU's within 3 MiB where both measured from zero_grad (N = 1 on the H100, 4 and 8), and the
    H200's older one-rank backward is the CPU's forward-end level; from that unmarked one-rank case (one
    backward peak) the model predicts each N >= 2 short by exactly the all-gather held there (the
    prefetched block)."""
    cpu = {int(r["gpus"]): r for r in docs.ok_cases(REF, docs.CPU_KEPT + docs.CPU_RISE)
           if rehearsal.variant_label(r) == "fsdp"}
    c = docs.combined(REF)
    h200 = docs.gpu_fsdp_by_n(c, "1024x16")
    assert sorted(cpu) == sorted(h200) == [1, 2, 4, 8]
    predicted = docs.predicted_by_run(list(cpu.values()))
    for n, r in cpu.items():
        kinds = r["memory_components"][0]["backward_peak_by_kind_mib"]
        assert sum(kinds.get(k, 0) for k in M.GRADIENT_KINDS) == 0 and "Reduce Scatter" not in kinds
        rows = predicted[r["run_id"]]
        model = sum(x["predicted_backward_above_start_mib"] for x in rows) / len(rows)
        assert docs.above_start(r)["backward"] - model == pytest.approx(kinds.get("All Gather", 0), abs=0.1)
        assert (kinds.get("All Gather", 0) > 0) == (n >= 2)
    for n in (1, 4, 8):
        assert abs(docs.above_start(cpu[n])["backward"] - docs.above_start(h200[n])["backward"]) < 3
    (older,) = [r for r in c.launches["h200-rehearsal-525c3e7/rehearsal-part1.tar.gz"]
                if (r["size"], rehearsal.variant_label(r), r["gpus"]) == ("1024x16", "fsdp", 1)]
    m = cpu[1]["memory_components"][0]
    assert docs.above_start(older)["backward"] == pytest.approx(m["forward_end_mib"] - M.step_start(m), abs=0.1)
    assert docs.rehearsal_cpu_backward_rise(REF) in PAGE.read_text()


def test_the_marked_one_rank_cases_predict_fsdps_backward_start_at_every_n():
    """The backward's start marked apart (cpu-tracker-c8f7f8d): one rank's start holds no gradient
    and predicts the start at N = 2 (both sizes), 4 and 8 (236M) on the CPU exactly, the H100's
    236M at 8 within 0.1% and its 1.08B at N = 2 within 0.1%; rows whose record lacks the last
    all-gather come short by about that block; the GPU's rows measured from the forward's end are
    left out. 1.08B at N = 4 on the H100, predicted from the CPU's one-rank parts
    (cpu-tracker-56c1f32), and 1.97B at N = 2 and 4, from its one-rank parts on fake tensors
    (cpu-fake-567a31c), lie above the model within 5%, the 1.08B start the model's. The blind
    check made after the rule (cpu-tracker-db6d857) lies within 1%."""
    rows = docs.backward_start_rows(REF)
    by = {(x["model"], x["where"], x["gpus"]): x for x in rows}
    assert ("236M", "H200", 2) not in by   # 525c3e7: the backward measured from the forward's end
    for key in [("236M", "CPU tracker", n) for n in (2, 4, 8)] + [("1.08B", "CPU tracker", 2)]:
        assert by[key]["error"] == pytest.approx(0, abs=1e-4), key
    assert abs(by[("236M", "H100", 8)]["error"]) < 1e-3 and abs(by[("1.08B", "H100", 2)]["error"]) < 1e-3
    # the H100's 236M at N = 2 and 4 (11dc2db, made with the last all-gather recorded) too
    assert all(abs(by[("236M", "H100", n)]["error"]) < 1e-3 for n in (2, 4))
    # (1.08B at N = 4 and 8 and 1.97B at 8 ran again on an H200 at 72e1378: the newest wins)
    for key in (("1.08B", "H200", 4), ("1.08B", "H200", 8), ("1.97B", "H100", 2), ("1.97B", "H100", 4),
                ("1.97B", "H200", 8)):
        assert 0 < by[key]["error"] < M.TOLERANCE, key
    # 1.08B at N = 4: the marked start is the model's; the later peak is the larger
    (n4,) = [r for r in docs.combined(REF).records if (r["size"], rehearsal.variant_label(r), r["gpus"])
             == ("2048x20", "fsdp", 4)]
    m = n4["memory_components"][0]
    assert m["backward_start_peak_mib"] - M.step_start(m) == pytest.approx(by[("1.08B", "H200", 4)]["backward_start"], abs=0.5)
    assert {by[k]["one_rank"].split(",")[0] for k in by if k[0] == "1.97B"} == {"fake tensors"}
    assert {by[k]["one_rank"].split(",")[0] for k in by if k[0] != "1.97B"} == {"CPU tracker"}
    # made after the rule was committed: 11.7M and 42.3M at N = 4 and 8, within 1% and above the
    # measured start by at most the block gathered first
    blind = [x for x in rows if x["blind"]]
    assert {x["where"] for x in blind} == {"CPU tracker, blind"}
    assert {(x["model"], x["gpus"]) for x in blind} == {(m, n) for m in ("11.7M", "42.3M") for n in (4, 8)}
    for x in blind:
        assert abs(x["error"]) < 0.01 and 0 <= x["backward"] - x["measured"] <= x["kept"] + 0.1, x
    for r in docs.ok_cases(REF, docs.CPU_START + docs.CPU_START_BLIND):
        m = r["memory_components"][0]
        assert sum(m["backward_start_peak_by_kind_mib"].get(k, 0) for k in M.GRADIENT_KINDS) == 0
        assert m["backward_peak_mib"] == max(m["backward_start_peak_mib"], m["backward_late_peak_mib"])
    page = PAGE.read_text()
    for q in (docs.rehearsal_backward_start, docs.rehearsal_backward_start_one_rank,
              docs.rehearsal_backward_start_verdict):
        assert q(REF) in page


def test_at_four_ranks_fsdps_later_backward_peak_moves_inside_the_blocks():
    """1.08B's units on 4 blocks (cpu-tracker-44481c1): the model predicts the backward's start at
    N = 1, 2, 4 and its later peak at 1 and 2 exactly; at 4 the later peak lies above the model by
    more than 5%, holding the root and one block unsharded, one block's all-gather output and one
    block's reduce-scatter buffer, and only one block's gradient shard."""
    rows = {x["gpus"]: x for x in docs.wide_rows(REF)}
    assert sorted(rows) == [1, 2, 4]
    for x in rows.values():
        assert x["start"] == pytest.approx(x["model_start"], abs=0.1), x["gpus"]
    for n in (1, 2):
        assert rows[n]["late"] == pytest.approx(rows[n]["model_late"], abs=0.1)
    four = rows[4]
    assert four["late"] > four["model_late"] * (1 + M.TOLERANCE)
    block, kinds = four["block"], four["kinds"]
    (one,) = [r for r in docs.ok_cases(REF, docs.CPU_WIDE) if int(r["gpus"]) == 4]
    root = one["memory_components"][0]["largest_unit_mib"]
    assert kinds["All Gather"] == pytest.approx(block, abs=0.1)
    assert kinds["Reduce Scatter"] == pytest.approx(block, abs=0.1)
    assert kinds["Unsharded Param"] == pytest.approx(root + block, abs=0.1)
    assert sum(kinds.get(k, 0) for k in M.GRADIENT_KINDS) == pytest.approx(block / 4, abs=0.1)
    assert docs.rehearsal_late_peak_in_blocks(REF) in PAGE.read_text()


def test_part_by_part_the_model_predicts_the_later_backward_peak_made_after_the_rule():
    """Each unit's part marked (cpu-tracker-56c1f32): on the 4-block cases the rule was made on and
    on every case made after it (11.7M and 42.3M at N = 2, 4, 8; 236M at 4 and 8) the model's
    later peak is the measured one within 0.1 MiB and names the part holding it, a unit's inside
    the blocks at N = 4 on 4 blocks, where the rule without the parts misses by more than 5%.
    Every rank's parts add up: its backward's peak is the highest of start, parts and root's.
    From the CPU's one-rank parts the H100's 1.08B at N = 4 lies within 5% (31.8% without), and
    from fake tensors' one-rank parts its 1.97B at N = 2 and 4 too."""
    rows = docs.unit_part_rows(REF)
    cpu = [x for x in rows if x["where"] == "CPU tracker"]
    assert {(x["model"], x["gpus"]) for x in cpu if x["blind"]} == \
        {(m, n) for m in ("11.7M", "42.3M") for n in (2, 4, 8)} | {("236M", 4), ("236M", 8)}
    for x in cpu:
        assert x["measured"] == pytest.approx(x["model_late"], abs=0.1), x
        assert x["part"] == x["model_part"], x
    wide = {x["gpus"]: x for x in cpu if not x["blind"]}
    assert sorted(wide) == [2, 4]
    assert wide[2]["part"] == "the root's" and wide[4]["part"] != "the root's"
    assert wide[4]["older_error"] > M.TOLERANCE and wide[2]["older_error"] == pytest.approx(0, abs=1e-4)
    for r in docs.ok_cases(REF, docs.CPU_PARTS_MADE_ON + docs.CPU_PARTS_BLIND + docs.CPU_PARTS_1B):
        for m in r["memory_components"]:
            parts = [m["backward_end_part_peak_mib"], *m["backward_unit_peaks_mib"].values()]
            assert m["backward_peak_mib"] == max(m["backward_start_peak_mib"], *parts)
            assert len(m["backward_unit_peaks_mib"]) == len(m["unit_mib"]) - 1
    gpu = {(x["model"], x["gpus"]): x for x in rows if x["where"] in ("H100", "H200")}
    assert set(gpu) == {("1.08B", 2), ("1.08B", 4), ("1.08B", 8), ("1.97B", 2), ("1.97B", 4), ("1.97B", 8)}
    for key in (("1.97B", 2), ("1.97B", 4)):   # one-rank parts on fake tensors; 1307c9b marked no parts
        assert 0 < gpu[key]["error"] < M.TOLERANCE < gpu[key]["older_error"], key
        assert gpu[key]["part"] == "not recorded" and gpu[key]["model_part"] != "the root's"
    # made after the rule, the parts recorded (the H200's at 72e1378); 1.08B at N = 4's peak is in
    # the 1st unit's part where the model puts it in the 2nd's
    assert {gpu[k]["where"] for k in (("1.08B", 4), ("1.08B", 8), ("1.97B", 8))} == {"H200"}
    for key in (("1.08B", 4), ("1.08B", 8), ("1.97B", 8)):
        assert 0 < gpu[key]["error"] < M.TOLERANCE < gpu[key]["older_error"], key
    assert {x["one_rank"].split(",")[0] for k, x in gpu.items() if k[0] == "1.97B"} == {"fake tensors"}
    page = PAGE.read_text()
    assert docs.rehearsal_unit_parts(REF) in page and docs.rehearsal_unit_parts_verdict(REF) in page


def test_fake_tensors_hold_the_gloo_ranks_peaks_and_the_gpus_activation_peak():
    """cpu-fake-567a31c beside the CPU tracker's gloo ranks (cpu-tracker-56c1f32): every case's
    activation peak, step's start and later backward peak within 0.01 MiB, the few unit parts
    apart none a case's highest; beside the GPU's allocator (every combined launch's case it ran
    too): the activation peak within 1.5%, the GPU's step starting higher by what the CUDA
    process allocates before it, the later backward peak never below fake tensors' by 1 MiB."""
    rows = docs.fake_rows(REF)
    cpu = [x for x in rows if x["where"] == "CPU tracker"]
    assert len(cpu) == 15
    for x in cpu:
        for k in ("activation", "start", "late"):
            assert x[k] == pytest.approx(x[f"fake_{k}"], abs=0.01), (x["model"], x["gpus"], k)
        apart = [k for k, v in x["parts"].items() if abs(v - x["fake_parts"][k]) >= 0.005]
        assert all(x["parts"][k] < max(x["parts"].values()) for k in apart)
    gpu = [x for x in rows if x["where"] != "CPU tracker"]
    assert {x["model"] for x in gpu} >= {"11.7M", "42.3M", "236M", "1.08B", "1.97B"}
    assert {x["variant"] for x in gpu} == {"fsdp", "fsdp-keep", "hsdp"}
    for x in gpu:
        assert x["activation"] == pytest.approx(x["fake_activation"], rel=0.015), (x["model"], x["variant"], x["gpus"])
        assert x["start"] - x["fake_start"] > 60
        if x["late"] is not None:
            assert x["late"] > x["fake_late"] - 1.0
    page = PAGE.read_text()
    for q in (docs.rehearsal_fake_vs_gloo, docs.rehearsal_fake_vs_gpu, docs.rehearsal_fake_vs_gpu_summary):
        assert q(REF) in page


def test_on_fake_tensors_the_model_holds_fsdp_and_hsdp_and_keeping_units_but_the_first_part():
    """The fake cases from N = 2 (cpu-fake-87992f5, the loss marked apart) against the model from
    their one-rank cases: fsdp and hsdp within 1.5% at every size to 1.97B and N = 8; fsdp
    without resharding (memory_model.kept_units) beyond 5% only on 1.08B's units on 4 blocks at
    N = 8, where the backward's first part sets the prediction and the model lies above it. At
    one rank's loss no parameter is unsharded (its root resharded); a rank keeping its units
    holds every one there, the root too. The older reference (no loss marked) stands the
    forward's peak for the loss's: nowhere below the measured by more than 1%."""
    table = [m for m in rehearsal.memory_table(docs.ok_cases(REF, docs.FAKE))
             if m["component"] == "activation_peak" and m["gpus"] > 1]
    for m in table:
        if m["variant"] in ("fsdp", "hsdp"):
            assert abs(m["relative_difference"]) < 0.015, m
    assert {(m["size"], m["variant"], m["gpus"]) for m in table if abs(m["relative_difference"]) > M.TOLERANCE} == \
        {("2048x4", "fsdp-keep", 8)}
    recs = {(r["size"], rehearsal.variant_label(r), r["gpus"]): r for r in docs.ok_cases(REF, docs.FAKE)}
    one, keep = (recs[("2048x4", v, n)]["memory_components"][0] for v, n in (("fsdp", 1), ("fsdp-keep", 8)))
    assert "Unsharded Param" not in one["loss_peak_by_kind_mib"]
    assert keep["loss_peak_by_kind_mib"]["Unsharded Param"] == pytest.approx(sum(keep["unit_mib"]), abs=0.01)
    predicted = [r for r in M.with_references(rehearsal.component_rows(recs[("2048x4", "fsdp", 1)])
                                              + rehearsal.component_rows(recs[("2048x4", "fsdp-keep", 8)]))
                 if r["gpus"] == 8][0]
    first = str(len(keep["unit_mib"]) - 2)
    assert predicted["predicted_activation_peak_mib"] == predicted[f"predicted_backward_part_{first}_above_start_mib"]
    assert predicted["predicted_activation_peak_mib"] > keep["activation_peak_mib"]
    older = [m for m in rehearsal.memory_table(docs.ok_cases(REF, docs.FAKE[:1]))
             if m["component"] == "activation_peak" and m["gpus"] > 1 and m["variant"] == "fsdp-keep"]
    assert older and all(m["relative_difference"] <= 0.01 for m in older)
    assert docs.rehearsal_model_vs_fake(REF) in PAGE.read_text()


def test_the_gpus_own_parts_predict_236m_and_an_excess_appears_at_more_ranks_at_1b_and_2b():
    """h100-rehearsal-ceb1b88's one-rank cases mark each unit's part on the GPU: at 236M every
    part lies the same 20 MiB above fake tensors' and the GPU's N = 8 later peak is predicted from
    them within 1 MiB (N = 2, 4, 8); at 1.08B the parts equal fake tensors', and the later peak lies
    above the model by a unit's fraction from N = 4 (1.97B from N = 2), not at 1.08B's N = 2."""
    c = docs.combined(REF)
    fake = {r["size"]: r for r in docs.ok_cases(REF, docs.FAKE) if r["gpus"] == 1 and r["variant"] == "fsdp"}
    above = {}
    for size in ("1024x16", "2048x20", "2560x24"):
        by_n = docs.gpu_fsdp_by_n(c, size)
        g, f = by_n[1]["memory_components"][0], fake[size]["memory_components"][0]
        apart = {round((g["backward_unit_peaks_mib"][k] - M.step_start(g)) - (f["backward_unit_peaks_mib"][k] - M.step_start(f)), 1)
                 for k in g["backward_unit_peaks_mib"]}
        if size == "2560x24":
            assert 0 <= min(apart) and max(apart) <= 4.0
        else:   # the same in every part
            assert apart == {{"1024x16": 20.0, "2048x20": 0.0}[size]}
        for n, r in by_n.items():
            if n > 1 and "backward_late_peak_mib" in r["memory_components"][0]:
                rows = [m for m in docs.predicted_by_run([by_n[1], r])[r["run_id"]] if m["gpus"] == n]
                above[(size, n)] = sum(m["backward_late_peak_mib"] - M.step_start(m) - m["predicted_backward_late_above_start_mib"]
                                       for m in rows) / len(rows)
    assert set(above) == {("1024x16", n) for n in (2, 4, 8)} | {("2048x20", n) for n in (2, 4, 8)} | {
        ("2560x24", n) for n in (2, 4, 8)}
    assert all(abs(above[("1024x16", n)]) < 1 for n in (2, 4, 8)) and abs(above[("2048x20", 2)]) < 1
    # the excess appears at 1.08B from N = 4 and at 1.97B from N = 2, a unit's fraction, and does
    # not grow from N = 4 to 8
    excess = (("2048x20", 4), ("2048x20", 8), ("2560x24", 2), ("2560x24", 4), ("2560x24", 8))
    assert all(20 < above[k] < 100 for k in excess)
    assert above[("2048x20", 8)] < above[("2048x20", 4)] and above[("2560x24", 8)] < above[("2560x24", 4)]
    assert docs.rehearsal_gpu_parts(REF) in PAGE.read_text()


def test_the_rule_for_keeping_units_holds_blind_where_the_older_one_overshot():
    """On the four shapes the rule was not made on (cpu-fake-87992f5's blind set), fsdp without
    resharding lies within 5% of the model but at one case, where the model lies above (the
    backward's first part), and nearer than the older rule (every unit on every peak) in every
    case; the older rule misses beyond 5% in more cases."""
    cases = docs.ok_cases(REF, docs.FAKE_KEEP_BLIND)
    assert len(cases) == 36 and all(r["fake"] for r in cases)
    def keep_rows(cs):
        return {(m["size"], m["gpus"]): m["relative_difference"] for m in rehearsal.memory_table(cs)
                if m["component"] == "activation_peak" and m["gpus"] > 1 and m["variant"] == "fsdp-keep"}
    now = keep_rows(cases)
    before = keep_rows([docs.without_units(r) if r["gpus"] == 1 else r for r in cases])
    assert len(now) == len(before) == 12
    misses = [k for k, v in now.items() if abs(v) > M.TOLERANCE]
    assert all(now[k] < 0 for k in misses) and len(misses) < sum(abs(v) > M.TOLERANCE for v in before.values())
    assert all(abs(now[k]) <= abs(before[k]) + 1e-9 for k in now)
    assert docs.rehearsal_keep_blind(REF) in PAGE.read_text()


def test_the_card_changes_no_allocation_and_gloo_copies_a_whole_buffer_per_gather_and_reduce_scatter():
    """The cases run on both cards at the same torch (h200-rehearsal-a7dce61, h100-rehearsal-1307c9b)
    allocate the same to 0.5 MiB on every rank, 1.08B's reserving the same too; gloo's probe on the
    GPU holds one more whole buffer in its reduce-scatter and all-gather and none in its all-reduce."""
    for old, new in docs.CARD_PAIRS:
        a, b = ([r for r in rehearsal.read_launch(REF / x[0] / x[1])[0] if not r.get("launched")
                 and r.get("status") == "ok" and rehearsal.variant_label(r) == "fsdp"][0] for x in (old, new))
        for x, y in zip(a["memory_components"], b["memory_components"], strict=True):
            assert max(abs(x[k] - y[k]) for k in docs.ALLOCATED) <= 0.5
        if a["size"] == "2048x20":
            assert [m["reserved_peak_mib"] for m in a["memory_components"]] == \
                [m["reserved_peak_mib"] for m in b["memory_components"]]
    seen = {x["collective"]: x for x in map(json.loads, (REF / docs.GLOO_PROBE[0] / docs.GLOO_PROBE[1]).read_text().splitlines())}
    assert seen["reduce_scatter_tensor"]["peak_above_tensors_mib"] == seen["reduce_scatter_tensor"]["input_mib"]
    assert seen["all_gather_into_tensor"]["peak_above_tensors_mib"] == seen["all_gather_into_tensor"]["input_mib"]
    assert seen["all_reduce"]["peak_above_tensors_mib"] == 0
    page = PAGE.read_text()
    assert docs.rehearsal_card_check(REF) in page and docs.rehearsal_gloo_copies(REF) in page


def test_ddps_peak_at_batch_1_is_the_same_at_every_n_the_carry_from_one_rank_rests_on():
    """rehearsed.ddp_from_one_rank takes DDP's one-rank 'not even batch 1' to N ranks that do not
    fit the GPU: on every GPU record DDP's batch-1 peak a rank is within 2 MiB or 0.1% across N."""
    peaks: dict[str, dict[int, float]] = {}
    for recs in docs.combined(REF).launches.values():
        for r in recs:
            for t in r.get("search_trials") or [] if r.get("variant") == "ddp" and r.get("status") == "ok" else []:
                if t.get("batch") == 1 and t.get("how") == "measured":
                    peaks.setdefault(str(r["size"]), {})[int(r["gpus"])] = t["peak_mib"]
    assert {n for by_n in peaks.values() for n in by_n} == {1, 2, 4, 8}
    for size, by_n in peaks.items():
        spread = max(by_n.values()) - min(by_n.values())
        assert len(by_n) >= 2 and spread <= max(2.0, 0.001 * max(by_n.values())), (size, by_n)
