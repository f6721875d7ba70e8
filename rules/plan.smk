# Stage plan: the plan as made here, written to results/<tag>/plan.json.

rule plan:
    # The plan as made here (groups -> run configs -> run ids, the CPU plan's substitutions, the
    # GPUs planned for): the probes and the ledger read it instead of resolving settings again.
    output:
        str(RS.plan_path),
    log:
        str(RS.log_path("plan")),
    params:
        plan=PLAN.plan_json(),   # a new plan (--config, other GPUs) rewrites it
    run:
        Path(output[0]).write_text(params.plan)
        Path(log[0]).write_text(f"wrote {output[0]}\n")
