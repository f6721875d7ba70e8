# Stage train: one run, by the launcher, with the settings and ids its plan gave it.

rule train:
    output:
        str(RS.metrics_path("{run_id}")),
    log:
        str(RS.log_path("{run_id}")),
    params:
        run=lambda w: PLAN.run_json(w.run_id),
        identity=lambda w: PLAN.identity_json(w.run_id),   # the plan's ids, which the record copies
        env=lambda w: pipeline.run_fingerprint(PLAN, w.run_id, ENV),   # a new torch, CUDA or GPU reruns it
        out=lambda w: str(RS.run_dir(w.run_id)),   # the run folder, as the plan names the run
        lease=["--lease", "--exclusive"] if config["exclusive_timing"] else ["--lease"],
        planned=PLAN.gpus_visible,   # the launcher skips what the plan skips, on any machine
        py=RUN_PY,
    priority: lambda w: PLAN.priority_for(w.run_id)   # a paired launch's runs start in ABBA order
    resources:
        gpu=lambda w: PLAN.gpus_for(w.run_id),
        cpu_timing=lambda w: PLAN.cpu_timing_for(w.run_id),
    threads: lambda w: PLAN.threads_for(w.run_id)
    conda:
        ENVFILE
    shell:
        "{params.py} -m dpbench.run.launch --config {params.run:q} --identity {params.identity:q} --out {params.out:q} "
        "{params.lease:q} --planned-gpus {params.planned:q} --log {log:q}"
