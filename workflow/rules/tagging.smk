# Recipe `en-tagging`: the treebank (synthetic or UD English-EWT), UPOS taggers on frozen and fine-tuned
# encoders, the most-frequent-tag baseline, bootstrap intervals, comparisons and the step-time table.
# Library: encoder_study.treebank, encoder_study.tag (over the encoder_study.tagging package).

TREEBANK = {split: f"results/treebank/{split}.conllu" for split in ("train", "dev", "test")}
RUN_FILES = ["pipeline.safetensors", "dev.pred.conllu", "test.pred.conllu", "scores.csv", "history.csv",
             "run.json"]


if config["treebank"]["source"] == "synthetic":

    rule synthesize_treebank:
        input:
            code=lib_code("treebank"),
        output:
            treebank=list(TREEBANK.values()),
            prov=prov("en-tagging", "synthesize_treebank"),
        params:
            seed=config["treebank"]["seed"],
            sizes=config["treebank"]["sizes"],
        log:
            "logs/en-tagging/synthesize_treebank.log",
        conda:
            CONDA_ENV
        shell:
            "encoder-study treebank synthesize --seed {params.seed} --train {params.sizes[train]}"
            " --dev {params.sizes[dev]} --test {params.sizes[test]} --out-dir results/treebank"
            " --provenance {output.prov:q} > {log:q} 2>&1"

    TREEBANK_FRAGMENTS = [prov("en-tagging", "synthesize_treebank")]

else:

    rule fetch_treebank:
        input:
            code=lib_code("treebank"),
        output:
            treebank="results/treebank/{split}.conllu",
            prov=prov("en-tagging", "fetch_treebank", "{split}"),
        wildcard_constraints:
            split="train|dev|test",
        params:
            url=lambda wc: config["treebank"][wc.split],
            sha256=lambda wc: config["treebank"][f"{wc.split}_sha256"],
        log:
            "logs/en-tagging/fetch_treebank-{split}.log",
        conda:
            CONDA_ENV
        shell:
            "encoder-study treebank fetch --split {wildcards.split} --url {params.url:q}"
            " --sha256={params.sha256:q} --out {output.treebank:q} --provenance {output.prov:q} > {log:q} 2>&1"

    TREEBANK_FRAGMENTS = [prov("en-tagging", "fetch_treebank", s) for s in TREEBANK]


rule tag_train:
    input:
        unpack(lambda wc: {**TREEBANK, "model": model_files(RUNS[wc.run]["model"])}),
        code=lib_code("tag"),
    output:
        run=multiext("results/tagging/{run}/", *RUN_FILES),
        prov=prov("en-tagging", "tag_train", "{run}"),
    params:
        model_dir=lambda wc: f"results/models/{RUNS[wc.run]['model']}",
        options=lambda wc: run_options(RUNS[wc.run]),
        # Outside the run's directory, whose outputs Snakemake deletes when a job fails: a rerun resumes
        # here. Removed once the run is done, so a later rerun (new code, new data) starts afresh.
        checkpoint=lambda wc: f"results/tagging/checkpoints/{wc.run}.pt",
        resamples=config["tagging"]["resamples"],
        seed=config["tagging"]["seed"],
        threads=threads_for("tag_train"),
    threads: slots_for("tag_train")
    log:
        "logs/en-tagging/tag_train-{run}.log",
    benchmark:
        "results/benchmarks/tag_train/{run}.tsv"
    resources:
        mem_mb=resources_for("tag_train", "mem_mb"),
        runtime=resources_for("tag_train", "runtime"),
        gpu=resources_for("tag_train", "gpu"),
    conda:
        CONDA_ENV
    shell:
        # Exit status 75 ends a chunk (checkpoint saved); the loop resumes until the run is done.
        "status=75; while [ $status -eq 75 ]; do"
        " encoder-study tag train --run {wildcards.run:q} --model-dir {params.model_dir:q}"
        " --train {input.train:q} --dev {input.dev:q} --test {input.test:q}"
        " --out-dir results/tagging/{wildcards.run:q} --checkpoint {params.checkpoint:q}"
        " {params.options} --seed {params.seed} --resamples {params.resamples} --threads {params.threads}"
        " --no-progress --provenance {output.prov:q} >> {log:q} 2>&1 && status=0 || status=$?;"
        " done; if [ $status -eq 0 ]; then rm -f {params.checkpoint:q}; fi; exit $status"


