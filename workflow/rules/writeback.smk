# Recipe `writeback`: each fine-tuned tagging run's weights written into a copy of its encoder's graph,
# with its word pooling, head and tags appended: the whole tagger as one graph
# (results/writeback/<run>/pipeline.safetensors + pipeline.encoder0.onnx), then checked against the run's
# inline pipeline: hidden states and logits, UPOS agreement on the test split, and tagging speed.
# Rule file workflow/rules/writeback.smk; command `encoder-study writeback`
# (encoder_study.recipes.writeback.command); library encoder_study.recipes.writeback (over encoder_study.onnx.patch,
# encoder_study.onnx.names and encoder_study.recipes.tagging.pipeline).

from encoder_study.recipes.tagging.variants import Quantisation

WRITEBACK = config["writeback"]
# The upos runs: the write-back tables (agreement, speed) are UPOS's; another task's run is not written.
FINETUNED_RUNS = [r for r in RUN_NAMES if RUNS[r]["mode"] == "finetuned" and RUNS[r]["task"] == "upos"]
WRITEBACK_RUNS = FINETUNED_RUNS if WRITEBACK["runs"] is None else sorted(set(WRITEBACK["runs"]))
for _name in WRITEBACK_RUNS:
    if _name not in FINETUNED_RUNS:
        refuse_config(f"config: writeback.runs names '{_name}', which is not a fine-tuned tagging run "
                            f"(fine-tuned runs: {', '.join(FINETUNED_RUNS) or 'none'})")
# The runs the speed table times: the written-back runs but those of writeback.speed_skip (a name that
# is not among them is ignored: a config given over this one may have other runs).
SPEED_RUNS = [r for r in WRITEBACK_RUNS if r not in WRITEBACK["speed_skip"]]
if WRITEBACK_RUNS and not SPEED_RUNS:
    refuse_config(f"config: writeback.speed_skip skips every written-back run "
                        f"({', '.join(WRITEBACK_RUNS)}); the speed table needs one")


rule writeback_pipeline:
    input:
        inline=rules.tagging_train.output.pipeline,
        model=lambda wc: model_files(RUNS[wc.run]["model"]),
        code=lib_code("writeback", "pipeline"),
    output:
        pipeline="results/writeback/{run}/pipeline.safetensors",
        graph="results/writeback/{run}/pipeline.encoder0.onnx",
        prov=prov("writeback", "writeback_pipeline", "{run}"),
    params:
    threads: threads_for("writeback_pipeline")
    log:
        "logs/writeback/writeback_pipeline-{run}.log",
    benchmark:
        "results/benchmarks/writeback_pipeline/{run}.tsv"
    resources: **resources_of("writeback_pipeline")
    conda:
        CONDA_ENV
    shell:
        "encoder-study writeback pipeline --inline {input.inline:q} --out {output.pipeline:q}"
        " --threads {threads} --provenance {output.prov:q} > {log:q} 2>&1"


# Both pipelines of each run, the written graphs and the exports they reference: a table's inputs.
WRITEBACK_INPUTS_OF = lambda runs: {
    "inline": expand(rules.tagging_train.output.pipeline, run=runs),
    "written": expand(rules.writeback_pipeline.output.pipeline, run=runs),
    "graphs": expand(rules.writeback_pipeline.output.graph, run=runs),
    "models": sorted({f for r in runs for f in model_files(RUNS[r]["model"])}),
}


# `--run NAME INLINE WRITTEN` for each run, from the rule's inputs (in the runs' order): a params
# function of (wildcards, input).
WRITEBACK_RUN_OPTIONS_OF = lambda runs: lambda wc, input: " ".join(
    f"--run {shlex.quote(run)} {shlex.quote(inline)} {shlex.quote(written)}"
    for run, inline, written in zip(runs, input.inline, input.written, strict=True))
WRITEBACK_INPUTS = WRITEBACK_INPUTS_OF(WRITEBACK_RUNS)
WRITEBACK_RUN_OPTIONS = WRITEBACK_RUN_OPTIONS_OF(WRITEBACK_RUNS)


