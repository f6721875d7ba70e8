from dpbench import reference, results


def _run(root, rid, sha):
    results.write_json(root / "runs" / rid / results.METRICS,
                       {"run_id": rid, "status": "ok", "provenance": {"git_sha": sha}})
    results.write_csv(root / "runs" / rid / results.STEPS, ["step"], [{"step": 0}])


def test_a_reference_from_a_dirty_tree_is_refused(tmp_path, capsys):
    src = tmp_path / "results" / "t"
    _run(src, "single-g1-r0", "a" * 40)
    _run(src, "ddp-g2-r0", "a" * 40 + "+dirty")
    assert reference.main([str(src), str(tmp_path / "ref")]) == 2
    err = capsys.readouterr().err
    assert "ddp-g2-r0" in err and "clean commit" in err and "single-g1-r0" not in err
    assert not (tmp_path / "ref").exists()


def test_a_commit_may_be_named_as_git_abbreviates_it(tmp_path, capsys):
    src = tmp_path / "results" / "t"
    _run(src, "single-g1-r0", "2951eab")               # DPBENCH_GIT_SHA=$(git rev-parse --short HEAD)
    assert reference.main([str(src), str(tmp_path / "ref")]) == 0
    for rid, sha in (("dp-g1-r0", "2951eab+dirty"), ("ddp-g1-r0", "abc"), ("dp_sum-g1-r0", "n/a")):
        _run(src, rid, sha)
    assert reference.main([str(src), str(tmp_path / "ref2")]) == 2
    err = capsys.readouterr().err
    assert all(rid in err for rid in ("dp-g1-r0", "ddp-g1-r0", "dp_sum-g1-r0")) and "single-g1-r0" not in err


def test_a_clean_reference_keeps_records_and_packs_logs(tmp_path):
    src = tmp_path / "results" / "t"
    _run(src, "single-g1-r0", "b" * 40)
    (src / "summary.md").write_text("# s\n")
    (src / "logs").mkdir()
    (src / "logs" / "single-g1-r0.log").write_text("log\n")
    (src / "runs" / "single-g1-r0" / "model.pt").write_bytes(b"x" * 1000)
    assert reference.main([str(src), str(tmp_path / "ref")]) == 0
    ref = tmp_path / "ref"
    assert (ref / "runs" / "single-g1-r0" / results.METRICS).exists()
    assert (ref / "summary.md").exists() and (ref / "logs.tar.gz").exists()
    assert not (ref / "runs" / "single-g1-r0" / "model.pt").exists() and not (ref / "logs").exists()
