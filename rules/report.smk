# Stage report: summary.md, and the perf experiment's targets.

rule summary:
    input:
        *TABLES.values(),
        str(RS.provenance_path),
        # the start-up and mechanism sections read the runs' records
        runs=[str(RS.metrics_path(run_id)) for run_id in sorted(PLAN.runs)],
    output:
        report(str(RS.summary_md), caption="../report/summary_table.rst", category="Summary"),
    log:
        str(RS.log_path("summary")),
    params:
        where=WHERE,
        **PY,
    conda:
        ENVFILE
    shell:
        "{params.py} -m dpbench.report.summarize {params.where} > {log:q} 2>&1"


if pipeline.perf_target_files(PLAN):   # the perf experiment only: its targets name its cells

    rule perf_targets:
        input:
            *TABLES.values(),
            str(RS.provenance_path),
        output:
            **pipeline.perf_target_files(PLAN),
        log:
            str(RS.log_path("perf_targets")),
        params:
            where=str(RS.dir),
            **PY,
        conda:
            ENVFILE
        shell:
            "{params.py} -m dpbench.cli perf-targets {params.where:q} --md {output.md:q} --json {output.json:q} "
            "--figure {output.figure:q} --sweep-figure {output.sweep_figure:q} > {log:q} 2>&1"
