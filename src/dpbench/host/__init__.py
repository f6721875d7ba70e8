"""Small facts about the host, without torch: NVML's view of the GPUs, the GPU lock files, the
project's source as git knows it."""

# The pipeline's process (Snakemake's pid): plan.pipeline names it, run.watchdog watches it.
PIPELINE_PID_ENV = "DPBENCH_PIPELINE_PID"
