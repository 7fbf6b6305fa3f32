# Regenerates every table of the encoder study. Default: the embedded config (offline, 2 cores, minutes).
# Full study: snakemake --cores 8 all --configfile config/paper.yaml
import re

from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config/config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/export.smk"
include: "workflow/rules/parity.smk"
include: "workflow/rules/student.smk"
include: "workflow/rules/tagging.smk"
include: "workflow/rules/writeback.smk"
include: "workflow/rules/retrieval.smk"
include: "workflow/rules/provenance.smk"


wildcard_constraints:
    model="|".join(re.escape(m) for m in MODELS),
    recipe="|".join(sorted(RECIPES)),
    run="|".join(re.escape(r) for r in RUN_NAMES),


rule all:
    default_target: True
    input:
        rules.export.input,
        rules.parity.input,
        rules.tagging.input,
        rules.writeback.input,
        rules.retrieval.input,
        rules.student.input,
