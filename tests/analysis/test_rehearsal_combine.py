"""Rehearsal launches combined (issue 38), torch-free: the newest launch's record of a case wins,
failed and not-run cases stay rows with their reasons, a case the ranks never reached takes its
model from a record of the same size, a launch without one-rank runs takes its activation and
reserved predictions from another launch's N = 1 run, and the launches' tars are read as
rehearse.py packs them or as the raw work folder held them."""
from __future__ import annotations

import io
import json
import tarfile

from dpbench.analysis import rehearsal as R
from dpbench.claims.c9 import rehearsed
from dpbench.report.sharding_plots import plot_rehearsed_memory

P12 = 11_679_232


def record(case: str, gpus: int, status: str = "ok", reason: str = "", size: str | None = "256x4", **extra) -> dict:
    variant = case.split("-")[1]
    rec = {"run_id": f"{case}-g{gpus}", "case": case, "variant": variant, "gpus": gpus, "status": status,
           "reason": reason, "launch": {"nodes": 1}}
    if size:
        rec.update(size=size, parameters=P12, param_bytes=4 * P12)
    return {**rec, **extra}


def components(activation: float, reserved: float, params: float = 44.55) -> list[dict]:
    return [{"device": 0, "parameters_mib": params, "gradients_mib": params, "optimizer_mib": params,
             "largest_gather_mib": 0.0, "forward_peak_mib": 1500.0, "backward_peak_mib": 1400.0,
             "activation_peak_mib": activation, "reserved_peak_mib": reserved}]


def test_the_newest_launch_wins_and_failed_cases_stay_rows_with_their_reasons():
    old = [record("12m-ddp", 8, "failed", "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] "
                  "Connection closed by peer [127.0.0.1]:33706\n\nAt:\n  somewhere"),
           record("12m-zero1", 8, "failed", "not run: the ranks lost step in case 12m-ddp (RuntimeError)", size=None),
           record("42m-ddp", 8, "failed", "not run: the ranks lost step in case 12m-ddp (RuntimeError)", size=None)]
    new = [record("12m-ddp", 8), record("12m-zero1", 8)]
    combined = R.combine([("old", old), ("new", new)])
    by = {(r["case"], r["gpus"]): r for r in combined}
    assert len(combined) == 3
    assert by[("12m-ddp", 8)]["status"] == "ok" and by[("12m-ddp", 8)][R.SOURCE] == "new"
    assert by[("12m-zero1", 8)]["status"] == "ok" and by[("12m-zero1", 8)][R.SOURCE] == "new"
    kept = R.not_ok_rows(combined)
    assert [(k["variant"], k["gpus"], k[R.SOURCE]) for k in kept] == [("ddp", 8, "old")]
    assert kept[0]["reason"].startswith("not run: the ranks lost step")
    # the other order: the older launch's ok record gives way to a newer failure
    flipped = R.combine([("new", new), ("old", old)])
    failed = {(k["variant"], k["size"]): k["reason"] for k in R.not_ok_rows(flipped)}
    assert failed[("ddp", "256x4")] == "RuntimeError: [pair.cc:547] Connection closed by peer"
    assert ("zero1", "256x4") in failed   # the never-reached case took its size from 12m-ddp's record


def test_a_budget_the_newest_launch_could_not_search_keeps_an_earlier_launchs_search():
    """A smaller GPU's launch measures the case again without a budget N ranks of it do not fit:
    its record wins (memory), and the earlier launch's search of that budget stays, named; a
    budget both searched is the newest's; a failed newest record carries nothing."""
    big = {"16GB": {"largest": 18, "cut_short": False}, "24GB": {"largest": 29, "cut_short": False}}
    h200 = [record("235m-fsdp", 8, search=big), record("235m-zero1", 8, search={"16GB": {"largest": 16}})]
    h100 = [record("235m-fsdp", 8, search={"24GB": {"largest": 30, "cut_short": False}}),
            record("235m-zero1", 8, "failed", "boom")]
    later = [record("235m-fsdp", 8)]
    by = {r["case"]: r for r in R.combine([("h200", h200), ("h100", h100), ("later", later)])}
    fsdp = by["235m-fsdp"]
    assert fsdp[R.SOURCE] == "later"
    assert {b: s["largest"] for b, s in fsdp["search"].items()} == {"16GB": 18, "24GB": 30}
    assert fsdp[R.SEARCH_FROM] == {"16GB": "h200", "24GB": "h100"}
    assert by["235m-zero1"]["status"] == "failed" and "search" not in by["235m-zero1"]
    # and C9's rows read the carried search
    rows = rehearsed.c9_rows([fsdp], {"16GB": 14.0, "24GB": 22.0})
    assert {r["budget"]: r["largest_batch"] for r in rows} == {"16GB": 18, "24GB": 30}


