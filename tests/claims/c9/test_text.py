"""C9's finding: its verdict, crossovers and predictions come from the rows (its evidence in words: the C9
snapshot of tests/claims/test_text.py)."""


from dpbench.claims import CONFIRMED, NOT_RUN
from dpbench.claims.c9 import predicted, text

from claims.planted import CROSSING, probe_record


class Ev:
    """The little of the ledger's Evidence that C9 reads."""

    def __init__(self, probe_rec):
        self.probes = {"C9": probe_rec} if probe_rec else {}

    def measured_on_probe(self, cid):
        return f"probe: {cid}"

    def gpus_found(self):
        return 0


def test_finding_words_come_from_the_rows():
    f = text.finding(Ev(probe_record(CROSSING)))
    assert f.verdict == CONFIRMED
    first = {c["quantity"]: c["first_exceeds"] for c in f.data["crossovers"]}
    assert first == {"largest_batch": 235_000_000, "samples_per_s_at_largest": 1_070_000_000}
    assert f.data["budgets"] == {"12 GiB": 12.0}
    assert len(f.data["rows"]) == len(CROSSING) and f.data["interconnect"] == "NV18"
    moved = [dict(r, largest_batch=8) if r["variant"] == "ddp" and r["gpus"] == 2 else r for r in CROSSING]
    first = {c["quantity"]: c["first_exceeds"] for c in text.finding(Ev(probe_record(moved))).data["crossovers"]}
    assert first["largest_batch"] == 12_000_000


def test_finding_on_one_gpu_predicts_and_says_not_measured():
    f = text.finding(Ev(probe_record([r for r in CROSSING if r["gpus"] == 1], gpus=1)))
    assert f.verdict == NOT_RUN and "needs 2 GPUs (found 1)" in f.not_run
    assert f.data["crossovers"] == [] and [p["cap_gib"] for p in f.data["predicted"]] == [12.0]   # predicted only
    assert {(r["variant"], r["gpus"], r["largest_batch"]) for r in f.data["rows"]} == {("ddp", 1, 500), ("fsdp", 1, 500)}
    none = text.finding(Ev(None))
    assert none.verdict == NOT_RUN and "no probe record claims/C9.json" in none.not_run
    # without rows: the named devices' budgets, never the probe's cap
    assert [p["budget"] for p in none.data["predicted"]] == list(predicted.BUDGETS)
    assert [p["cap_gib"] for p in none.data["predicted"]] == [22.0, 14.0] and none.data["budgets"] == {}


def test_size_names_order_by_the_parameters_they_name():
    """'1.08B' is larger than '236M' (the page's tables order sizes so; by the number alone it was first)."""
    counts = [1_075_326_976, 11_700_000, 235_800_000, 42_300_000]
    names = [text.params(p) for p in counts]
    assert sorted(names, key=text.params_value) == [text.params(p) for p in sorted(counts)]
    assert all(abs(text.params_value(text.params(p)) / p - 1) < 5e-3 for p in counts)
