"""The probe harness: GPU probes on the CPU, the command line, the plan it reads."""

import pytest

from dpbench import results
from dpbench.claims import NOT_RUN, REFUTED, probe, settings
from dpbench.claims.c1 import probe as c1_probe
from dpbench.claims.c2 import probe as c2_probe
from dpbench.claims.c3 import probe as c3_probe
from dpbench.claims.c5 import probe as c5_probe
from dpbench.claims.c7 import probe as c7_probe
from dpbench.claims.records import ProbeRecord
from dpbench.plan.matrix import Plan, read_plan
from dpbench.plan.pipeline import load_experiment

from claims.planted import ROOT, PLANNED, cpu_only


@cpu_only
@pytest.mark.parametrize("module", [c1_probe, c2_probe, c5_probe, c7_probe])
def test_gpu_probes_report_not_measured_on_cpu(module):
    claim = next(c for c, name in probe.MODULES.items() if module.__name__.endswith("." + name))
    rec = module.run(**settings.probe_settings(claim, read_plan(PLANNED)))
    assert rec.verdict == NOT_RUN == "not measured here"
    assert rec.not_run.startswith("needs ") and "(found 0)" in rec.not_run
    assert rec.ran_on["device_type"] == "cpu" and rec.ran_on["gpus_visible"] == 0


def test_probe_cli_writes_the_record_with_observations_under_ids(tmp_path, capsys):
    out = tmp_path / "claims" / "C3.json"
    probe.main(["C3", "--out", str(out)])
    raw = results.read_json(out)
    assert "c3.cpu.zero_grad" in raw["observations"] and raw["observation_order"][0] == "c3.cpu.construction"
    rec = ProbeRecord.from_json(raw)
    assert rec.claim == "C3" and rec.verdict == REFUTED and capsys.readouterr().out.startswith("C3: refuted")
    assert [o.id for o in rec.observations] == raw["observation_order"]


def test_probe_cli_reads_the_plan_the_pipeline_writes(tmp_path, monkeypatch):
    got = {}
    monkeypatch.setattr(c7_probe, "run", lambda **kw: got.update(kw) or c3_probe.run())
    path = tmp_path / "plan.json"
    path.write_text(Plan(load_experiment({"experiment": "claims"}, ROOT), 2).plan_json())   # the plan rule's output
    probe.main(["C7", "--out", str(tmp_path / "C7.json"), "--plan", str(path)])
    assert got == {"batches": [512, 8192]}
    rule = (ROOT / "rules" / "claims.smk").read_text().split("rule probe:")[1].split("rule ")[0]
    assert "--plan {input.plan:q}" in rule and "RS.plan_path" in rule   # quoted, as every rule argument
