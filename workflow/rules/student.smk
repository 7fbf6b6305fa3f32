# Recipe `student`: a small encoder distilled from the teacher (hidden-state distillation), exported like
# every other encoder into results/models/<student>, and checked against PyTorch. The tagging and
# write-back recipes use it as a model. Library: encoder_study.student (CLI) over encoder_study.distill.

rule distill_student:
    input:
        teacher=model_files(STUDENT_CFG["teacher"]),
        corpus=student_corpus_inputs,
        code=lib_code("student"),
    output:
        weights=STUDENT_WEIGHTS,
        log="results/student/training.csv",
        plot="results/student/training.png",
        prov=prov("student", "distill_student"),
    params:
        launcher=student_launcher(),
        teacher_dir=lambda wc, input: os.path.dirname(input.teacher[0]),
        corpus=student_corpus_options(),
        student=json.dumps(STUDENT_CFG["architecture"], sort_keys=True),
        training=json.dumps(STUDENT_CFG["training"], sort_keys=True),
        # Outside results/student, whose outputs Snakemake deletes when a job fails: a rerun resumes.
        checkpoint="results/checkpoints/student/distill.pt",
        threads=threads_for("distill_student"),
    threads: slots_for("distill_student")
    log:
        "logs/student/distill_student.log",
    benchmark:
        "results/benchmarks/distill_student.tsv"
    resources:
        mem_mb=resources_for("distill_student", "mem_mb"),
        runtime=resources_for("distill_student", "runtime"),
        gpu=resources_for("distill_student", "gpu"),
    conda:
        CONDA_ENV
    shell:
        # A chunk ends with the checkpoint saved and exit 75 (under torchrun: 0 and no student file yet);
        # the loop resumes until the student is written.
        "while true; do"
        " {params.launcher} student train --teacher-dir {params.teacher_dir:q} {params.corpus}"
        " --student {params.student:q} --training {params.training:q} --checkpoint {params.checkpoint:q}"
        " --out {output.weights:q} --loss-log {output.log:q} --plot {output.plot:q}"
        " --threads {params.threads} --provenance {output.prov:q} >> {log:q} 2>&1 && status=0 || status=$?;"
        " if [ $status -eq 75 ] || {{ [ $status -eq 0 ] && [ ! -e {output.weights:q} ]; }}; then continue; fi;"
        " break; done; if [ $status -eq 0 ]; then rm -f {params.checkpoint:q}; fi; exit $status"


rule export_student:
    input:
        weights=STUDENT_WEIGHTS,
        teacher=model_files(STUDENT_CFG["teacher"]),
        code=lib_code("student"),
    output:
        onnx=f"{STUDENT_DIR}/model.onnx",
        tokenizer=f"{STUDENT_DIR}/tokenizer.json",
        config=f"{STUDENT_DIR}/model.config.json",
        manifest=f"{STUDENT_DIR}/export.json",
        prov=prov("student", "export_student"),
    params:
        teacher_dir=lambda wc, input: os.path.dirname(input.teacher[0]),
        out_dir=lambda wc, output: os.path.dirname(output.onnx),
        name=STUDENT,
        opset=config["export"]["opset"],
        tolerance=config["export"]["tolerance"],
        optimization=config["export"]["ort_optimization"],
        threads=threads_for("export_student"),
    threads: slots_for("export_student")
    log:
        "logs/student/export_student.log",
    benchmark:
        "results/benchmarks/export_student.tsv"
    conda:
        CONDA_ENV
    shell:
        "encoder-study student export --student {input.weights:q} --teacher-dir {params.teacher_dir:q}"
        " --out-dir {params.out_dir:q} --name {params.name:q} --opset {params.opset}"
        " --tolerance {params.tolerance} --ort-optimization {params.optimization}"
        " --threads {params.threads} --provenance {output.prov:q} > {log:q} 2>&1"


rule student_parity:
    input:
        weights=STUDENT_WEIGHTS,
        model=model_files(STUDENT),
        texts="results/texts/parity_texts.jsonl",
        code=lib_code("student"),
    output:
        table="results/student/parity.csv",
        markdown="results/student/parity.md",
        prov=prov("student", "student_parity"),
    params:
        export_dir=lambda wc, input: os.path.dirname(input.model[0]),
        threads=threads_for("student_parity"),
    threads: slots_for("student_parity")
    log:
        "logs/student/student_parity.log",
    benchmark:
        "results/benchmarks/student_parity.tsv"
    conda:
        CONDA_ENV
    shell:
        "encoder-study student parity --student {input.weights:q} --export-dir {params.export_dir:q}"
        " --texts {input.texts:q} --out {output.table:q} --threads {params.threads}"
        " --provenance {output.prov:q} > {log:q} 2>&1"


register("student", [prov("student", r) for r in ("distill_student", "export_student", "student_parity")])


rule student:
    input:
        "results/student/parity.csv",
        "results/student/training.csv",
        "results/student/training.png",
        f"{STUDENT_DIR}/export.json",
        recipe_target("student"),
