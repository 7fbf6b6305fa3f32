"""Reruns as precise as the code (encoder_study.provenance.deps, code stamps; docs/reruns.md): on the
finished shared run, one edit at a time, `snakemake -n all` plans exactly the jobs whose results the
edit can change. A comment or a docstring anywhere reruns nothing that computes; a real change to a
function reruns the jobs that run it and what reads their outputs."""

import ast
import contextlib
import os
import re
import shutil
from pathlib import Path

from conftest import snakemake

PACKAGE = Path("workflow/lib/encoder_study")
STAMPS = Path(".snakemake/encoder-study/code")
# Jobs that keep the record rather than compute results: they may rerun after any edit (the rehearsal's
# resources table reads every fragment's measured peaks, the run crate's among them).
RECORD_KEEPING = re.compile(r"(provenance_join|provenance_crate|rehearsal_resources|all|report_.*)$")


def planned(workflow: Path) -> dict[str, int]:
    """rule -> jobs that `snakemake -n all` plans in `workflow` (its first "Job stats" table)."""
    result = snakemake("-n", "all", cwd=workflow)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:", 1)[1].split("total", 1)[0]
    return {rule: int(count) for rule, count in re.findall(r"^(\w+)\s+(\d+)\s*$", table, re.M)}


def computing(jobs: dict[str, int]) -> set[str]:
    return {rule for rule in jobs if not RECORD_KEEPING.match(rule)}


@contextlib.contextmanager
def edited(workflow: Path, edits: dict[str, callable]):
    """Each package file (path under the package) rewritten by its function, then put back as it was,
    bytes and times, with the code stamps as they were (a real change rewrites its file's stamp)."""
    saved = {name: ((workflow / PACKAGE / name).read_bytes(), (workflow / PACKAGE / name).stat())
             for name in edits}
    stamps = workflow / STAMPS
    backup = workflow / ".stamps-before-edit"
    shutil.copytree(stamps, backup)  # copy2: the stamps' times too
    try:
        for name, edit in edits.items():
            path = workflow / PACKAGE / name
            path.write_text(edit(path.read_text(encoding="utf-8")), encoding="utf-8")
        yield
    finally:
        for name, (data, stat) in saved.items():
            path = workflow / PACKAGE / name
            path.write_bytes(data)
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        shutil.rmtree(stamps)
        backup.rename(stamps)


def comment(text: str) -> str:
    return text + "# a comment appended, as an edit would\n"


def docstrings(text: str) -> str:
    """Every docstring of the file (module, classes, functions) with a sentence added at its start."""
    lines = text.splitlines(keepends=True)
    starts = sorted(((node.body[0].lineno, node.body[0].col_offset) for node in ast.walk(ast.parse(text))
                     if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and ast.get_docstring(node, clean=False) is not None), reverse=True)
    for number, column in starts:
        line = lines[number - 1]
        opening = re.match(r"[rRuU]?(\"\"\"|\'\'\'|\"|\')", line[column:])
        at = column + opening.end()
        lines[number - 1] = f"{line[:at]}Edited. {line[at:]}"
    return "".join(lines)


def in_function(name: str):
    """A real change inside top-level function `name`: a statement before its first one (after its
    docstring), which the interpreter runs."""
    def edit(text: str) -> str:
        tree = ast.parse(text)
        node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
        first = node.body[1] if ast.get_docstring(node) is not None and len(node.body) > 1 else node.body[0]
        lines = text.splitlines(keepends=True)
        indent = " " * first.col_offset
        lines.insert(first.lineno - 1, f"{indent}_edited = None  # a real change\n")
        return "".join(lines)
    return edit


def module_statement(text: str) -> str:
    return text + "_EDITED = True  # a real change at module level\n"


def test_the_finished_run_has_nothing_to_do(small_workflow):
    assert planned(small_workflow) == {}


def test_comments_and_docstrings_anywhere_rerun_no_computing_job(small_workflow):
    package = small_workflow / PACKAGE
    modules = sorted(str(p.relative_to(package)) for p in package.rglob("*.py"))
    assert len(modules) > 50
    with edited(small_workflow, dict.fromkeys(modules, comment)):
        assert computing(planned(small_workflow)) == set()
    with edited(small_workflow, dict.fromkeys(modules, docstrings)):
        assert computing(planned(small_workflow)) == set()


def test_readers_and_downloads_rerun_no_computing_job(small_workflow):
    """verify, explain, the crate, the report: no job that computes runs them; the download code fetches
    bytes that its pin fixes (deps.FETCHING), so the shared run's treebank and texts are not fetched again."""
    readers = ["provenance/verify.py", "provenance/lineage.py", "provenance/crate.py", "provenance/join.py",
               "provenance/records.py", "report/landing.py", "report/html.py", "report/facts.py",
               "core/download.py", "data/fetch.py", "recipes/tagging/spacy_fetch.py"]
    with edited(small_workflow, dict.fromkeys(readers, module_statement)):
        jobs = planned(small_workflow)
    assert jobs and computing(jobs) == set()  # the crate, joins and pages do rerun


def test_the_parity_selection_does_not_redistil_the_student(small_workflow):
    with edited(small_workflow, {"recipes/parity/selection.py": in_function("select_texts")}):
        jobs = computing(planned(small_workflow))
    assert "parity_select" in jobs and "parity_compare" in jobs
    assert not jobs & {"student_distill", "tagging_train", "export_model"}


def test_a_change_to_attention_reruns_the_jobs_that_run_it_and_what_reads_them(small_workflow):
    """encoders.trainable.common.attention runs in the trainable rebuild: parity, fine-tuning, the
    student, and the write-back that reads the fine-tuned runs; not the exports, the frozen probes' data,
    spaCy."""
    with edited(small_workflow, {"encoders/trainable/common.py": in_function("attention")}):
        jobs = computing(planned(small_workflow))
    assert {"parity_compare", "tagging_train", "tagging_step_time", "student_distill",
            "writeback_pipeline", "writeback_agreement"} <= jobs
    assert not jobs & {"export_acquire", "export_model", "parity_select", "tagging_treebank", "tagging_spacy",
                       "tagging_baseline", "retrieval_heads"}


def test_a_real_change_names_the_file_and_what_changed(small_workflow):
    with edited(small_workflow, {"encoders/trainable/common.py": in_function("attention")}):
        result = snakemake("-n", "all", cwd=small_workflow)
    out = result.stdout + result.stderr
    assert "code changed: workflow/lib/encoder_study/encoders/trainable/common.py: attention" in out
    # Snakemake's reason names the stamp.
    assert f"{STAMPS}/encoder_study/encoders/trainable/common.py.json" in out
