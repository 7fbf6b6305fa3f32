# Recipe `retrieval`: a BGE-M3-style encoder with its dense, sparse and ColBERT heads baked into one ONNX
# graph, checked against a PyTorch reference (results/retrieval/parity.csv) and verified against its
# manifest. Library: encoder_study.retrieval (and encoder_study.acquire for a model of its own).

RETRIEVAL = config["retrieval"]
RETRIEVAL_DIR = "results/retrieval/model"
RANDOM_HEADS = RETRIEVAL["heads"] == "random"
# Random heads are files the recipe makes; a model's own heads are hashed in its source.json.
RETRIEVAL_HEADS = (["results/retrieval/heads/colbert_linear.pt", "results/retrieval/heads/sparse_linear.pt"]
                   if RANDOM_HEADS else [])

# A name from `models` reuses the export recipe's source (and its fragment); an entry of its own is
# acquired here.
if isinstance(RETRIEVAL["model"], str):
    if RETRIEVAL["model"] not in MODEL_SPECS:
        raise WorkflowError(f"config: retrieval.model is '{RETRIEVAL['model']}', which `models` does not "
                            f"list; name one of {', '.join(MODELS)} or give a model entry of its own")
    RETRIEVAL_SOURCE = f"results/sources/{RETRIEVAL['model']}/source.json"
    RETRIEVAL_ACQUIRED = prov("export", "acquire_model", RETRIEVAL["model"])
else:
    RETRIEVAL_SOURCE = "results/retrieval/source/source.json"
    RETRIEVAL_ACQUIRED = prov("retrieval", "retrieval_acquire")


if not isinstance(RETRIEVAL["model"], str):

    rule retrieval_acquire:
        input:
            code=lib_code("acquire"),
            architecture=[RETRIEVAL["model"]["architecture"]]
            if RETRIEVAL["model"]["source"] == "tiny"
            else [],
        output:
            source="results/retrieval/source/source.json",
            prov=prov("retrieval", "retrieval_acquire"),
        params:
            name=RETRIEVAL["model"]["name"],
            spec=json.dumps(RETRIEVAL["model"], sort_keys=True),
        threads: slots_for("retrieval_acquire", threads=1)
        log:
            "logs/retrieval/retrieval_acquire.log",
        benchmark:
            "results/benchmarks/retrieval_acquire/retrieval.tsv"
        resources:
            mem_mb=resources_for("retrieval_acquire", "mem_mb"),
            runtime=resources_for("retrieval_acquire", "runtime"),
        conda:
            CONDA_ENV
        shell:
            "encoder-study acquire --model {params.name:q} --spec {params.spec:q}"
            " --out-dir results/retrieval/source --provenance {output.prov:q} > {log:q} 2>&1"


rule retrieval_heads:
    input:
        source=RETRIEVAL_SOURCE,
        code=lib_code("retrieval"),
    output:
        colbert="results/retrieval/heads/colbert_linear.pt",
        sparse="results/retrieval/heads/sparse_linear.pt",
        prov=prov("retrieval", "retrieval_heads"),
    params:
        seed=RETRIEVAL["heads_seed"],
        out_dir=lambda wildcards, output: os.path.dirname(output.colbert),
    log:
        "logs/retrieval/retrieval_heads.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study retrieval heads --source {input.source:q} --seed {params.seed}"
        " --out-dir {params.out_dir:q} --provenance {output.prov:q} > {log:q} 2>&1"


rule retrieval_export:
    input:
        source=RETRIEVAL_SOURCE,
        heads=RETRIEVAL_HEADS,
        code=lib_code("retrieval"),
    output:
        model=directory(RETRIEVAL_DIR),
        parity="results/retrieval/parity.csv",
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
        threads=threads_for("retrieval_export"),
    threads: slots_for("retrieval_export")
    log:
        "logs/retrieval/retrieval_export.log",
    benchmark:
        "results/benchmarks/retrieval_export/retrieval.tsv"
    resources:
        mem_mb=resources_for("retrieval_export", "mem_mb"),
        runtime=resources_for("retrieval_export", "runtime"),
    conda:
        CONDA_ENV
    shell:
        "encoder-study retrieval export --source {input.source:q} {params.heads}"
        " --out-dir {output.model:q} --parity {output.parity:q} --markdown {output.markdown:q}"
        " --opset {params.opset} --tolerance {params.tolerance} --ort-optimization {params.optimization}"
        " --threads {params.threads} --provenance {output.prov:q} > {log:q} 2>&1"


rule retrieval_verify:
    input:
        model=RETRIEVAL_DIR,
        code=lib_code("retrieval"),
    output:
        prov=prov("retrieval", "retrieval_verify"),
    log:
        "logs/retrieval/retrieval_verify.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study retrieval verify {input.model:q} --provenance {output.prov:q} > {log:q} 2>&1"


register("retrieval", [RETRIEVAL_ACQUIRED]
         + ([prov("retrieval", "retrieval_heads")] if RANDOM_HEADS else [])
         + [prov("retrieval", "retrieval_export"), prov("retrieval", "retrieval_verify")])


rule retrieval:
    input:
        RETRIEVAL_DIR,
        "results/retrieval/parity.csv",
        "results/retrieval/parity.md",
        recipe_target("retrieval"),
