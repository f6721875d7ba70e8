"""The ledger over planted evidence: every claim rendered, observations found by id, what was not
measured."""
import re


from dpbench import results
from dpbench.claims import CLAIM_IDS, CONFIRMED, NOT_RUN, NUANCE, REFUTED
from dpbench.claims.c2 import text as c2_text
from dpbench.claims.c3 import text as c3_text
from dpbench.claims.c4 import text as c4_text
from dpbench.claims.c5 import text as c5_text
from dpbench.claims.c6 import text as c6_text
from dpbench.claims.c7 import text as c7_text
from dpbench.claims.figures import DRAW
from dpbench.claims.ledger import Evidence, build_sections
from dpbench.claims.records import ProbeRecord
from dpbench.plan.matrix import read_identities

from claims.planted import CROSSING, PLANNED, RAN_ON_GPU, fake_gpu_probes, FakeTag, gpu_tag, evidence, ledger


def fake_cpu_probes():
    cpu = {**RAN_ON_GPU, "device_type": "cpu", "gpus_visible": 0, "gpu_names": [], "cudnn": None}
    recs = {}
    for cid, rec in fake_gpu_probes().items():
        rec.ran_on = cpu
        if cid in ("C2", "C5", "C7"):
            rec.verdict, rec.observations, rec.not_run = NOT_RUN, [], "needs 2 GPUs (found 0)"
        if cid == "C9":
            rec.verdict, rec.observations, rec.not_run = NOT_RUN, [], "needs CUDA: nothing runs out of memory on the CPU"
        recs[cid] = rec
    return recs


def test_ledger_renders_every_claim_with_a_verdict_from_gpu_evidence(tmp_path):
    fig = results.ResultSet(tmp_path, "t").figure_path("warnings")   # drawn by the plots rule, before
    fig.parent.mkdir(parents=True)
    fig.write_bytes(b"png")
    md, claims = ledger(tmp_path, gpu_tag(), fake_gpu_probes())
    assert claims["C5"]["figures"] == ["figures/warnings.png"] and "](figures/warnings.png)" in md
    assert claims["C8"]["figures"][:2] == ["figures/claim_c8.png", "figures/claim_c8_dp_step.png"]
    for cid in ("C1", "C6", "C7", "C8", "C9"):   # the ledger's own figures, linked relative to claims.md
        assert claims[cid]["figures"][0] == f"figures/claim_{cid.lower()}.png"
        assert (results.ResultSet(tmp_path, "t").dir / claims[cid]["figures"][0]).stat().st_size > 10_000
    assert list(claims) == CLAIM_IDS
    verdicts = {cid: c["verdict"] for cid, c in claims.items()}
    assert verdicts == {"C1": CONFIRMED, "C2": NUANCE, "C3": REFUTED, "C4": NUANCE, "C5": CONFIRMED,
                        "C6": CONFIRMED, "C7": CONFIRMED, "C8": NUANCE, "C9": CONFIRMED}
    for cid, c in claims.items():
        assert re.search(rf"\| {cid} +\| {re.escape(c['title'])} +\| {c['verdict']} +\|", md)
        assert f"## {cid}: " in md and c["summary"] and c["measured_on"] and c["advice"]
    fp32 = next(c for c in claims["C8"]["data"]["curves"] if c["series"] == "fp32" and c["variant"] == "dp")
    assert [x["between"] for x in fp32["crossings"]] == [[512, 2048]]
    assert claims["C8"]["data"]["dp_step"]["threads_are_the_cost"] is True
    assert [c["from_outputs"] for c in claims["C1"]["data"]["conditions"]] == [32768]
    assert any("150 times" in e for e in claims["C5"]["evidence"])
    table = results.ResultSet(tmp_path, "t").claim_table("largest_batch")   # C9's rows, beside claims.md
    assert len(table) == len(CROSSING) and table["largest_batch"].max() == 512
    assert table[table["variant"] == "fsdp"]["reshard_after_forward"].all()
    assert "torch 2.11.0+cu130" in " ".join(claims["C1"]["measured_on"])
    assert claims["C2"]["figures"] == []


def test_observations_are_found_by_id_after_rewording(tmp_path):
    probes = fake_gpu_probes()
    before = {cid: f(evidence(tmp_path / "a", FakeTag(), probes)).summary
              for cid, f in [("C2", c2_text.finding), ("C3", c3_text.finding), ("C4", c4_text.finding),
                             ("C5", c5_text.finding), ("C6", c6_text.finding), ("C7", c7_text.finding)]}
    for rec in probes.values():
        for o in rec.observations:
            o.what = f"reworded: {o.what[::-1]}"
    after = {cid: f(evidence(tmp_path / "b", FakeTag(), probes)).summary
             for cid, f in [("C2", c2_text.finding), ("C3", c3_text.finding), ("C4", c4_text.finding),
                            ("C5", c5_text.finding), ("C6", c6_text.finding), ("C7", c7_text.finding)]}
    for cid in before:   # C2 quotes the description of the failing case; everything else is by id
        assert after[cid] == before[cid] or cid == "C2"


