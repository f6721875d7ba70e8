"""C1's probe: the largest-batch search per variant, with the experiment's batch and widths."""
import json
import re

from dpbench.claims import settings
from dpbench.claims.c1 import probe as c1_probe
from dpbench.plan.matrix import read_plan

from claims.planted import PLANNED, cpu_only, RAN_ON_GPU


@cpu_only
def test_max_batch_search_without_cuda_says_what_it_needs(capsys):
    assert c1_probe.main(["--variant", "dp", "--classes", "10", "32768"]) == 0
    assert re.findall(r"\d+", json.loads(capsys.readouterr().out)["skipped"]) == ["2", "0"]   # needed, found


def test_c1_probe_passes_every_variant_the_experiments_batch_and_widths(monkeypatch):
    from dpbench.claims import common
    calls = []

    def variant_json(module, variant, *args):
        calls.append((module.rsplit(".", 1)[1], variant, args))
        if module.endswith("c1.probe"):
            return {"variant": variant, "gpus": 2, "cap_gib": 8.0, "gpu_name": "H200", "per_classes": {
                w: {"largest": 1024, "smallest_failing": 1056, "trials": [[1024, True]], "peak_mib_per_device": [1]}
                for w in args[args.index("--classes") + 1:]}}, None
        return {"variant": variant, "gpus": 2, "batch": 2048, "per_gpu_batch": 2048, "per_classes": {}}, None

    monkeypatch.setattr(c1_probe, "gpus_visible", lambda: 2)
    monkeypatch.setattr(common, "ran_on", lambda: RAN_ON_GPU)
    monkeypatch.setattr(c1_probe, "variant_json", variant_json)
    rec = c1_probe.run(**settings.probe_settings("C1", read_plan(PLANNED)))
    searches = [a for m, _, a in calls if m == "probe"]
    snapshots = [a for m, _, a in calls if m == "attribution"]
    assert searches == [("--classes", "10", "32768")] * len(c1_probe.VARIANTS)
    assert snapshots == [("--batch", "2048", "--classes", "10", "32768")] * len(c1_probe.VARIANTS)
    assert {o.id for o in rec.observations} == {f"c1.max_batch.{v}.out{w}" for v in c1_probe.VARIANTS
                                                for w in (10, 32768)}
