"""dp_mean: nn.DataParallel, each replica returns its mean loss and the vector is averaged (the
article's way: biased when the batch splits unevenly)."""
from dpbench.plan.variants._kin import NO_COMPILE_UNDER_DATAPARALLEL
from dpbench.plan.variants.spec import ALL_DEVICES_ONE_PROCESS, REPLICA_MEANS_MEAN, VariantSpec

SPEC = VariantSpec(
    name="dp_mean", order=20,
    summary="`nn.DataParallel`, each replica returns its mean loss, the vector is averaged (the article's way)",
    layout=ALL_DEVICES_ONE_PROCESS, wrapper="nn.DataParallel", runtime="data_parallel", loss=REPLICA_MEANS_MEAN,
    needs_cuda=True, compiles="", refuses=(NO_COMPILE_UNDER_DATAPARALLEL,))