rule tag_baseline:
    input:
        **TREEBANK,
        code=lib_code("tag"),
    output:
        run=multiext("results/tagging/baseline/", "dev.pred.conllu", "test.pred.conllu", "scores.csv"),
        prov=prov("en-tagging", "tag_baseline"),
    params:
        resamples=config["tagging"]["resamples"],
        seed=config["tagging"]["seed"],
    log:
        "logs/en-tagging/tag_baseline.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study tag baseline --train {input.train:q} --dev {input.dev:q} --test {input.test:q}"
        " --out-dir results/tagging/baseline --resamples {params.resamples} --bootstrap-seed {params.seed}"
        " --provenance {output.prov:q} > {log:q} 2>&1"


rule tag_tables:
    input:
        runs=expand("results/tagging/{run}/scores.csv", run=RUN_NAMES + ["baseline"]),
        dev=TREEBANK["dev"],
        test=TREEBANK["test"],
        code=lib_code("tag"),
    output:
        scores="results/tagging/scores.csv",
        comparisons="results/tagging/comparisons.csv",
        plot="results/tagging/dev_upos.png",
        prov=prov("en-tagging", "tag_tables"),
    params:
        run_dirs=" ".join(f"--run-dir results/tagging/{r}" for r in RUN_NAMES + ["baseline"]),
        compare=" ".join(f"--compare {a}:{b}" for a, b in config["tagging"]["comparisons"]),
        resamples=config["tagging"]["resamples"],
        seed=config["tagging"]["seed"],
    log:
        "logs/en-tagging/tag_tables.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study tag gather {params.run_dirs} --gold dev={input.dev:q} --gold test={input.test:q}"
        " {params.compare} --reference baseline --scores-out {output.scores:q}"
        " --comparisons-out {output.comparisons:q} --plot {output.plot:q} --resamples {params.resamples}"
        " --seed {params.seed} --provenance {output.prov:q} > {log:q} 2>&1"


rule tag_step_time:
    input:
        models=[model_files(m) for m in config["tagging"]["step_time"]["models"]],
        code=lib_code("tag"),
    output:
        table="results/tagging/step_time.csv",
        prov=prov("en-tagging", "tag_step_time"),
    params:
        models=" ".join(f"--model results/models/{m} results/sources/{m}/source.json"
                        for m in config["tagging"]["step_time"]["models"]),
        batch=config["tagging"]["step_time"]["batch"],
        length=config["tagging"]["step_time"]["length"],
        threads=threads_for("tag_step_time"),
    # Timed: takes every slot the workflow has, so that no other job runs beside it.
    threads: CORES
    log:
        "logs/en-tagging/tag_step_time.log",
    benchmark:
        "results/benchmarks/tag_step_time.tsv"
    resources:
        mem_mb=resources_for("tag_step_time", "mem_mb"),
        runtime=resources_for("tag_step_time", "runtime"),
    conda:
        CONDA_ENV
    shell:
        "encoder-study tag step-time {params.models} --out {output.table:q} --batch {params.batch}"
        " --length {params.length} --threads {params.threads} --provenance {output.prov:q} > {log:q} 2>&1"


register("en-tagging", TREEBANK_FRAGMENTS + [prov("en-tagging", "tag_baseline")]
         + [prov("en-tagging", "tag_train", r) for r in RUN_NAMES]
         + [prov("en-tagging", "tag_tables"), prov("en-tagging", "tag_step_time")])


rule en_tagging:
    input:
        "results/tagging/scores.csv",
        "results/tagging/comparisons.csv",
        "results/tagging/step_time.csv",
        expand("results/tagging/{run}/{split}.pred.conllu", run=RUN_NAMES, split=("dev", "test")),
        recipe_target("en-tagging"),
