# HTML renderings of the study's tables for `snakemake --report report.zip`, whose viewer offers a CSV only
# as a download. Each page renders the table's formatted Markdown (the same digits as the .md), with each
# interval joined to its value. Command: `encoder-study report table` (encoder_study.commands.report).
# Library: encoder_study.report_html. Presentation only: no provenance fragment (the .md's own fragment
# holds the numbers' provenance).

# name -> (the .md's folder under results/ and its stem, recipe (the report's category), subcategory,
# caption in workflow/report/, title)
REPORT_TABLES = {
    "models_exports": ("models", "exports", "export", "exports", "export/exports.rst", "Exports"),
    "parity_inference": ("parity", "inference", "parity", "all models", "parity/inference_table.rst",
                         "Inference parity"),
    "parity_trainable": ("parity", "trainable", "parity", "all models", "parity/trainable_table.rst",
                         "Trainable parity"),
    "parity_latency": ("parity", "latency", "parity", "all models", "parity/latency_table.rst", "Latency"),
    "student_parity": ("student", "parity", "student", "parity", "student/parity.rst", "Student parity"),
    "tagging_scores": ("tagging", "scores", "tagging", "all runs", "tagging/scores.rst", "UPOS scores"),
    "tagging_comparisons": ("tagging", "comparisons", "tagging", "all runs", "tagging/comparisons.rst",
                            "Paired differences"),
    "tagging_per_tag": ("tagging", "per_tag", "tagging", "all runs", "tagging/per_tag.rst",
                        "Per-tag accuracy of the best runs"),
    "tagging_step_time": ("tagging", "step_time", "tagging", "step time", "tagging/step_time.rst",
                          "Training step time"),
    "retrieval_parity": ("retrieval", "parity", "retrieval", "retrieval graph", "retrieval/parity.rst",
                         "Retrieval parity"),
}
if WRITEBACK_RUNS:
    REPORT_TABLES |= {
        f"writeback_{stem}": ("writeback", stem, "writeback", "all runs", f"writeback/{stem}.rst",
                              f"Write-back {stem}")
        for stem in ("parity", "agreement", "speed")
    }

for _name, (_folder, _stem, _recipe, _subcategory, _caption, _title) in sorted(REPORT_TABLES.items()):

    rule:
        name:
            f"report_{_name}"
        input:
            markdown=f"results/{_folder}/{_stem}.md",
            code=lib_code("report", "table"),
        output:
            html=report(f"results/report/{_folder}/{_stem}.html", caption=f"../report/{_caption}",
                        category=_recipe, subcategory=_subcategory),
        params:
            title=f"{_title} (HTML rendering of results/{_folder}/{_stem}.md)",
        localrule: True
        log:
            f"logs/report/report_{_name}.log",
        conda:
            CONDA_ENV
        shell:
            "encoder-study report table {input.markdown:q} --title {params.title:q} --out {output.html:q}"
            " > {log:q} 2>&1"


REPORT_PAGES = [f"results/report/{folder}/{stem}.html" for folder, stem, *_ in REPORT_TABLES.values()]