rule writeback_parity:
    input:
        **WRITEBACK_INPUTS,
        texts=rules.parity_select.output.texts,
        code=lib_code("writeback", "parity"),
    output:
        table=result("writeback_parity"),
        markdown="results/writeback/parity.md",
        prov=prov("writeback", "writeback_parity"),
    params:
        runs=WRITEBACK_RUN_OPTIONS,
    threads: threads_for("writeback_parity")
    log:
        "logs/writeback/writeback_parity.log",
    benchmark:
        "results/benchmarks/writeback_parity.tsv"
    resources: **resources_of("writeback_parity")
    conda:
        CONDA_ENV
    shell:
        "encoder-study writeback parity {params.runs} --texts {input.texts:q} --threads {threads}"
        " --out {output.table:q} --provenance {output.prov:q} > {log:q} 2>&1"


rule writeback_agreement:
    input:
        **WRITEBACK_INPUTS,
        test=TREEBANK["test"],
        code=lib_code("writeback", "agreement"),
    output:
        table=result("writeback_agreement"),
        markdown="results/writeback/agreement.md",
        predictions=expand("results/writeback/{run}/test.pred.conllu", run=WRITEBACK_RUNS),
        prov=prov("writeback", "writeback_agreement"),
    params:
        runs=WRITEBACK_RUN_OPTIONS,
        pred_dir=lambda wc, output: Path(output.table).parent,  # <pred-dir>/<run>/test.pred.conllu
        bootstrap=BOOTSTRAP,
    threads: threads_for("writeback_agreement")
    log:
        "logs/writeback/writeback_agreement.log",
    benchmark:
        "results/benchmarks/writeback_agreement.tsv"
    resources: **resources_of("writeback_agreement")
    conda:
        CONDA_ENV
    shell:
        "encoder-study writeback agreement {params.runs} --test {input.test:q} --pred-dir {params.pred_dir:q}"
        " {params.bootstrap} --threads {threads}"
        " --out {output.table:q} --provenance {output.prov:q} > {log:q} 2>&1"


rule writeback_speed:
    input:
        **WRITEBACK_INPUTS_OF(SPEED_RUNS),
        test=TREEBANK["test"],
        code=lib_code("writeback", "speed"),
    output:
        table=result("writeback_speed"),
        markdown="results/writeback/speed.md",
        prov=prov("writeback", "writeback_speed"),
    params:
        runs=WRITEBACK_RUN_OPTIONS_OF(SPEED_RUNS),
        threads=WRITEBACK["threads"],
        sentences=WRITEBACK["speed_sentences"],
        batch_pieces=WRITEBACK["speed_batch_pieces"],
        warmup=WRITEBACK["speed_warmup"],
        repeats=WRITEBACK["speed_repeats"],
        min_seconds=config["timing"]["min_seconds"],
    # Timed: locally every slot the workflow has, so that no other job runs beside it; on a cluster
    # the config's threads and a node of its own (common.smk, timed_threads).
    threads: timed_threads("writeback_speed", "writeback.threads")
    log:
        "logs/writeback/writeback_speed.log",
    benchmark:
        "results/benchmarks/writeback_speed.tsv"
    resources: **resources_of("writeback_speed")
    conda:
        CONDA_ENV
    shell:
        "encoder-study writeback speed {params.runs} --test {input.test:q} --sentences {params.sentences}"
        " --batch-pieces {params.batch_pieces} --warmup {params.warmup} --repeats {params.repeats}"
        " --min-seconds {params.min_seconds}"
        " --threads {params.threads} --out {output.table:q} --provenance {output.prov:q} > {log:q} 2>&1"


# The speed table as bars: a job of its own, so that a change to the plot times nothing again.
rule writeback_speed_plot:
    input:
        table=rules.writeback_speed.output.table,
        code=lib_code("writeback", "speed-plot"),
    output:
        plot=result("writeback_speed_plot"),
        prov=prov("writeback", "writeback_speed_plot"),
    log:
        "logs/writeback/writeback_speed_plot.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study writeback speed-plot --table {input.table:q} --out {output.plot:q}"
        " --provenance {output.prov:q} > {log:q} 2>&1"


# Int8 variants (issue 35): every written run's graph quantised by ONNX Runtime's quantize_dynamic, measured
# against the float32 graph on dev, test and the extra test sets, and published into <run>/int8/ only
# within writeback.quantisation's thresholds (else the folder stays empty and the table says why).
QUANTISATION = WRITEBACK["quantisation"]
QUANTISATION_SPLITS = {"dev": TREEBANK["dev"], "test": TREEBANK["test"], **EXTRA}


