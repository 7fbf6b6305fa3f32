# Recipe `parity`: the selected texts, ONNX Runtime against PyTorch token by token, and latency side by
# side. Library: encoder_study.texts (selection), encoder_study.parity (tables).


rule fetch_texts:
    output:
        source="results/texts/sources/{source}{suffix}",
        prov=prov("parity", "fetch_texts", "{source}{suffix}"),
    wildcard_constraints:
        source="tatoeba|udhr",
        suffix=r"\.tar\.bz2|\.tar\.gz|\.zip|\.csv|\.tsv",
    params:
        url=lambda wc: config["texts"][wc.source],
        sha256=lambda wc: config["texts"][f"{wc.source}_sha256"],
    log:
        "logs/parity/fetch_texts-{source}{suffix}.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study texts fetch --url {params.url:q} --sha256={params.sha256:q} --out {output.source:q}"
        " --provenance {output.prov:q} > {log:q} 2>&1"


rule select_texts:
    input:
        tatoeba=text_source_files("tatoeba"),
        udhr=text_source_files("udhr"),
        code=lib_code("texts"),
    output:
        texts="results/texts/parity_texts.jsonl",
        prov=prov("parity", "select_texts"),
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
        "logs/parity/select_texts.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study texts select --tatoeba {params.tatoeba:q} --tatoeba-sha256={params.tatoeba_sha256:q}"
        " --udhr {params.udhr:q} --udhr-sha256={params.udhr_sha256:q} --seed {params.seed}"
        " --tatoeba-count {params.tatoeba_count} --udhr-count {params.udhr_count}"
        " --max-chars {params.max_chars} --languages={params.languages:q}"
        " --out {output.texts:q} --provenance {output.prov:q} > {log:q} 2>&1"


rule parity_inference:
    input:
        texts="results/texts/parity_texts.jsonl",
        model=multiext("results/models/{model}/", "model.onnx", "tokenizer.json", "export.json"),
        source="results/sources/{model}/source.json",
        code=lib_code("parity"),
    output:
        row="results/parity/inference/{model}.csv",
        diffs="results/parity/inference/{model}.npy",
        prov=prov("parity", "parity_inference", "{model}"),
    params:
        threads=threads_for("parity_inference"),
    threads: slots_for("parity_inference")
    log:
        "logs/parity/parity_inference-{model}.log",
    benchmark:
        "results/benchmarks/parity_inference/{model}.tsv"
    resources:
        mem_mb=resources_for("parity_inference", "mem_mb"),
        runtime=resources_for("parity_inference", "runtime"),
    conda:
        CONDA_ENV
    shell:
        "encoder-study parity inference --model-dir results/models/{wildcards.model:q}"
        " --source {input.source:q} --texts {input.texts:q} --threads {params.threads}"
        " --out {output.row:q} --diffs {output.diffs:q} --provenance {output.prov:q} > {log:q} 2>&1"


rule parity_trainable:
    input:
        texts="results/texts/parity_texts.jsonl",
        model=multiext("results/models/{model}/", "model.onnx", "tokenizer.json", "export.json"),
        source="results/sources/{model}/source.json",
        code=lib_code("parity"),
    output:
        rows="results/parity/trainable/{model}.csv",
        prov=prov("parity", "parity_trainable", "{model}"),
    params:
        threads=threads_for("parity_trainable"),
    threads: slots_for("parity_trainable")
    log:
        "logs/parity/parity_trainable-{model}.log",
    benchmark:
        "results/benchmarks/parity_trainable/{model}.tsv"
    resources:
        mem_mb=resources_for("parity_trainable", "mem_mb"),
        runtime=resources_for("parity_trainable", "runtime"),
    conda:
        CONDA_ENV
    shell:
        "encoder-study parity trainable --model-dir results/models/{wildcards.model:q}"
        " --source {input.source:q} --texts {input.texts:q} --threads {params.threads}"
        " --out {output.rows:q} --provenance {output.prov:q} > {log:q} 2>&1"


