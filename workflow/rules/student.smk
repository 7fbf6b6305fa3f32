# Recipe `student`: a small encoder distilled from the teacher (hidden-state distillation), exported like
# every other encoder into results/models/<student>, and checked against transformers' BertModel holding
# its weights (student_parity). The tagging and write-back recipes use it as a model (model_files(STUDENT)
# in common.smk).
# Rule file workflow/rules/student.smk; command `encoder-study student distill|export|parity`
# (encoder_study.recipes.student.command); library encoder_study.recipes.student (distill, data, objective, architecture,
# export, reference, parity).


# The corpus, read where the network is (a local rule: compute nodes often have none): the streamed
# datasets at their commits, each configuration checked before any is read, or the embedded sample.
rule student_stage:
    input:
        corpus=student_corpus_inputs,
        code=lib_code("student", "stage"),
    output:
        corpus="results/student/corpus.jsonl",
        prov=prov("student", "student_stage"),
    params:
        corpus=student_corpus_options(),
    log:
        "logs/student/student_stage.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study student stage {params.corpus} --out {output.corpus:q} --provenance {output.prov:q}"
        " > {log:q} 2>&1"


rule student_distill:
    input:
        teacher=model_files(STUDENT_CFG["teacher"]),
        corpus=rules.student_stage.output.corpus,
        code=lib_code("student", "distill"),
    output:
        weights="results/student/student.pt",
        log=result("student_training"),
        plot=result("student_training_plot"),
        prov=prov("student", "student_distill"),
    params:
        launcher=student_launcher(),
        teacher_dir=lambda wc, input: os.path.dirname(input.teacher[0]),
        amounts=student_amounts_option(),
        student=json.dumps(STUDENT_CFG["architecture"], sort_keys=True),
        training=json.dumps(STUDENT_CFG["training"], sort_keys=True),
        # Outside results/student, whose outputs Snakemake deletes when a job fails: a retry resumes.
        checkpoint="results/checkpoints/student/distill.pt",
        journal="results/checkpoints/student/distill.log",  # common.smk, keeping_attempts
        device=STUDENT_CFG["device"],
        precision=STUDENT_CFG["precision"],
        threads=student_threads,
    threads: threads_for("student_distill")
    priority: CHAIN_PRIORITY
    # The command saves a checkpoint every training.chunk_steps steps and resumes from it when rerun.
    retries: STUDENT_CFG["retries"]
    log:
        "logs/student/student_distill.log",
    benchmark:
        "results/benchmarks/student_distill.tsv"
    # With student.processes > 1 (torchrun), the config's mem_mb and gpu are per process.
    resources: **resources_per_process("student_distill", STUDENT_PROCESSES)
    conda:
        CONDA_ENV
    shell:
        keeping_attempts(
            "{params.launcher} student distill --teacher-dir {params.teacher_dir:q} --corpus {input.corpus:q}"
            " {params.amounts}"
            " --student {params.student:q} --training {params.training:q} --checkpoint {params.checkpoint:q}"
            " --out {output.weights:q} --loss-log {output.log:q} --plot {output.plot:q}"
            " --threads {params.threads} --device {params.device} --precision {params.precision}"
            " --provenance {output.prov:q}")


rule student_export:
    input:
        weights=rules.student_distill.output.weights,
        teacher=model_files(STUDENT_CFG["teacher"]),
        code=lib_code("student", "export"),
    output:
        onnx=f"{STUDENT_DIR}/model.onnx",
        tokenizer=f"{STUDENT_DIR}/tokenizer.json",
        config=f"{STUDENT_DIR}/model.config.json",
        manifest=f"{STUDENT_DIR}/export.json",
        prov=prov("student", "student_export"),
    params:
        teacher_dir=lambda wc, input: os.path.dirname(input.teacher[0]),
        out_dir=lambda wc, output: os.path.dirname(output.onnx),
        name=STUDENT,
        opset=config["export"]["opset"],
        tolerance=config["export"]["tolerance"],
        optimization=config["export"]["ort_optimization"],
    threads: threads_for("student_export")
    log:
        "logs/student/student_export.log",
    benchmark:
        "results/benchmarks/student_export.tsv"
    resources: **resources_of("student_export")
    conda:
        CONDA_ENV
    shell:
        "encoder-study student export --student {input.weights:q} --teacher-dir {params.teacher_dir:q}"
        " --out-dir {params.out_dir:q} --name {params.name:q} --opset {params.opset}"
        " --tolerance {params.tolerance} --ort-optimization {params.optimization}"
        " --threads {threads} --provenance {output.prov:q} > {log:q} 2>&1"


rule student_parity:
    input:
        weights=rules.student_distill.output.weights,
        model=[rules.student_export.output.onnx, rules.student_export.output.tokenizer,
               rules.student_export.output.config, rules.student_export.output.manifest],
        texts=rules.parity_select.output.texts,
        code=lib_code("student", "parity"),
    output:
        table=result("student_parity"),
        markdown="results/student/parity.md",
        prov=prov("student", "student_parity"),
    params:
        export_dir=lambda wc, input: os.path.dirname(input.model[0]),
    threads: threads_for("student_parity")
    log:
        "logs/student/student_parity.log",
    benchmark:
        "results/benchmarks/student_parity.tsv"
    resources: **resources_of("student_parity")
    conda:
        CONDA_ENV
    shell:
        "encoder-study student parity --student {input.weights:q} --export-dir {params.export_dir:q}"
        " --texts {input.texts:q} --out {output.table:q} --threads {threads}"
        " --provenance {output.prov:q} > {log:q} 2>&1"


register("student", [rules.student_stage.output.prov, rules.student_distill.output.prov,
                     rules.student_export.output.prov, rules.student_parity.output.prov])


rule student:
    input:
        rules.student_parity.output.table,
        rules.student_distill.output.log,
        rules.student_distill.output.plot,
        rules.student_export.output.manifest,
        recipe_target("student"),
