"""dp_sum: nn.DataParallel, each replica returns its summed loss, divided by the global batch
(the fix of dp_mean's bias)."""
from dpbench.plan.variants._kin import NO_COMPILE_UNDER_DATAPARALLEL
from dpbench.plan.variants.spec import ALL_DEVICES_ONE_PROCESS, REPLICA_SUMS_OVER_BATCH, VariantSpec

SPEC = VariantSpec(
    name="dp_sum", order=30,
    summary="`nn.DataParallel`, each replica returns its summed loss, divided by the global batch (the fix)",
    layout=ALL_DEVICES_ONE_PROCESS, wrapper="nn.DataParallel", runtime="data_parallel",
    loss=REPLICA_SUMS_OVER_BATCH, needs_cuda=True, compiles="", refuses=(NO_COMPILE_UNDER_DATAPARALLEL,))