rule parity_latency:
    input:
        model=multiext("results/models/{model}/", "model.onnx", "tokenizer.json", "export.json"),
        source="results/sources/{model}/source.json",
        code=lib_code("parity"),
    output:
        rows="results/parity/latency/{model}.csv",
        prov=prov("parity", "parity_latency", "{model}"),
    params:
        threads=min(config["parity"]["latency_threads"], CORES, MACHINE_CORES),
        batches=",".join(str(b) for b in config["parity"]["latency_batches"]),
        seq_len=config["parity"]["latency_seq_len"],
        warmup=config["parity"]["latency_warmup"],
        runs=config["parity"]["latency_runs"],
    # Timed: takes every slot the workflow has, so that no other job runs beside it.
    threads: CORES
    log:
        "logs/parity/parity_latency-{model}.log",
    benchmark:
        "results/benchmarks/parity_latency/{model}.tsv"
    resources:
        mem_mb=resources_for("parity_latency", "mem_mb"),
        runtime=resources_for("parity_latency", "runtime"),
    conda:
        CONDA_ENV
    shell:
        "encoder-study parity latency --model-dir results/models/{wildcards.model:q}"
        " --source {input.source:q} --threads {params.threads} --batches {params.batches}"
        " --seq-len {params.seq_len} --warmup {params.warmup} --runs {params.runs}"
        " --out {output.rows:q} --provenance {output.prov:q} > {log:q} 2>&1"


rule parity_table:
    input:
        rows=expand("results/parity/inference/{model}.csv", model=MODELS),
        diffs=expand("results/parity/inference/{model}.npy", model=MODELS),
        code=lib_code("parity"),
    output:
        table="results/parity/inference.csv",
        markdown="results/parity/inference.md",
        plot="results/parity/inference.png",
        prov=prov("parity", "parity_table"),
    log:
        "logs/parity/parity_table.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study parity gather --kind inference --out {output.table:q} --markdown {output.markdown:q}"
        " --plot {output.plot:q} --provenance {output.prov:q} {input.rows:q} > {log:q} 2>&1"


rule trainable_table:
    input:
        rows=expand("results/parity/trainable/{model}.csv", model=MODELS),
        code=lib_code("parity"),
    output:
        table="results/parity/trainable.csv",
        markdown="results/parity/trainable.md",
        prov=prov("parity", "trainable_table"),
    log:
        "logs/parity/trainable_table.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study parity gather --kind trainable --out {output.table:q} --markdown {output.markdown:q}"
        " --provenance {output.prov:q} {input.rows:q} > {log:q} 2>&1"


rule latency_table:
    input:
        rows=expand("results/parity/latency/{model}.csv", model=MODELS),
        code=lib_code("parity"),
    output:
        table="results/parity/latency.csv",
        markdown="results/parity/latency.md",
        prov=prov("parity", "latency_table"),
    log:
        "logs/parity/latency_table.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study parity gather --kind latency --out {output.table:q} --markdown {output.markdown:q}"
        " --provenance {output.prov:q} {input.rows:q} > {log:q} 2>&1"


register("parity", [prov("parity", "fetch_texts", Path(text_source(name)).name)
                    for name in ("tatoeba", "udhr") if is_download(name)]
         + [prov("parity", "select_texts")]
         + [prov("parity", "parity_inference", m) for m in MODELS]
         + [prov("parity", "parity_table")]
         + [prov("parity", "parity_trainable", m) for m in MODELS]
         + [prov("parity", "trainable_table")]
         + [prov("parity", "parity_latency", m) for m in MODELS]
         + [prov("parity", "latency_table")])


rule parity:
    input:
        "results/texts/parity_texts.jsonl",
        "results/parity/inference.csv",
        "results/parity/trainable.csv",
        "results/parity/latency.csv",
        recipe_target("parity"),
