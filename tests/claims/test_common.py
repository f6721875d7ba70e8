"""The probes' helpers: a subprocess that times out."""




def test_a_probe_subprocess_that_times_out_is_one_part_not_the_record(monkeypatch):
    from dpbench.claims import common
    monkeypatch.setattr(common, "TIMEOUT_S", 1)
    r = common.run_python("import time; time.sleep(30)")
    assert r == {"rc": 124, "stderr_tail": ["timed out after 1 s"]}
