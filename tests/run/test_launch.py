"""dpbench.run.launch's one run in a fresh process: its record, or a failed one saying why."""
from dpbench.run.launch import record_of_fresh_run


def test_a_fresh_run_returns_its_record_and_a_refused_config_a_failed_one():
    ok = record_of_fresh_run({"variant": "dp", "gpus": 64}, timeout_s=120)   # no 64 GPUs: skipped, recorded
    assert ok["status"] == "skipped" and ok["variant"] == "dp"
    late = record_of_fresh_run({"variant": "single"}, timeout_s=0.01)
    assert late == {"status": "failed", "reason": "timed out after 0.01 s"}
