# Recipe `retrieval`: a BGE-M3-style encoder with its dense, sparse and ColBERT heads baked into one ONNX
# graph, checked against FlagEmbedding's BGE-M3 inference code and the project's own head code
# (results/retrieval/parity.csv) and verified against its manifest. Rule file
# workflow/rules/retrieval.smk; command `encoder-study retrieval heads|export|verify`
# (encoder_study.recipes.retrieval.command); library: the package encoder_study.recipes.retrieval. A model of the
# recipe's own is acquired by `encoder-study export acquire` (library encoder_study.recipes.export.acquire), as the
# export recipe does.

from encoder_study.recipes.retrieval.settings import Quantisation as RetrievalQuantisation

RETRIEVAL = config["retrieval"]
RANDOM_HEADS = RETRIEVAL["heads"] == "random"

# A name from `models` reuses the export recipe's source (and its fragment); an entry of its own is
# acquired here.
if isinstance(RETRIEVAL["model"], str):
    if RETRIEVAL["model"] not in MODEL_SPECS:
        refuse_config(f"config: retrieval.model is '{RETRIEVAL['model']}', which `models` does not "
                            f"list; name one of {', '.join(MODELS)} or give a model entry of its own")
    RETRIEVAL_SOURCE = expand(rules.export_acquire.output.source, model=RETRIEVAL["model"])[0]
    RETRIEVAL_ACQUIRED = expand(rules.export_acquire.output.prov, model=RETRIEVAL["model"])
else:

    rule retrieval_acquire:
        input:
            code=lib_code("export", "acquire"),
            architecture=[RETRIEVAL["model"]["architecture"]]
            if RETRIEVAL["model"]["source"] == "tiny"
            else [],
        output:
            source="results/retrieval/source/source.json",
            prov=prov("retrieval", "retrieval_acquire"),
        params:
            name=RETRIEVAL["model"]["name"],
            spec=json.dumps(RETRIEVAL["model"], sort_keys=True),
            out_dir=lambda wildcards, output: os.path.dirname(output.source),
        threads: 1
        log:
            "logs/retrieval/retrieval_acquire.log",
        benchmark:
            "results/benchmarks/retrieval_acquire/retrieval.tsv"
        resources: **resources_of("retrieval_acquire")
        conda:
            CONDA_ENV
        shell:
            "encoder-study export acquire --model {params.name:q} --spec {params.spec:q}"
            " --out-dir {params.out_dir:q} --provenance {output.prov:q} > {log:q} 2>&1"

    RETRIEVAL_SOURCE = rules.retrieval_acquire.output.source
    RETRIEVAL_ACQUIRED = [rules.retrieval_acquire.output.prov]


rule retrieval_heads:
    input:
        source=RETRIEVAL_SOURCE,
        code=lib_code("retrieval", "heads"),
    output:
        colbert="results/retrieval/heads/colbert_linear.pt",
        sparse="results/retrieval/heads/sparse_linear.pt",
        prov=prov("retrieval", "retrieval_heads"),
    params:
        seed=RETRIEVAL["heads_seed"],
        out_dir=lambda wildcards, output: os.path.dirname(output.colbert),
    log:
        "logs/retrieval/retrieval_heads.log",
    resources: **resources_of("retrieval_heads")
    conda:
        CONDA_ENV
    shell:
        "encoder-study retrieval heads --source {input.source:q} --seed {params.seed}"
        " --out-dir {params.out_dir:q} --provenance {output.prov:q} > {log:q} 2>&1"


