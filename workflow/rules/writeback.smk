# Recipe `writeback`: each fine-tuned tagging run's weights written into a copy of its encoder's graph
# (results/writeback/<run>/pipeline.safetensors + pipeline.encoder0.onnx), then checked against the run's
# inline pipeline: hidden states, UPOS agreement on the test split, and tagging speed.
# Library: encoder_study.written (over encoder_study.writeback and encoder_study.tagging.pipeline).

WRITEBACK = config["writeback"]
FINETUNED_RUNS = [r for r in RUN_NAMES if RUNS[r]["mode"] == "finetuned"]
WRITEBACK_RUNS = FINETUNED_RUNS if WRITEBACK["runs"] is None else sorted(set(WRITEBACK["runs"]))
for _name in WRITEBACK_RUNS:
    if _name not in FINETUNED_RUNS:
        raise WorkflowError(f"config: writeback.runs names '{_name}', which is not a fine-tuned tagging run "
                            f"(fine-tuned runs: {', '.join(FINETUNED_RUNS) or 'none'})")

# Both pipelines of every run, the written graphs and the exports they reference: the tables' inputs.
WRITEBACK_INPUTS = {
    "inline": [f"results/tagging/{r}/pipeline.safetensors" for r in WRITEBACK_RUNS],
    "written": [f"results/writeback/{r}/pipeline.safetensors" for r in WRITEBACK_RUNS],
    "graphs": [f"results/writeback/{r}/pipeline.encoder0.onnx" for r in WRITEBACK_RUNS],
    "models": sorted({f for r in WRITEBACK_RUNS for f in model_files(RUNS[r]["model"])}),
}
WRITEBACK_PAIRS = " ".join(f"--run {r} results/tagging/{r}/pipeline.safetensors "
                           f"results/writeback/{r}/pipeline.safetensors" for r in WRITEBACK_RUNS)


rule writeback_pipeline:
    input:
        inline="results/tagging/{run}/pipeline.safetensors",
        model=lambda wc: model_files(RUNS[wc.run]["model"]),
        code=lib_code("written"),
    output:
        pipeline="results/writeback/{run}/pipeline.safetensors",
        graph="results/writeback/{run}/pipeline.encoder0.onnx",
        prov=prov("writeback", "writeback_pipeline", "{run}"),
    params:
        threads=threads_for("writeback_pipeline"),
    threads: slots_for("writeback_pipeline")
    log:
        "logs/writeback/writeback_pipeline-{run}.log",
    benchmark:
        "results/benchmarks/writeback_pipeline/{run}.tsv"
    resources:
        mem_mb=resources_for("writeback_pipeline", "mem_mb"),
        runtime=resources_for("writeback_pipeline", "runtime"),
    conda:
        CONDA_ENV
    shell:
        "encoder-study written pipeline --inline {input.inline:q} --out {output.pipeline:q}"
        " --threads {params.threads} --provenance {output.prov:q} > {log:q} 2>&1"


rule writeback_parity:
    input:
        **WRITEBACK_INPUTS,
        texts="results/texts/parity_texts.jsonl",
        code=lib_code("written"),
    output:
        table="results/writeback/parity.csv",
        markdown="results/writeback/parity.md",
        prov=prov("writeback", "writeback_parity"),
    params:
        runs=WRITEBACK_PAIRS,
        threads=threads_for("writeback_parity"),
    threads: slots_for("writeback_parity")
    log:
        "logs/writeback/writeback_parity.log",
    benchmark:
        "results/benchmarks/writeback_parity.tsv"
    resources:
        mem_mb=resources_for("writeback_parity", "mem_mb"),
        runtime=resources_for("writeback_parity", "runtime"),
    conda:
        CONDA_ENV
    shell:
        "encoder-study written parity {params.runs} --texts {input.texts:q} --threads {params.threads}"
        " --out {output.table:q} --provenance {output.prov:q} > {log:q} 2>&1"


rule writeback_agreement:
    input:
        **WRITEBACK_INPUTS,
        test=TREEBANK["test"],
        code=lib_code("written"),
    output:
        table="results/writeback/agreement.csv",
        markdown="results/writeback/agreement.md",
        predictions=expand("results/writeback/{run}/test.pred.conllu", run=WRITEBACK_RUNS),
        prov=prov("writeback", "writeback_agreement"),
    params:
        runs=WRITEBACK_PAIRS,
        resamples=config["tagging"]["resamples"],
        seed=config["tagging"]["seed"],
        threads=threads_for("writeback_agreement"),
    threads: slots_for("writeback_agreement")
    log:
        "logs/writeback/writeback_agreement.log",
    benchmark:
        "results/benchmarks/writeback_agreement.tsv"
    resources:
        mem_mb=resources_for("writeback_agreement", "mem_mb"),
        runtime=resources_for("writeback_agreement", "runtime"),
    conda:
        CONDA_ENV
    shell:
        "encoder-study written agreement {params.runs} --test {input.test:q} --pred-dir results/writeback"
        " --resamples {params.resamples} --seed {params.seed} --threads {params.threads}"
        " --out {output.table:q} --provenance {output.prov:q} > {log:q} 2>&1"


rule writeback_speed:
    input:
        **WRITEBACK_INPUTS,
        test=TREEBANK["test"],
        code=lib_code("written"),
    output:
        table="results/writeback/speed.csv",
        markdown="results/writeback/speed.md",
        prov=prov("writeback", "writeback_speed"),
    params:
        runs=WRITEBACK_PAIRS,
        threads=min(WRITEBACK["threads"], CORES, MACHINE_CORES),
        sentences=WRITEBACK["speed_sentences"],
        batch=WRITEBACK["speed_batch"],
        warmup=WRITEBACK["speed_warmup"],
        repeats=WRITEBACK["speed_repeats"],
    # Timed: takes every slot the workflow has, so that no other job runs beside it.
    threads: CORES
    log:
        "logs/writeback/writeback_speed.log",
    benchmark:
        "results/benchmarks/writeback_speed.tsv"
    resources:
        mem_mb=resources_for("writeback_speed", "mem_mb"),
        runtime=resources_for("writeback_speed", "runtime"),
    conda:
        CONDA_ENV
    shell:
        "encoder-study written speed {params.runs} --test {input.test:q} --sentences {params.sentences}"
        " --batch {params.batch} --warmup {params.warmup} --repeats {params.repeats}"
        " --threads {params.threads} --out {output.table:q} --provenance {output.prov:q} > {log:q} 2>&1"


if WRITEBACK_RUNS:
    # The runs' training fragments first: the recipe's PROVENANCE.md then shows where the weights came from.
    register("writeback", [prov("en-tagging", "tag_train", r) for r in WRITEBACK_RUNS]
             + [prov("writeback", "writeback_pipeline", r) for r in WRITEBACK_RUNS]
             + [prov("writeback", "writeback_parity"), prov("writeback", "writeback_agreement"),
                prov("writeback", "writeback_speed")])


rule writeback:
    input:
        # Nothing to do when the config has no fine-tuned run.
        ["results/writeback/parity.csv", "results/writeback/agreement.csv", "results/writeback/speed.csv",
         recipe_target("writeback")] if WRITEBACK_RUNS else [],
