# Stage figures: the pipeline's figures, and the sharded variants' where the plan has sharded runs.

rule plots:
    input:
        *TABLES.values(),
    output:
        **{name: report(path, caption=f"../report/{name}.rst", category="Figures")
           for name, path in FIGURES.items()},
    log:
        str(RS.log_path("plots")),
    params:
        where=WHERE,
        **PY,
    conda:
        ENVFILE
    shell:
        "{params.py} -m dpbench.report.plots {params.where} > {log:q} 2>&1"


SHARDING = pipeline.sharding_files(PLAN)
if SHARDING:   # experiments with sharded runs only

    rule sharding:
        input:
            *TABLES.values(),
        output:
            **{name: report(path, caption="../report/sharding_figures.rst", category="Figures")
               for name, path in SHARDING.items() if name != "md"},
            md=SHARDING["md"],
        log:
            str(RS.log_path("sharding")),
        params:
            where=WHERE,
            **PY,
        conda:
            ENVFILE
        shell:
            "({params.py} -m dpbench.report.sharding_plots {params.where} && "
            "{params.py} -m dpbench.report.sharding_tables {params.where} --out {output.md:q}) > {log:q} 2>&1"
