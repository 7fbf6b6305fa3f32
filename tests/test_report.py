"""The Snakemake report: every table and plot of the workflow is a report() output with a caption that exists
and says how it was computed and which config produced it. Static checks of the rule files (no run)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "workflow" / "rules"
RECIPES = ("export", "parity", "student", "tagging", "writeback", "retrieval")

# An output entry `name="path.csv",` or `name=report("path.csv", caption=..., ...)`.
# The report's arguments may run over the following lines, up to its closing parenthesis.
ENTRY = re.compile(r'^\s+\w+=(?P<report>report\(\s*)?f?"(?P<path>[^"]+\.(?:csv|png))"'
                   r"(?P<rest>(?(report)[^)]*|[^\n]*))", re.M)
CAPTION = re.compile(r'caption="(?P<caption>[^"]+)"')
CATEGORY = re.compile(r'category="(?P<category>[^"]+)"')


def output_entries(recipe, text=None):
    """(path, report?, caption, category) of every .csv/.png entry in an `output:` section of a rule file."""
    entries = []
    text = (RULES / f"{recipe}.smk").read_text() if text is None else text
    for section in re.findall(r"^\s+output:\n((?:\s{8,}.*\n)+)", text, re.M):
        for m in ENTRY.finditer(section):
            caption, category = CAPTION.search(m["rest"]), CATEGORY.search(m["rest"])
            entries.append((m["path"], bool(m["report"]), caption and caption["caption"],
                            category and category["category"]))
    return entries


def test_an_unwrapped_table_is_seen():
    text = ('rule a:\n    output:\n        table="results/x/t.csv",\n'
            '        plot=report("results/x/p.png", caption="../report/x.rst", category="x"),\n'
            '        prov="provenance/x.md",\n    shell:\n        "true"\n')
    assert output_entries("x", text) == [("results/x/t.csv", False, None, None),
                                         ("results/x/p.png", True, "../report/x.rst", "x")]


def test_report_pages_have_captions_that_exist():
    text = (RULES / "report.smk").read_text()
    captions = re.findall(r'"([\w/]+\.rst)"', text)
    assert len(captions) >= 9
    for caption in captions:
        assert (ROOT / "workflow" / "report" / caption).is_file(), caption


def test_html_rendering_joins_intervals_and_keeps_the_digits():
    from encoder_study import report_html

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
    from encoder_study import errors, report_html

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


@pytest.mark.parametrize("caption", sorted((ROOT / "workflow" / "report").rglob("*.rst")),
                         ids=lambda p: str(p.relative_to(ROOT / "workflow" / "report")))
def test_caption_names_method_and_config(caption):
    text = caption.read_text()
    assert "**Method:**" in text, f"{caption}: says nothing of how it was computed"
    # The treebank, synthetic or not, comes from the config the report was built for (Jinja, rendered by
    # Snakemake), never from text fixed here.
    assert "snakemake.config['treebank']['source'] == 'synthetic'" in text, f"{caption}: names no treebank"
    assert "UD English-EWT" in text and "synthetic treebank" in text


def test_captions_render_for_both_treebanks():
    """Every caption renders (Jinja, then rST) for the default config with the schema's defaults filled in,
    as Snakemake renders it, and names the treebank the config uses."""
    import jinja2
    import yaml
    from docutils.core import publish_parts
    from snakemake.utils import validate

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    validate(config, str(ROOT / "workflow" / "schemas" / "config.schema.yaml"), set_default=True)

    class Snakemake:  # what a caption reads of the `snakemake` object
        def __init__(self, config):
            self.config, self.wildcards = config, {"model": "minilm", "run": "minilm-finetuned"}

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    for source, expected, absent in (("synthetic", "synthetic treebank", "UD English-EWT"),
                                     ("ud", "UD English-EWT", "synthetic treebank")):
        cfg = {**config, "treebank": {**config["treebank"], "source": source, "test": "test.conllu"}}
        for caption in sorted((ROOT / "workflow" / "report").rglob("*.rst")):
            text = env.from_string(caption.read_text()).render(snakemake=Snakemake(cfg))
            assert expected in text and absent not in text, caption
            html = publish_parts(text, writer="html")["body"]
            assert "system-message" not in html, f"{caption}: rST error\n{html}"