rule retrieval_export:
    input:
        source=RETRIEVAL_SOURCE,
        # Random heads are files the recipe makes; a model's own heads are hashed in its source.json.
        # FlagEmbedding, the check's reference, reads them beside the model's files (links to both).
        heads=[rules.retrieval_heads.output.colbert, rules.retrieval_heads.output.sparse] if RANDOM_HEADS else [],
        code=lib_code("retrieval", "export"),
    output:
        model=directory("results/retrieval/model"),
        parity=result("retrieval_parity"),
        markdown="results/retrieval/parity.md",
        prov=prov("retrieval", "retrieval_export"),
    params:
        # Without --heads-dir the heads are read from the model's own directory (BGE-M3's snapshot).
        heads=lambda wildcards, input: (
            f"--heads-dir {os.path.dirname(input.heads[0])}" if input.heads else ""
        ),
        opset=RETRIEVAL["opset"],
        tolerance=RETRIEVAL["tolerance"],
        optimization=RETRIEVAL["ort_optimization"],
        external_data=RETRIEVAL["external_data"],
        sparse_top_k=RETRIEVAL["sparse_top_k"],
    threads: threads_for("retrieval_export")
    log:
        "logs/retrieval/retrieval_export.log",
    benchmark:
        "results/benchmarks/retrieval_export/retrieval.tsv"
    resources: **resources_of("retrieval_export")
    conda:
        CONDA_ENV
    shell:
        "encoder-study retrieval export --source {input.source:q} {params.heads}"
        " --out-dir {output.model:q} --parity {output.parity:q} --markdown {output.markdown:q}"
        " --opset {params.opset} --tolerance {params.tolerance} --ort-optimization {params.optimization}"
        " --external-data {params.external_data} --sparse-top-k {params.sparse_top_k} --threads {threads}"
        " --provenance {output.prov:q} > {log:q} 2>&1"


rule retrieval_verify:
    input:
        model=rules.retrieval_export.output.model,
        code=lib_code("retrieval", "verify"),
    output:
        prov=prov("retrieval", "retrieval_verify"),
    params:
        manifest="retrieval.json",  # encoder_study.recipes.retrieval.export.MANIFEST
    log:
        "logs/retrieval/retrieval_verify.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study retrieval verify {input.model:q} --manifest {params.manifest:q}"
        " --provenance {output.prov:q} > {log:q} 2>&1"


# Int8 variant (issue 35): the published graph quantised by ONNX Runtime's quantize_dynamic, checked on the
# cases against float32 and FlagEmbedding, published into results/retrieval/int8/ only within
# retrieval.quantisation's thresholds (else the folder stays empty and the table says why).
rule retrieval_quantisation:
    input:
        model=rules.retrieval_export.output.model,
        source=RETRIEVAL_SOURCE,
        heads=[rules.retrieval_heads.output.colbert, rules.retrieval_heads.output.sparse] if RANDOM_HEADS else [],
        code=lib_code("retrieval", "quantisation"),
    output:
        variant=directory("results/retrieval/int8"),
        table=result("retrieval_quantisation"),
        markdown="results/retrieval/quantisation.md",
        prov=prov("retrieval", "retrieval_quantisation"),
    params:
        heads=lambda wildcards, input: (
            f"--heads-dir {os.path.dirname(input.heads[0])}" if input.heads else ""
        ),
        quantisation=flags(RetrievalQuantisation, RETRIEVAL["quantisation"], "quantisation"),
    threads: threads_for("retrieval_quantisation")
    log:
        "logs/retrieval/retrieval_quantisation.log",
    benchmark:
        "results/benchmarks/retrieval_quantisation/retrieval.tsv"
    resources: **resources_of("retrieval_quantisation")
    conda:
        CONDA_ENV
    shell:
        "encoder-study retrieval quantisation --model-dir {input.model:q} --source {input.source:q}"
        " {params.heads} {params.quantisation} --threads {threads} --out-dir {output.variant:q}"
        " --out {output.table:q} --provenance {output.prov:q} > {log:q} 2>&1"


register("retrieval", RETRIEVAL_ACQUIRED
         + ([rules.retrieval_heads.output.prov] if RANDOM_HEADS else [])
         + [rules.retrieval_export.output.prov, rules.retrieval_verify.output.prov,
            rules.retrieval_quantisation.output.prov])


rule retrieval:
    input:
        rules.retrieval_export.output.model,
        rules.retrieval_export.output.parity,
        rules.retrieval_export.output.markdown,
        rules.retrieval_quantisation.output.table,
        recipe_target("retrieval"),
