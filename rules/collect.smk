# Stage collect: the runs' records joined with plan.json into the tidy tables, runs.csv and cells.csv.

rule collect:
    input:
        runs=[str(RS.metrics_path(run_id)) for run_id in sorted(PLAN.runs)],
        # the set's experiment and config: a damaged run's "rerun it" names them (plan.json's `given`).
        # Not ancient(): with ancient(), a plan.json that must be rewritten (a changed config) left
        # collect, and with it the training, out of Snakemake 9.27's DAG (tests/workflow/test_stopping.py).
        plan=str(RS.plan_path),
    output:
        *TABLES.values(),
        provenance=str(RS.provenance_path),
    log:
        str(RS.log_path("collect")),
    params:
        where=WHERE,
        **PY,
    conda:
        ENVFILE
    shell:
        "{params.py} -m dpbench.analysis.collect {params.where} --plan {input.plan:q} --print {input.runs:q} > {log:q} 2>&1"