rule writeback_quantisation:
    input:
        written=expand(rules.writeback_pipeline.output.pipeline, run=WRITEBACK_RUNS),
        graphs=expand(rules.writeback_pipeline.output.graph, run=WRITEBACK_RUNS),
        models=WRITEBACK_INPUTS["models"],
        splits=list(QUANTISATION_SPLITS.values()),
        code=lib_code("writeback", "quantisation"),
    output:
        table=result("writeback_quantisation"),
        markdown="results/writeback/quantisation.md",
        variants=[directory(f"results/writeback/{run}/int8") for run in WRITEBACK_RUNS],
        prov=prov("writeback", "writeback_quantisation"),
    params:
        runs=lambda wc, input, output: " ".join(
            f"--run {shlex.quote(run)} {shlex.quote(written)} {shlex.quote(folder)}"
            for run, written, folder in zip(WRITEBACK_RUNS, input.written, output.variants, strict=True)),
        splits=" ".join(f"--split {shlex.quote(name)} {shlex.quote(path)}"
                        for name, path in QUANTISATION_SPLITS.items()),
        bootstrap=BOOTSTRAP,
        quantisation=flags(Quantisation, QUANTISATION, "quantisation"),
    threads: threads_for("writeback_quantisation")
    log:
        "logs/writeback/writeback_quantisation.log",
    benchmark:
        "results/benchmarks/writeback_quantisation.tsv"
    resources: **resources_of("writeback_quantisation")
    conda:
        CONDA_ENV
    shell:
        "encoder-study writeback quantisation {params.runs} {params.splits} {params.bootstrap}"
        " {params.quantisation} --threads {threads} --out {output.table:q}"
        " --provenance {output.prov:q} > {log:q} 2>&1"


rule writeback_quantisation_speed:
    input:
        **WRITEBACK_INPUTS_OF(SPEED_RUNS),
        table=rules.writeback_quantisation.output.table,
        test=TREEBANK["test"],
        code=lib_code("writeback", "quantisation-speed"),
    output:
        table=result("writeback_quantisation_speed"),
        markdown="results/writeback/quantisation_speed.md",
        prov=prov("writeback", "writeback_quantisation_speed"),
    params:
        runs=lambda wc, input: " ".join(f"--run {shlex.quote(run)} {shlex.quote(written)}"
                                        for run, written in zip(SPEED_RUNS, input.written, strict=True)),
        thread_counts=" ".join(str(n) for n in QUANTISATION["thread_counts"]),
        sentences=WRITEBACK["speed_sentences"],
        batch_pieces=WRITEBACK["speed_batch_pieces"],
        warmup=WRITEBACK["speed_warmup"],
        repeats=WRITEBACK["speed_repeats"],
        min_seconds=config["timing"]["min_seconds"],
    # Timed: every slot the workflow has locally (common.smk, timed_threads), as writeback_speed.
    threads: timed_threads("writeback_quantisation_speed", "writeback.threads")
    log:
        "logs/writeback/writeback_quantisation_speed.log",
    benchmark:
        "results/benchmarks/writeback_quantisation_speed.tsv"
    resources: **resources_of("writeback_quantisation_speed")
    conda:
        CONDA_ENV
    shell:
        "encoder-study writeback quantisation-speed {params.runs} --table {input.table:q} --test {input.test:q}"
        " --sentences {params.sentences} --batch-pieces {params.batch_pieces} --warmup {params.warmup}"
        " --repeats {params.repeats} --min-seconds {params.min_seconds} --thread-counts {params.thread_counts}"
        " --out {output.table:q} --provenance {output.prov:q} > {log:q} 2>&1"


if WRITEBACK_RUNS:
    # The runs' training fragments first: the recipe's PROVENANCE.md then shows where the weights came from.
    register("writeback", expand(rules.tagging_train.output.prov, run=WRITEBACK_RUNS)
             + expand(rules.writeback_pipeline.output.prov, run=WRITEBACK_RUNS)
             + [rules.writeback_parity.output.prov, rules.writeback_agreement.output.prov,
                rules.writeback_speed.output.prov, rules.writeback_speed_plot.output.prov,
                rules.writeback_quantisation.output.prov, rules.writeback_quantisation_speed.output.prov])


rule writeback:
    input:
        # Nothing to do when the config has no fine-tuned run.
        [rules.writeback_parity.output.table, rules.writeback_agreement.output.table,
         rules.writeback_speed.output.table, rules.writeback_speed_plot.output.plot,
         rules.writeback_quantisation.output.table, rules.writeback_quantisation_speed.output.table,
         recipe_target("writeback")] if WRITEBACK_RUNS else [],