def test_a_search_the_newest_launch_cut_short_keeps_an_earlier_finished_one():
    """Seen at 1.08B fsdp, N = 4: an H100 searched 16GB to its end (7); an H200's later launch
    ran out of time at batch 2. The finished search stays, named; a newest search cut short
    where no earlier one finished stays the newest's."""
    h100 = [record("1b-fsdp", 4, search={"16GB": {"largest": 7, "cut_short": False},
                                         "24GB": {"largest": 1, "cut_short": True}})]
    h200 = [record("1b-fsdp", 4, search={"16GB": {"largest": 2, "cut_short": True},
                                         "24GB": {"largest": 2, "cut_short": True}})]
    (fsdp,) = R.combine([("h100", h100), ("h200", h200)])
    assert fsdp[R.SOURCE] == "h200" and fsdp[R.SEARCH_FROM] == {"16GB": "h100"}
    assert {b: (s["largest"], s["cut_short"]) for b, s in fsdp["search"].items()} == {"16GB": (7, False),
                                                                                      "24GB": (2, True)}


def test_a_never_reached_case_takes_its_model_and_resharding_from_its_names():
    recs = [record("235m-ddp", 8, "failed", "RuntimeError: boom", size="1024x16", parameters=235_620_352),
            record("235m-fsdp-keep", 8, "failed", "not run", size=None),
            record("235m-fsdp", 8, "failed", "not run", size=None)]
    combined = R.combine([("only", recs)])
    assert {r["size"] for r in combined} == {"1024x16"} and {r["parameters"] for r in combined} == {235_620_352}
    assert sorted(R.variant_label(r) for r in combined) == ["ddp", "fsdp", "fsdp-keep"]
    rows = rehearsed.c9_rows(combined, {"16GB": 14.0})
    assert len(rows) == 3 and all(r["largest_batch"] is None for r in rows)
    assert {r["reason"] for r in rows} == {"RuntimeError: boom", "not run"}


def test_a_launch_without_one_rank_runs_takes_activations_and_reserved_from_another_launchs():
    one = [record("12m-ddp", 1, options={"per_gpu_batch": 8}, memory_components=components(1756.0, 2474.0))]
    eight = [record("12m-ddp", 8, options={"per_gpu_batch": 8}, memory_components=components(1760.0, 2500.0))]
    alone = {m["component"]: m for m in R.memory_table(eight)}
    for peak in ("activation_peak", "reserved_peak"):   # measured, with nothing to predict them from
        assert alone[peak]["predicted_mib"] is None and alone[peak]["relative_difference"] is None
        assert not alone[peak]["beyond_tolerance"]
    assert alone["activation_peak"]["measured_mib"] == 1760.0
    table = R.memory_table(R.combine([("n1", one), ("n8", eight)]))
    at8 = {m["component"]: m for m in table if m["gpus"] == 8}
    assert at8["activation_peak"]["predicted_mib"] == 1756.0 and at8["activation_peak"]["measured_mib"] == 1760.0
    # reserved's slack comes from the fewest ranks that communicate: N = 8 itself here
    assert at8["activation_peak"]["reference_gpus"] == 1 and at8["reserved_peak"]["reference_gpus"] == 8
    # and from another launch's N = 2 where one ran: its slack (2490 - 1756 over the state)
    two = [record("12m-ddp", 2, options={"per_gpu_batch": 8}, memory_components=components(1756.0, 2490.0))]
    table = R.memory_table(R.combine([("n1", one), ("n2", two), ("n8", eight)]))
    at8 = {m["component"]: m for m in table if m["gpus"] == 8}
    assert at8["reserved_peak"]["reference_gpus"] == 2 and at8["reserved_peak"]["predicted_mib"] == 2490.0
    assert abs(at8["reserved_peak"]["relative_difference"] - (2500 / 2490 - 1)) < 1e-12


def test_launch_tars_are_read_as_packed_and_as_raw_work_folders(tmp_path):
    def tar(path, members):
        with tarfile.open(path, "w:gz") as t:
            for name, text in members.items():
                data = text.encode()
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    nf = [{"ranks": 8, "budget": "24GB", "reason": "does not fit", "cases": ["12m-ddp"]}]
    tar(tmp_path / "packed.tar.gz", {"records.jsonl": json.dumps(record("12m-ddp", 8)) + "\n",
                                     "not_fitting.json": json.dumps(nf), "rehearsal.md": "# x"})
    tar(tmp_path / "raw.tgz", {"./work/n8/runs/cases-8.jsonl": json.dumps(record("12m-fsdp", 8)),
                               "./work/n8/not_fitting.json": json.dumps(nf), "./work/n8/runs/plan-8.json": "[]"})
    packed, raw = R.read_launch(tmp_path / "packed.tar.gz"), R.read_launch(tmp_path / "raw.tgz")
    assert [r["case"] for r in packed[0]] == ["12m-ddp"] and [r["case"] for r in raw[0]] == ["12m-fsdp"]
    assert R.combine_not_fitting([packed[1], raw[1]]) == nf


def test_the_memory_figure_legend_names_only_the_components_drawn():
    rows = [{"size": "256x4", "variant": "ddp", "gpus": 8, "component": c, "measured_mib": 44.5, "predicted_mib": 44.5}
            for c in ("parameters", "gradients", "optimizer")]
    fig = plot_rehearsed_memory(rows, "256x4", failed=[("ddp", 4), ("hsdp", 8)])
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["parameters", "gradients", "optimizer state", "memory model"]
    (ax,) = fig.axes   # no panel for hsdp, which has no data: the title says it did not run
    assert [t.get_text() for t in ax.get_xticklabels()] == ["N=4", "N=8"]
    assert [t.get_text() for t in ax.texts] == ["did not run"]
