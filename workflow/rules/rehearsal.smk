# Recipe `rehearsal` (config/rehearsal.yaml over config/paper.yaml): the full study at full size on one CPU
# machine, with random twins of the models and local stand-ins of the streamed corpora; it ends with each
# rule's measured peak memory and time beside its `resources` (results/rehearsal/resources.csv), and
# refuses a mem_mb below its peak. Rule file workflow/rules/rehearsal.smk (included by the Snakefile after
# common.smk, before the rule files that read the sources, when rehearsal.enabled); command
# `encoder-study rehearsal streams|resources` (encoder_study.recipes.rehearsal.command); library
# encoder_study.recipes.rehearsal.

REHEARSAL = config["rehearsal"]
REHEARSAL_STREAMS = "results/rehearsal/streams"

# What merging config files cannot say. paper.yaml's retrieval model is a Hub entry: a twin merged into
# it would keep the entry's repo and revision, so rehearsal.retrieval_model replaces it whole.
if REHEARSAL.get("retrieval_model"):
    config["retrieval"]["model"] = REHEARSAL["retrieval_model"]

# paper.yaml's streams (a list of every language) stay as they are; each is read from its stand-ins,
# which rule rehearsal_streams writes (student_corpus_inputs names them as student_stage's inputs).
STAND_IN_STREAMS = STUDENT_CFG["corpus"]["streams"] if STUDENT_CFG["corpus"]["source"] == "stream" else []
for _stream in STAND_IN_STREAMS:
    _stream["local"] = f"{REHEARSAL_STREAMS}/{_stream['dataset']}"  # owner/name: two folders

# A table and generated text: on the submitting host, as the Snakefile's localrules.
localrules:
    rehearsal_resources,


if STAND_IN_STREAMS:

    localrules:
        rehearsal_streams,

    rule rehearsal_streams:
        input:
            code=lib_code("rehearsal", "streams"),
        output:
            streams=student_corpus_inputs(None),
            prov=prov("rehearsal", "rehearsal_streams"),
        params:
            streams=json.dumps(STAND_IN_STREAMS, sort_keys=True),
            documents=REHEARSAL["streams"]["documents"],
            words=REHEARSAL["streams"]["words"],
            seed=REHEARSAL["streams"]["seed"],
        log:
            "logs/rehearsal/rehearsal_streams.log",
        resources: **resources_of("rehearsal_streams")
        conda:
            CONDA_ENV
        shell:
            "encoder-study rehearsal streams --streams {params.streams:q}"
            " --documents {params.documents} --words {params.words} --seed {params.seed}"
            " --provenance {output.prov:q} > {log:q} 2>&1"


rule rehearsal_resources:
    input:
        # Every other target of `all`: the table is made once every rule has run.
        done=lambda wc: [f for f in rules.all.input if not f.startswith("results/rehearsal/")],
        code=lib_code("rehearsal", "resources"),
    output:
        table=result("rehearsal_resources"),
        markdown="results/rehearsal/resources.md",
        prov=prov("rehearsal", "rehearsal_resources"),
    params:
        # rule -> {mem_mb, runtime} as the config's `resources` give them, for every rule
        requests=lambda wc: json.dumps({r.name: {k: resources_for(r.name, k) for k in ("mem_mb", "runtime")}
                                        for r in workflow.rules}, sort_keys=True),
        margin=REHEARSAL["margin"],
        below_margin=REHEARSAL["below_margin"],
        configs=lambda wc: ", ".join(str(f) for f in workflow.configfiles) or "the config",
    log:
        "logs/rehearsal/rehearsal_resources.log",
    resources: **resources_of("rehearsal_resources")
    conda:
        CONDA_ENV
    shell:
        "encoder-study rehearsal resources --requests {params.requests:q} --provenance-root provenance"
        " --benchmarks results/benchmarks --margin {params.margin} --below-margin {params.below_margin}"
        " --config-name {params.configs:q} --out {output.table:q} --markdown {output.markdown:q}"
        " --provenance {output.prov:q} > {log:q} 2>&1"
        # A request below the margin, warned: shown in Snakemake's own output, not only in the log.
        "; grep '^WARNING: ' {log:q} >&2 || true"
