# Stage claims: the probes (one record a claim) and the ledger over them and the tables.

rule probe:
    input:
        # C1 and C7 measure at the batches and widths their groups train with. A new plan.json
        # reruns a probe only when those settings change (not for a new count of GPUs).
        plan=ancient(str(RS.plan_path)),
    output:
        str(RS.probe_path("{claim}")),
    log:
        str(RS.log_path("probe-{claim}")),
    params:
        groups=PLAN.groups_digest(),
        **PY,
    resources:
        gpu=PLAN.gpus_visible,   # probes start CUDA their own way: alone on the machine
    conda:
        ENVFILE
    shell:
        "{params.py} -m dpbench.claims.probe {wildcards.claim:q} --out {output:q} --plan {input.plan:q} "
        "> {log:q} 2>&1"


rule claims:
    input:
        *TABLES.values(),
        str(RS.provenance_path),
        pipeline.probe_files(PLAN),
        *FIGURES.values(),   # claims.md links some of them
        plan=ancient(str(RS.plan_path)),   # the groups as planned here, --config overrides included
    output:
        md=report(str(RS.claims_md), caption="../report/claims.rst", category="Claims"),
        json=str(RS.claims_json),
        figures=[report(path, caption="../report/claim_figures.rst", category="Claims")
                 for path in pipeline.claim_figure_files(PLAN).values()],
    log:
        str(RS.log_path("claims")),
    params:
        where=WHERE,
        groups=PLAN.groups_digest(),
        **PY,
    conda:
        ENVFILE
    shell:
        "{params.py} -m dpbench.claims.ledger {params.where} --plan {input.plan:q} > {log:q} 2>&1"
