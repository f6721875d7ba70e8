"""A token workload's result set speaks in tokens/s: the headline, the medians table and the
throughput figure's axis; never "n/a images/s" for a run that has a throughput."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from conftest import run_engine  # noqa: E402

from dpbench import results  # noqa: E402
from dpbench.analysis import collect  # noqa: E402
from dpbench.report import plots, summarize  # noqa: E402

LM = {"name": "transformer-lm", "args": {"width": 32, "layers": 2, "heads": 2, "seq_len": 16, "vocab": 64}}


def test_a_token_workload_is_summarised_in_tokens_per_second(tmp_path):
    tag = "lm-units"
    runs = results.runs_dir(tmp_path, tag)
    for repeat in (0, 1):
        run_engine(runs / f"single-g1-r{repeat}", variant="single", repeat=repeat, workload=LM,
                   global_batch=4, synthetic_size=24, max_steps=4, warmup_steps=1)
    collect.collect(tmp_path, tag)
    summary = results.read_table(tmp_path, tag, "summary")
    assert set(summary["rate_unit"]) == {"tokens/s"}
    # tokens/s = samples/s x the sequence length
    assert (summary["rate"] == summary["samples_per_s"] * 16).all() and summary["images_per_s"].isna().all()
    text = summarize.render_summary(tmp_path, tag)
    assert "n/a images/s" not in text
    headline = next(line for line in text.splitlines() if line.startswith("- single on"))
    assert "tokens/s" in headline and "images/s" not in headline
    fig = plots.plot_throughput(plots.load_tables(tmp_path, tag))
    assert [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel()] == ["tokens/s"]


def test_compare_judges_a_token_workloads_throughput_in_tokens_per_second(tmp_path):
    from dpbench.analysis import compare
    from dpbench.report import compare_report
    for tag in ("a", "b"):
        runs = results.runs_dir(tmp_path, tag)
        for repeat in (0, 1):
            run_engine(runs / f"single-g1-r{repeat}", variant="single", repeat=repeat, workload=LM,
                       global_batch=4, synthetic_size=16, max_steps=3, warmup_steps=1)
        collect.collect(tmp_path, tag)
    report = compare.compare(tmp_path, "a", "b")
    assert report["throughput_unit"] == "tokens/s"
    assert len(report["throughput"]) == 1   # before, a token workload had no images/s to compare
    assert "Throughput (tokens/s" in compare_report.render_markdown(report)
