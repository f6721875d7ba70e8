"""dp: nn.DataParallel, the loss computed on the gathered outputs (the usual recipe)."""
from dpbench.plan.variants._kin import NO_COMPILE_UNDER_DATAPARALLEL
from dpbench.plan.variants.spec import ALL_DEVICES_ONE_PROCESS, GLOBAL_MEAN, VariantSpec

SPEC = VariantSpec(
    name="dp", order=10, summary="`nn.DataParallel`, loss on the gathered logits (the usual recipe)",
    layout=ALL_DEVICES_ONE_PROCESS, wrapper="nn.DataParallel", runtime="data_parallel", loss=GLOBAL_MEAN,
    needs_cuda=True, compiles="", refuses=(NO_COMPILE_UNDER_DATAPARALLEL,))
