# Stage compare: the regression check of two result sets, or of one paired launch.

rule compare:
    # No outputs: always runs when asked for, and its exit status is the verdict (with
    # compare.fail_on_regression) while the report it writes stays in place.
    log:
        str(pipeline.compare_log(config)),
    params:
        args=lambda w: pipeline.compare_args(config, PLAN.tag),
        **PY,
    conda:
        ENVFILE
    shell:
        "set -o pipefail; {params.py} -m dpbench.compare_cli {params.args} 2>&1 | tee {log:q}"
