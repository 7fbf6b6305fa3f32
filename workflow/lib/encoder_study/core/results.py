"""The results contract's registry: each table and plot a recipe shows in the report, spelled once.

An entry names the file (under results/, with the rule's wildcards), its caption (under
workflow/report/), its place in the report (the recipe as category, a subcategory) and, for a table
with a Markdown rendering beside it, the title of its HTML page and the columns the landing page shows
(by their Markdown titles). The rule files mark their outputs with it (`result(name)` in
workflow/rules/common.smk), the report's HTML pages and the landing page read it. Standard library
only: the Snakefile imports it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Result:
    path: str  # under the working directory: results/<recipe>/...; may hold the rule's wildcards
    caption: str  # under workflow/report/
    subcategory: str
    title: str = ""  # a table with a Markdown rendering: the title of its HTML page in the report
    landing: tuple[str, ...] = ()  # the columns the landing page shows (the Markdown's titles)
    landing_title: str = ""

    @property
    def category(self) -> str:
        """The recipe: the report's category."""
        return self.path.split("/")[1] if not self.path.startswith("results/models/") else "export"

    @property
    def markdown(self) -> str:
        return self.path.rsplit(".", 1)[0] + ".md"

    @property
    def html(self) -> str:
        """The table's HTML rendering for the report: results/report/<folder>/<stem>.html."""
        return "results/report/" + self.path.removeprefix("results/").rsplit(".", 1)[0] + ".html"


# The shared columns of the parity tables on the landing page.
_PARITY = ("model", "comparison", "max abs", "min cosine")

RESULTS: dict[str, Result] = {
    # export
    "models_exports": Result("results/models/exports.csv", "export/exports.rst", "exports", "Exports",
                             ("export", "role", "source", "opset", "ONNX bytes", "SHA-256"),
                             "Exports and their SHA-256"),
    # parity
    "parity_inference_row": Result("results/parity/inference/{model}.csv", "parity/inference_row.rst",
                                   "{model}"),
    "parity_trainable_row": Result("results/parity/trainable/{model}.csv", "parity/trainable_row.rst",
                                   "{model}"),
    "parity_inference": Result("results/parity/inference.csv", "parity/inference_table.rst", "all models",
                               "Inference parity", ("model", "tokens", "max abs", "min cosine"),
                               "ONNX Runtime against PyTorch"),
    "parity_inference_plot": Result("results/parity/inference.png", "parity/inference_plot.rst",
                                    "all models"),
    "parity_trainable": Result("results/parity/trainable.csv", "parity/trainable_table.rst", "all models",
                               "Trainable parity", _PARITY,
                               "The trainable modules against PyTorch and the graph"),
    "parity_latency": Result("results/parity/latency.csv", "parity/latency_table.rst", "all models",
                             "Latency"),
    "parity_latency_plot": Result("results/parity/latency.png", "parity/latency_plot.rst", "all models"),
    # student
    "student_training": Result("results/student/training.csv", "student/training_log.rst", "training"),
    "student_training_plot": Result("results/student/training.png", "student/training_plot.rst", "training"),
    "student_parity": Result("results/student/parity.csv", "student/parity.rst", "parity", "Student parity",
                             _PARITY, "The exported student"),
    # tagging
    "tagging_run_scores": Result("results/tagging/{run}/scores.csv", "tagging/run_scores.rst", "{run}"),
    "tagging_run_history": Result("results/tagging/{run}/history.csv", "tagging/run_history.rst", "{run}"),
    "tagging_baseline_scores": Result("results/tagging/baseline/scores.csv", "tagging/baseline_scores.rst",
                                      "baseline"),
    "tagging_spacy_scores": Result("results/tagging/{run}/scores.csv", "tagging/spacy_scores.rst", "{run}"),
    "tagging_scores": Result("results/tagging/scores.csv", "tagging/scores.rst", "all runs", "UPOS scores"),
    "tagging_comparisons": Result("results/tagging/comparisons.csv", "tagging/comparisons.rst", "all runs",
                                  "Paired differences"),
    # Another task's runs (an xpos run's), results/tagging/<task>/: the scores and the comparisons.
    "tagging_task_scores": Result("results/tagging/{task}/scores.csv", "tagging/task_scores.rst",
                                  "{task} runs"),
    "tagging_task_comparisons": Result("results/tagging/{task}/comparisons.csv",
                                       "tagging/task_comparisons.rst", "{task} runs"),
    "tagging_dev_upos": Result("results/tagging/dev_upos.png", "tagging/dev_upos.rst", "all runs"),
    "tagging_scores_plot": Result("results/tagging/scores.png", "tagging/scores_plot.rst", "all runs"),
    "tagging_comparisons_plot": Result("results/tagging/comparisons.png", "tagging/comparisons_plot.rst",
                                       "all runs"),
    "tagging_per_tag": Result("results/tagging/per_tag.csv", "tagging/per_tag.rst", "all runs",
                              "Per-tag accuracy of the best runs"),
    "tagging_per_tag_plot": Result("results/tagging/per_tag.png", "tagging/per_tag_plot.rst", "all runs"),
    "tagging_step_time": Result("results/tagging/step_time.csv", "tagging/step_time.rst", "step time",
                                "Training step time"),
    # writeback
    "writeback_parity": Result("results/writeback/parity.csv", "writeback/parity.rst", "all runs",
                               "Write-back parity"),
    "writeback_agreement": Result("results/writeback/agreement.csv", "writeback/agreement.rst", "all runs",
                                  "Write-back agreement"),
    "writeback_speed": Result("results/writeback/speed.csv", "writeback/speed.rst", "all runs",
                              "Write-back speed"),
    "writeback_speed_plot": Result("results/writeback/speed.png", "writeback/speed_plot.rst", "all runs"),
    "writeback_quantisation": Result("results/writeback/quantisation.csv", "writeback/quantisation.rst",
                                     "all runs", "Int8 variants"),
    "writeback_quantisation_speed": Result("results/writeback/quantisation_speed.csv",
                                           "writeback/quantisation_speed.rst", "all runs",
                                           "Int8 variants: speed"),
    # retrieval
    "retrieval_parity": Result("results/retrieval/parity.csv", "retrieval/parity.rst", "retrieval graph",
                               "Retrieval parity", ("max_abs", "allclose", "tolerance")),
    "retrieval_quantisation": Result("results/retrieval/quantisation.csv", "retrieval/quantisation.rst",
                                     "retrieval graph", "Retrieval int8 variant"),
    # rehearsal
    "rehearsal_resources": Result("results/rehearsal/resources.csv", "rehearsal/resources.rst", "resources"),
    # preflight (outside `all`: checks before the cluster)
    "preflight": Result("results/preflight/preflight.json", "preflight/preflight.rst", "sources and limits"),
    "preflight_device": Result("results/preflight/device.json", "preflight/device.rst", "device"),
}


# The landing page's headline tables: role -> entry. The page pivots scores and comparisons by split,
# shows the parity tables' `landing` columns and the exports', and sums up the retrieval check.
LANDING = {"exports": "models_exports", "scores": "tagging_scores", "comparisons": "tagging_comparisons",
           "inference": "parity_inference", "trainable": "parity_trainable", "student": "student_parity",
           "retrieval": "retrieval_parity"}
