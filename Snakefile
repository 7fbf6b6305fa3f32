# Regenerates every table of the encoder study. Default: the embedded config (offline, 2 cores, minutes).
# Full study: snakemake --cores 8 all --configfile config/paper.yaml
import re
import sys
from pathlib import Path

import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config/config.yaml"


# Each mistake in the config in one line (the key's path, what is wrong, the fix): jsonschema's own
# messages print the whole schema for an unknown nested key. Then `validate` fills the defaults.
sys.path.insert(0, str(Path(workflow.basedir) / "workflow" / "lib"))
from encoder_study.core.config_check import problems as config_problems
from encoder_study.core.config_check import refuse as refuse_config

_SCHEMA = Path(workflow.basedir, "workflow/schemas/config.schema.yaml")
_PROBLEMS = config_problems(config, yaml.safe_load(_SCHEMA.read_text(encoding="utf-8")))
if _PROBLEMS:
    refuse_config(*_PROBLEMS)
validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"


# config/rehearsal.yaml: before the rule files that read the models and corpora, which it swaps.
if config["rehearsal"]["enabled"]:

    include: "workflow/rules/rehearsal.smk"


include: "workflow/rules/export.smk"
include: "workflow/rules/parity.smk"
include: "workflow/rules/student.smk"
include: "workflow/rules/tagging.smk"
include: "workflow/rules/writeback.smk"
include: "workflow/rules/retrieval.smk"
include: "workflow/rules/provenance.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/benchmarks.smk"
include: "workflow/rules/preflight.smk"


# A per-rule key naming no rule that reads it would be ignored without a word (a typo, a rule renamed
# since, or a rule that runs on the submitting host with fixed threads): common.smk's CONFIGURED.
for _section in ("threads", "resources"):
    for _key in sorted(set(config[_section]) - {"default"} - CONFIGURED[_section]):
        if _key in {r.name for r in workflow.rules}:
            refuse_config(f"config: {_section}.{_key}: rule {_key} takes no {_section} from the "
                                f"config; those that do: {', '.join(sorted(CONFIGURED[_section]))}")
        refuse_config(f"config: {_section}.{_key} names no rule of the workflow; rules are named "
                            "<recipe>_<step> (see the README's recipe table)")


# Run on the host that runs Snakemake, never as cluster jobs: downloads (compute nodes often have no
# internet), joins, tables and checks (seconds each; not worth a queue slot).
localrules:
    all,
    export,
    export_acquire,
    export_table,
    parity,
    parity_fetch,
    parity_select,
    parity_table_inference,
    parity_table_trainable,
    parity_table_latency,
    student,
    student_stage,
    tagging,
    tagging_tables,
    tagging_task_tables,
    tagging_per_tag,
    writeback,
    writeback_speed_plot,
    retrieval,
    retrieval_acquire,
    retrieval_verify,
    provenance_join,
    provenance_crate,
    verify,


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
        rules.export_table.output,  # every export's row needs the student and retrieval
        REPORT_PAGES,  # the tables as HTML, and the run's recorded settings, for snakemake --report
        REPORT_LANDING,  # the report's landing page: after the crate, whose digest it shows
        rules.provenance_crate.output.crate,  # the run's Workflow Run RO-Crate, from every fragment
        # config/rehearsal.yaml: every rule's measured peak beside its resources, once every rule ran
        [rules.rehearsal_resources.output.table] if config["rehearsal"]["enabled"] else [],
