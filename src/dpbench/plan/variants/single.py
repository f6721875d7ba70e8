"""single: the model on one device, the baseline every variant is compared with."""
from dpbench.plan.variants.spec import GLOBAL_MEAN, ONE_DEVICE, VariantSpec

SPEC = VariantSpec(
    name="single", order=0, summary="one device",
    layout=ONE_DEVICE, wrapper="", runtime="plain", loss=GLOBAL_MEAN)
