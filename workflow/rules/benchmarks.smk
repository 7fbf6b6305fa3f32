# Recipe `benchmarks` (not part of `all`): one exported model's paths timed against the machine's
# matrix-multiply rate and against their references. Command: `encoder-study benchmarks encoders`
# (encoder_study.recipes.benchmarks.command). Library: encoder_study.recipes.benchmarks.benchmarks, encoder_study.encoders.perf.

BENCHMARKS = config["benchmarks"]
# The model timed: the config's, or the study's own (the student's teacher), so that the full study
# times its own encoder without a key of its own.
BENCHMARK_MODEL = BENCHMARKS["model"] or config["student"]["teacher"]
if BENCHMARK_MODEL not in MODEL_SPECS:
    refuse_config(f"config: benchmarks.model '{BENCHMARK_MODEL}' is not in `models` "
                        f"(it has: {', '.join(MODELS)})")


rule benchmarks_encoders:
    input:
        model=model_files(BENCHMARK_MODEL),
        code=lib_code("benchmarks", "encoders"),
    output:
        table="results/benchmarks/encoders.csv",
        markdown="results/benchmarks/encoders.md",
        prov=prov("benchmarks", "benchmarks_encoders"),
    params:
        model_dir=lambda wc, input: Path(input.model[0]).parent,
        source=lambda wc, input: input.model[-1],
        threads=BENCHMARKS["threads"],
        batch=BENCHMARKS["batch"],
        seq_len=BENCHMARKS["seq_len"],
        rows=BENCHMARKS["rows"],
        length=BENCHMARKS["length"],
        docs=BENCHMARKS["docs"],
        seed=BENCHMARKS["seed"],
        min_seconds=config["timing"]["min_seconds"],
    # Timed: locally every slot the workflow has, so that no other job runs beside it; on a cluster
    # the config's threads and a node of its own (common.smk, timed_threads).
    threads: timed_threads("benchmarks_encoders", "benchmarks.threads")
    log:
        "logs/benchmarks/benchmarks_encoders.log",
    resources: **resources_of("benchmarks_encoders")
    conda:
        CONDA_ENV
    shell:
        "encoder-study benchmarks encoders --model-dir {params.model_dir:q} --source {params.source:q}"
        " --threads {params.threads} --batch {params.batch} --seq-len {params.seq_len} --rows {params.rows}"
        " --length {params.length} --docs {params.docs} --seed {params.seed}"
        " --min-seconds {params.min_seconds} --out {output.table:q} --provenance {output.prov:q}"
        " > {log:q} 2>&1"


# The retrieval graph, float32 and its int8 variant (as retrieval_quantisation gated it), in texts and
# tokens per second at benchmarks.retrieval_threads, beside the GEMM probe.
rule benchmarks_retrieval:
    input:
        model=rules.retrieval_export.output.model,
        table=rules.retrieval_quantisation.output.table,
        texts=rules.parity_select.output.texts,
        code=lib_code("benchmarks", "retrieval"),
    output:
        table="results/benchmarks/retrieval.csv",
        markdown="results/benchmarks/retrieval.md",
        prov=prov("benchmarks", "benchmarks_retrieval"),
    params:
        batch=BENCHMARKS["batch"],
        thread_counts=" ".join(str(n) for n in BENCHMARKS["retrieval_threads"]),
        min_seconds=config["timing"]["min_seconds"],
    # Timed: every slot the workflow has locally (common.smk, timed_threads).
    threads: timed_threads("benchmarks_retrieval", "benchmarks.threads")
    log:
        "logs/benchmarks/benchmarks_retrieval.log",
    resources: **resources_of("benchmarks_retrieval")
    conda:
        CONDA_ENV
    shell:
        "encoder-study benchmarks retrieval --model-dir {input.model:q} --table {input.table:q}"
        " --texts {input.texts:q} --batch {params.batch} --thread-counts {params.thread_counts}"
        " --min-seconds {params.min_seconds} --out {output.table:q} --provenance {output.prov:q} > {log:q} 2>&1"


register("benchmarks", [rules.benchmarks_encoders.output.prov, rules.benchmarks_retrieval.output.prov])


rule benchmarks:
    input:
        rules.benchmarks_encoders.output.table,
        rules.benchmarks_retrieval.output.table,
        recipe_target("benchmarks"),
