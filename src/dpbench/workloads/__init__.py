"""Workloads: what a run trains. A workload is a factory returning a `spec.WorkloadSpec` (the
model, a per-sample loss, a seeded synthetic batch maker, the blocks a sharded variant wraps);
`registry` finds factories by name (built-ins, the `dpbench.workloads` entry points) or by
path, and imports them only when it builds one. This package's __init__ imports nothing, so
that `dpbench.workloads.registry` stays torch-free for the planning."""
