# Recipe `parity`: the selected texts, ONNX Runtime against PyTorch token by token, and latency side by
# side. Command: `encoder-study parity fetch|select|compare|latency|table`
# (encoder_study.recipes.parity.command). Library: encoder_study.recipes.parity.selection (the selection),
# encoder_study.recipes.parity.parity (one model's rows), encoder_study.recipes.parity.parity_tables (the tables).


rule parity_fetch:
    input:
        code=lib_code("parity", "fetch"),
    output:
        source="results/texts/sources/{source}{suffix}",
        prov=prov("parity", "parity_fetch", "{source}{suffix}"),
    wildcard_constraints:
        source="tatoeba|udhr",
        suffix=r"\.tar\.bz2|\.tar\.gz|\.zip|\.csv|\.tsv",
    params:
        url=lambda wc: config["texts"][wc.source],
        sha256=lambda wc: config["texts"][f"{wc.source}_sha256"],
        pin_key=lambda wc: f"texts.{wc.source}_sha256",
        timeout=config["texts"]["timeout"],
    log:
        "logs/parity/parity_fetch-{source}{suffix}.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study parity fetch --url {params.url:q} --sha256={params.sha256:q}"
        " --timeout {params.timeout} --out {output.source:q} --provenance {output.prov:q} > {log:q} 2>&1"
        # An unpinned download's pin to add (encoder_study.core.download.PIN): shown once, when it is made.
        "; grep '^pin: ' {log:q} | sed 's/^pin:/pin {params.pin_key}:/' >&2 || true"


rule parity_select:
    input:
        tatoeba=text_source_files("tatoeba"),
        udhr=text_source_files("udhr"),
        code=lib_code("parity", "select"),
    output:
        texts=PARITY_TEXTS,
        prov=prov("parity", "parity_select"),
    params:
        tatoeba=lambda wc: text_source("tatoeba"),
        udhr=lambda wc: text_source("udhr"),
        tatoeba_sha256=config["texts"]["tatoeba_sha256"],
        udhr_sha256=config["texts"]["udhr_sha256"],
        seed=config["texts"]["seed"],
        tatoeba_count=config["texts"]["tatoeba_count"],
        udhr_count=config["texts"]["udhr_count"],
        max_chars=config["texts"]["max_chars"],
        languages=",".join(config["texts"]["languages"]),
    log:
        "logs/parity/parity_select.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study parity select --tatoeba {params.tatoeba:q} --tatoeba-sha256={params.tatoeba_sha256:q}"
        " --udhr {params.udhr:q} --udhr-sha256={params.udhr_sha256:q} --seed {params.seed}"
        " --tatoeba-count {params.tatoeba_count} --udhr-count {params.udhr_count}"
        " --max-chars {params.max_chars} --languages={params.languages:q}"
        " --out {output.texts:q} --provenance {output.prov:q} > {log:q} 2>&1"


# What a per-model comparison reads of an export (not model.config.json) and of its source.
PARITY_MODEL = {
    "model": [rules.export_model.output.onnx, rules.export_model.output.tokenizer,
              rules.export_model.output.manifest],
    "source": rules.export_acquire.output.source,
}


# One job per model for both tables: the reference and the graph run each text once.
rule parity_compare:
    input:
        **PARITY_MODEL,
        texts=rules.parity_select.output.texts,
        code=lib_code("parity", "compare"),
    output:
        inference=result("parity_inference_row"),
        diffs="results/parity/inference/{model}.npy",
        trainable=result("parity_trainable_row"),
        prov=prov("parity", "parity_compare", "{model}"),
    params:
        model_dir=lambda wc, input: Path(input.model[0]).parent,
    threads: threads_for("parity_compare")
    log:
        "logs/parity/parity_compare-{model}.log",
    benchmark:
        "results/benchmarks/parity_compare/{model}.tsv"
    resources: **resources_of("parity_compare")
    conda:
        CONDA_ENV
    shell:
        "encoder-study parity compare --model-dir {params.model_dir:q}"
        " --source {input.source:q} --texts {input.texts:q} --threads {threads}"
        " --inference-out {output.inference:q} --diffs {output.diffs:q} --trainable-out {output.trainable:q}"
        " --provenance {output.prov:q} > {log:q} 2>&1"


LATENCY_ROWS = "results/parity/latency/{model}.csv"
# The models the latency table times: every model but those of parity.latency_skip (a name that is not
# among them is ignored: a config given over this one may have other models).
LATENCY_MODELS = [m for m in MODELS if m not in config["parity"]["latency_skip"]]
if not LATENCY_MODELS:
    refuse_config(f"config: parity.latency_skip skips every model ({', '.join(MODELS)}); the latency "
                        "table needs one")


