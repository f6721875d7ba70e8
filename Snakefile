# dpbench: single-device, DataParallel and DDP training of ResNet18 on CIFAR-10, measured.
#   snakemake --cores all                              the experiment in config.yaml
#   snakemake --cores all --config experiment=smoke    another one (experiments/*.yaml)
#   snakemake --cores all results/<tag>/runs/<run_id>/metrics.json --forcerun train   one run
#   dpbench report <tag>                               its HTML report (snakemake --report, the set's config)
#   snakemake --cores 1 compare --config baseline=<tag> candidate=<tag>
#   snakemake --cores all --config experiment=upgrade base=/venv-a/bin/python cand=/venv-b/bin/python
#   snakemake --cores 1 compare --config paired=<tag>            the environments of one paired launch
# The logic lives in the dpbench package (src/dpbench); rules/*.smk only call it, one file a stage.
from snakemake.utils import min_version

min_version("8.0")

configfile: "config.yaml"


include: "rules/common.smk"


# Under a cluster executor these read and write small files: no queue wait for them.
localrules: all, plan, collect, plots, summary, claims, compare


rule all:
    input:
        pipeline.final_targets(PLAN),
    default_target: True


include: "rules/plan.smk"
include: "rules/train.smk"
include: "rules/collect.smk"
include: "rules/figures.smk"
include: "rules/report.smk"
include: "rules/claims.smk"
include: "rules/compare.smk"