def test_legacy_probe_records_without_ids_still_render(tmp_path):
    legacy = {"claim": "C3", "title": "t", "ran_on": RAN_ON_GPU, "verdict": REFUTED, "advice": "",
              "not_run": None, "parts_not_run": [],
              "observations": [{"what": "calls that misbehave", "result": ["x"]}]}
    rec = ProbeRecord.from_json(legacy)
    assert rec.observations[0].id == "unnamed.0" and rec.values("c3.misbehaving_calls") == {}


def test_ledger_on_cpu_says_what_was_not_measured_and_why(tmp_path):
    t = FakeTag()
    for group, spec in t.groups.items():
        for v in spec["variants"]:
            if v == "single":
                t.run(group, v, 1, images_per_s=50.0, wall_s=9.0, device_type="cpu", final_loss=2.0, test_acc=0.1)
            else:
                t.run(group, v, max(spec["gpus"]), status="skipped")
    md, claims = ledger(tmp_path, t, fake_cpu_probes())
    for cid in CLAIM_IDS:
        assert re.search(rf"\| {cid} +\|", md)
    assert "negligible" not in claims["C1"]["advice"]   # nothing measured: the standing advice claims no size
    assert "thread" not in claims["C7"]["advice"] and "scatter" not in claims["C8"]["advice"]   # ... and no cause
    for cid in ("C1", "C8"):
        assert claims[cid]["verdict"] == NOT_RUN
        assert claims[cid]["not_run"].startswith("not measured here: needs 2 GPUs (found 0)")
        assert '"skipped: DataParallel needs CUDA; no GPU visible"' in claims[cid]["not_run"]
    for cid in ("C2", "C5", "C7"):
        assert claims[cid]["verdict"] == NOT_RUN and "needs 2 GPUs (found 0)" in claims[cid]["not_run"]
    assert claims["C6"]["verdict"] == CONFIRMED  # the arithmetic and the CPU emulation stand alone
    assert claims["C9"]["verdict"] == NOT_RUN and "needs CUDA" in claims["C9"]["not_run"]
    assert any(e.startswith("training runs on an uneven split: not measured here: needs 2 GPUs (found 0)")
               for e in claims["C6"]["evidence"])
    assert "**Not measured here:** needs 2 GPUs (found 0)" in md
    for key in DRAW:   # every figure written, saying why where nothing was measured
        assert results.ResultSet(tmp_path, "t").claim_figure_path(key).exists()


def _with_runs_csv(tmp_path, tag):
    """The planted set as collect writes it now: runs.csv beside summary.csv, each run with the
    cell id and group plan.json gave it."""
    tag.write(tmp_path, "t", fake_gpu_probes())
    identities = read_identities(PLANNED)
    rows = [{**row, "cell_id": identities[row["run_id"]].cell_id, "group": identities[row["run_id"]].group}
            for row in tag.summary]
    results.write_csv(results.ResultSet(tmp_path, "t").table_path("runs"), results.TABLES["runs"], rows)
    return Evidence(tmp_path, "t", PLANNED)


def test_a_groups_runs_are_its_cells_where_runs_csv_carries_them(tmp_path):
    """c8_fp32_b2048 and c1_out10 share an options label: by label the C8 group also finds C1's
    dp_sum runs; by the plan's cell ids only its own."""
    by_label = evidence(tmp_path / "label", gpu_tag())
    by_cell = _with_runs_csv(tmp_path / "cell", gpu_tag())
    assert "cell_id" not in by_label.tables["summary"] and "cell_id" in by_cell.tables["summary"]
    c8_variants = set(PLANNED["groups"][[g["name"] for g in PLANNED["groups"]].index("c8_fp32_b2048")]["variants"])
    assert set(by_label.runs_of(["c8_fp32_b2048"])["variant"]) == c8_variants | {"dp_sum"}
    assert set(by_cell.runs_of(["c8_fp32_b2048"])["variant"]) == c8_variants
    assert set(by_cell.runs_of(["c8_fp32_b2048"])["cell_id"]) <= by_cell.group_cells["c8_fp32_b2048"]
    verdicts = [{s.id: (s.verdict, s.data) for s in build_sections(ev)} for ev in (by_label, by_cell)]
    assert verdicts[0] == verdicts[1]