# Every model in one job: one Python start, one import of transformers, one GEMM probe calibration, and
# each model's rows to its own CSV (the gather below joins them).
rule parity_latency:
    input:
        model=expand(PARITY_MODEL["model"], model=LATENCY_MODELS),
        source=expand(PARITY_MODEL["source"], model=LATENCY_MODELS),
        code=lib_code("parity", "latency"),
    output:
        rows=expand(LATENCY_ROWS, model=LATENCY_MODELS),
        prov=prov("parity", "parity_latency"),
    params:
        models=" ".join(f"{model_option(m)} --out {shlex.quote(expand(LATENCY_ROWS, model=m)[0])}"
                        for m in LATENCY_MODELS),
        threads=config["parity"]["latency_threads"],
        batches=",".join(str(b) for b in config["parity"]["latency_batches"]),
        seq_len=config["parity"]["latency_seq_len"],
        warmup=config["parity"]["latency_warmup"],
        runs=config["parity"]["latency_runs"],
        min_seconds=config["timing"]["min_seconds"],
    # Timed: locally every slot the workflow has, so that no other job runs beside it; on a cluster
    # the config's threads and a node of its own (common.smk, timed_threads).
    threads: timed_threads("parity_latency", "parity.latency_threads")
    log:
        "logs/parity/parity_latency.log",
    benchmark:
        "results/benchmarks/parity_latency.tsv"
    resources: **resources_of("parity_latency")
    conda:
        CONDA_ENV
    shell:
        "encoder-study parity latency {params.models} --threads {params.threads} --batches {params.batches}"
        " --seq-len {params.seq_len} --warmup {params.warmup} --runs {params.runs}"
        " --min-seconds {params.min_seconds} --provenance {output.prov:q} > {log:q} 2>&1"


# One gather per table, each with only its own rows as inputs: the latency table waits on the timed
# jobs alone, and the parity tables never wait on them.
rule parity_table_inference:
    input:
        rows=expand(rules.parity_compare.output.inference, model=MODELS),
        diffs=expand(rules.parity_compare.output.diffs, model=MODELS),
        code=lib_code("parity", "table"),
    output:
        table=result("parity_inference"),
        markdown="results/parity/inference.md",
        plot=result("parity_inference_plot"),
        prov=prov("parity", "parity_table_inference"),
    log:
        "logs/parity/parity_table_inference.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study parity table --kind inference --out {output.table:q} --markdown {output.markdown:q}"
        " --plot {output.plot:q} --provenance {output.prov:q} {input.rows:q} > {log:q} 2>&1"


rule parity_table_trainable:
    input:
        rows=expand(rules.parity_compare.output.trainable, model=MODELS),
        code=lib_code("parity", "table"),
    output:
        table=result("parity_trainable"),
        markdown="results/parity/trainable.md",
        prov=prov("parity", "parity_table_trainable"),
    log:
        "logs/parity/parity_table_trainable.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study parity table --kind trainable --out {output.table:q} --markdown {output.markdown:q}"
        " --provenance {output.prov:q} {input.rows:q} > {log:q} 2>&1"


rule parity_table_latency:
    input:
        rows=rules.parity_latency.output.rows,
        code=lib_code("parity", "table"),
    output:
        table=result("parity_latency"),
        markdown="results/parity/latency.md",
        plot=result("parity_latency_plot"),
        prov=prov("parity", "parity_table_latency"),
    log:
        "logs/parity/parity_table_latency.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study parity table --kind latency --out {output.table:q} --markdown {output.markdown:q}"
        " --plot {output.plot:q} --provenance {output.prov:q} {input.rows:q} > {log:q} 2>&1"


register("parity", [prov("parity", "parity_fetch", Path(text_source(name)).name)
                    for name in ("tatoeba", "udhr") if is_download(name)]
         + [rules.parity_select.output.prov]
         + expand(rules.parity_compare.output.prov, model=MODELS)
         + [rules.parity_table_inference.output.prov]
         + [rules.parity_table_trainable.output.prov]
         + [rules.parity_latency.output.prov]
         + [rules.parity_table_latency.output.prov])


rule parity:
    input:
        rules.parity_select.output.texts,
        rules.parity_table_inference.output.table,
        rules.parity_table_trainable.output.table,
        rules.parity_table_latency.output.table,
        recipe_target("parity"),
