"""config/paper.yaml runs as committed: its DAG resolves offline, its student corpus is the seed's (FineWeb-2
and Wikipedia in 113 languages, weights from the sources' sizes), and an empty dataset revision is read
from the Hub at the run's start, recorded and printed, while a given one is checked and used. The Hub and
`datasets` are fakes here: no test touches the network."""

from __future__ import annotations

import json
import math
import re
import shlex
import sys
import types

import pytest
import yaml

from conftest import ROOT, snakemake
from encoder_study import cli
from encoder_study.recipes.student import StudentError, data, distill, sources

PAPER = ROOT / "config" / "paper.yaml"
SHA = "0123456789abcdef0123456789abcdef01234567"


def paper_corpus() -> dict:
    return yaml.safe_load(PAPER.read_text(encoding="utf-8"))["student"]["corpus"]


# --- the corpus ------------------------------------------------------------------------------------------

def test_the_corpus_is_fineweb2_and_wikipedia_in_113_languages():
    corpus = paper_corpus()
    assert corpus["source"] == "stream"
    streams = {s["dataset"]: s for s in corpus["streams"]}
    assert sorted(streams) == ["HuggingFaceFW/fineweb-2", "wikimedia/wikipedia"]
    fineweb = streams["HuggingFaceFW/fineweb-2"]["configs"]
    wikipedia = streams["wikimedia/wikipedia"]["configs"]
    languages = set(fineweb) | set(wikipedia)
    assert len(languages) == 113
    assert all(re.fullmatch(r"[a-z]{3}", lang) for lang in languages), "ISO 639-3 codes: one key per language"
    for lang, subset in fineweb.items():  # FineWeb-2 subsets are <ISO 639-3>_<script>
        assert re.fullmatch(rf"{lang}_[A-Z][a-z]{{3}}", subset), (lang, subset)
    assert all(re.fullmatch(r"20231101\.[a-z]+(-[a-z]+)*", c) for c in wikipedia.values()), wikipedia
    assert set(wikipedia) == languages and set(fineweb) == languages - {"eng"}  # FineWeb-2 has no English
    assert len(set(wikipedia.values())) == len(wikipedia), "two languages read the same Wikipedia edition"
    for source in corpus["streams"]:  # empty (read at the first run) or a full commit
        assert source["revision"] == "" or re.fullmatch(r"[0-9a-f]{40}", source["revision"])


def test_weights_follow_the_square_root_of_each_languages_amount_in_the_source():
    corpus = paper_corpus()
    amounts = corpus["amounts"]
    languages = {lang for s in corpus["streams"] for lang in s["configs"]}
    assert set(amounts) == languages and all(v > 0 for v in amounts.values())
    paper_training = yaml.safe_load(PAPER.read_text(encoding="utf-8"))["student"]["training"]
    power = distill.TrainingConfig.from_dict(paper_training).language_power
    assert power == 0.5  # the seed: proportional to the square root
    weights = data.language_weights(amounts, power)
    total = math.fsum(math.sqrt(v) for v in amounts.values())
    for lang in ("deu", "eng", "cos", "yue"):
        assert weights[lang] == pytest.approx(math.sqrt(amounts[lang]) / total, rel=1e-12)
    # The sources' sizes span orders of magnitude; a capped sample's would give nearly equal weights.
    assert max(weights.values()) / min(weights.values()) > 10
    assert weights["rus"] > weights["deu"] > weights["fin"] > weights["cos"]


def test_a_dry_run_of_the_full_study_resolves_and_passes_the_corpus_to_distillation():
    result = snakemake("-n", "-p", "--cores", "8", "all", "--configfile", str(PAPER))
    assert result.returncode == 0, result.stderr
    # The streams are read by the local stage rule; the distillation reads its file and the amounts.
    stage = [line for line in result.stdout.splitlines() if "student stage" in line]
    commands = [line for line in result.stdout.splitlines() if "student distill" in line]
    assert len(stage) == 1 and len(commands) == 1, (stage, commands)
    staged = shlex.split(stage[0].split("Shell command:", 1)[-1])
    argv = shlex.split(commands[0].split("Shell command:", 1)[-1])
    corpus = paper_corpus()
    assert json.loads(staged[staged.index("--streams") + 1]) == corpus["streams"]
    assert json.loads(argv[argv.index("--amounts") + 1]) == corpus["amounts"]
    assert "--streams" not in argv and argv[argv.index("--corpus") + 1] == "results/student/corpus.jsonl"
    for rule in ("student_export", "student_parity", "tagging_train", "retrieval_export"):
        assert f"rule {rule}:" in result.stdout, rule


# --- revisions ------------------------------------------------------------------------------------------

class FakeHub:
    """huggingface_hub.HfApi's dataset_info, counting the calls; `sha` as the repository's commit."""

    def __init__(self, sha=SHA, error: Exception | None = None):
        self.sha, self.error, self.calls = sha, error, []

    def dataset_info(self, repo_id):
        self.calls.append(repo_id)
        if self.error is not None:
            raise self.error
        return types.SimpleNamespace(sha=self.sha, id=repo_id)


def source(dataset="HuggingFaceFW/fineweb-2", revision="", **extra):
    return sources.StreamSource.from_dict({"dataset": dataset, "revision": revision,
                                        "configs": {"fra": "fra_Latn"}, **extra})


def test_an_empty_revision_becomes_the_repositorys_current_commit_read_once_per_dataset():
    hub = FakeHub()
    given = [source(), source(configs={"deu": "deu_Latn"}), source("wikimedia/wikipedia", SHA.upper())]
    resolved = sources.resolve_revisions(given, api=hub)
    assert [s.revision for s in resolved] == [SHA, SHA, SHA]
    assert hub.calls == ["HuggingFaceFW/fineweb-2"], "once per dataset, never for a given revision"
    assert [s.configs for s in resolved] == [s.configs for s in given]


def test_a_given_revision_is_used_and_checked():
    assert source(revision=" " + SHA.upper()).revision == SHA  # lowercased, as the Hub names commits
    for bad in ("main", "v2.0.1", SHA[:7], SHA + "0", "g" * 40):
        with pytest.raises(StudentError, match=r"is not a commit \(40 hexadecimal digits\)"):
            source(revision=bad)
    hub = FakeHub(error=AssertionError("a pinned source must not ask the Hub"))
    assert sources.resolve_revisions([source(revision=SHA)], api=hub)[0].revision == SHA


def test_the_hubs_answer_is_checked_and_its_failures_name_the_dataset():
    with pytest.raises(StudentError, match="named no commit"):
        sources.resolve_revisions([source()], api=FakeHub(sha=None))
    with pytest.raises(StudentError, match="is not a commit"):
        sources.resolve_revisions([source()], api=FakeHub(sha="refs/heads/main"))
    with pytest.raises(StudentError, match=r"HuggingFaceFW/fineweb-2: could not read .* \(offline\)"):
        sources.resolve_revisions([source()], api=FakeHub(error=OSError("offline")))


def test_amounts_must_cover_every_streamed_language_before_any_download():
    sources.check_amounts([source()], {"fra": 1.0, "deu": 2.0})
    with pytest.raises(StudentError, match=r"no amount of text given for languages \['deu'\]"):
        sources.check_amounts([source(), source(configs={"deu": "deu_Latn"})], {"fra": 1.0})


# --- the command ----------------------------------------------------------------------------------------

TEXT = ("the cat sat on the mat and the dog ran to the park while the bird sang in the tree "
        "le chat est sur le tapis et le chien court vers le parc pendant que l'oiseau chante")


def fake_datasets(calls):
    def load_dataset(name, config, split, streaming, revision):
        calls.append((name, config, revision))
        return iter([{"text": f"{config} {TEXT} {i}"} for i in range(4)])

    def get_dataset_config_names(name, revision):
        return {"HuggingFaceFW/fineweb-2": ["fra_Latn", "deu_Latn", "eng_Latn"],
                "wikimedia/wikipedia": ["20231101.en", "20231101.fr"]}[name]
    return types.SimpleNamespace(load_dataset=load_dataset, get_dataset_config_names=get_dataset_config_names)


def distill_argv(teacher, out, revision) -> tuple[list[str], list[str]]:
    """`student stage` then `student distill`, as the rules run them."""
    streams = [{"dataset": "HuggingFaceFW/fineweb-2", "revision": revision,
                "configs": {"fra": "fra_Latn", "deu": "deu_Latn"}},
               {"dataset": "wikimedia/wikipedia", "revision": revision, "configs": {"eng": "20231101.en"}}]
    shape = {"layers": 1, "width": 16, "heads": 2, "intermediate": 32, "embedding_width": 8,
             "max_positions": 64}
    training = {"steps": 2, "batch_windows": 2, "window_lengths": [16], "chunk_steps": 2, "log_every": 1,
                "stats_windows": 4}
    amounts = json.dumps({"fra": 4.0, "deu": 9.0, "eng": 16.0})
    stage = ["student", "stage", "--streams", json.dumps(streams), "--amounts", amounts,
             "--out", str(out / "corpus.jsonl"), "--provenance", str(out / "student_stage.md")]
    return stage, ["student", "distill", "--teacher-dir", str(teacher), "--corpus", str(out / "corpus.jsonl"),
                   "--amounts", amounts, "--student", json.dumps(shape), "--training", json.dumps(training),
                   "--checkpoint", str(out / "distill.pt"), "--out", str(out / "student.pt"),
                   "--loss-log", str(out / "training.csv"), "--plot", str(out / "training.png"),
                   "--threads", "1", "--device", "cpu", "--precision", "fp32",
                   "--provenance", str(out / "student_distill.md")]


@pytest.mark.parametrize("revision", ["", SHA])
def test_distill_records_the_commit_it_read_and_prints_the_pin_to_give(tiny_exports, tmp_path, monkeypatch,
                                                                       capsys, revision):
    calls, hub = [], FakeHub()
    monkeypatch.setitem(sys.modules, "datasets", fake_datasets(calls))
    monkeypatch.setitem(sys.modules, "huggingface_hub", types.SimpleNamespace(HfApi=lambda: hub))
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # cli.main runs in this process
    stage, train = distill_argv(tiny_exports["bert-tiny"], tmp_path, revision)
    assert cli.main(stage) == 0
    assert {c[2] for c in calls} == {SHA} and len(calls) == 3  # every language read at the commit
    assert hub.calls == ([] if revision else ["HuggingFaceFW/fineweb-2", "wikimedia/wikipedia"])
    fragment = (tmp_path / "student_stage.md").read_text(encoding="utf-8")
    record = json.loads((tmp_path / "student_stage.json").read_text(encoding="utf-8"))
    pins = f"HuggingFaceFW/fineweb-2@{SHA}, wikimedia/wikipedia@{SHA}"
    assert record["settings"]["stream revisions"] == pins
    printed = capsys.readouterr().err
    # Each configuration read says so at once: a long read of the streams is not a silent log.
    assert [line for line in printed.splitlines() if " read " in line and "documents" in line] == [
        "encoder-study student stage: read HuggingFaceFW/fineweb-2 deu_Latn (deu): 4 documents, "
        f"{4 * len(TEXT) + 4 * len('deu_Latn ') + 4 * 2:,} characters",
        "encoder-study student stage: read HuggingFaceFW/fineweb-2 fra_Latn (fra): 4 documents, "
        f"{4 * len(TEXT) + 4 * len('fra_Latn ') + 4 * 2:,} characters",
        "encoder-study student stage: read wikimedia/wikipedia 20231101.en (eng): 4 documents, "
        f"{4 * len(TEXT) + 4 * len('20231101.en ') + 4 * 2:,} characters"]
    for dataset in ("HuggingFaceFW/fineweb-2", "wikimedia/wikipedia"):
        if revision:
            assert f"{dataset}: revision {SHA} (pinned" in fragment
            assert f"{dataset} read at revision" not in printed
        else:
            assert f"{dataset}: revision {SHA}: the repository's current commit at this run, not pinned" \
                in fragment
            assert f"{dataset} read at revision {SHA} (not pinned: put it in the config" in printed
    # The distillation reads the staged file, never the network.
    monkeypatch.setitem(sys.modules, "datasets", None)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    assert cli.main(train) == 0
    distilled = json.loads((tmp_path / "student_distill.json").read_text(encoding="utf-8"))
    assert str(tmp_path / "corpus.jsonl") in {f["path"] for f in distilled["files"] if f["role"] == "input"}


def test_several_processes_refuse_an_empty_revision(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub",
                        types.SimpleNamespace(HfApi=lambda: FakeHub(error=AssertionError("no Hub call"))))
    streams = [{"dataset": "d/x", "revision": "", "configs": {"fra": "f"}}]
    with pytest.raises(StudentError, match=r"\['d/x'\]: with several processes every revision must be given"):
        sources.pin_streams(streams, None, world_size=2)


def test_pinned_streams_say_which_commit_the_config_gave(tmp_path):
    hub = FakeHub()
    (tmp_path / "e.jsonl").write_text("")
    streams = [{"dataset": "d/x", "revision": "", "configs": {"fra": "f"}},
               {"dataset": "d/y", "revision": SHA.upper(), "configs": {"deu": "g"}},
               {"dataset": "d/z", "revision": "", "configs": {"eng": "e"}, "local": str(tmp_path)}]
    pinned = sources.pin_streams(streams, {"fra": 1.0, "deu": 1.0, "eng": 1.0}, world_size=1, api=hub,
                              config_names=lambda dataset, revision: ["f", "g"])
    assert [(p.source.dataset, p.source.revision, p.given) for p in pinned] == [
        ("d/x", SHA, False), ("d/y", SHA, True), ("d/z", "", False)]
    assert hub.calls == ["d/x"]  # only the Hub source without a revision asks for the current commit
    with pytest.raises(StudentError, match=r"no amount of text given for languages \['eng'\]"):
        sources.pin_streams(streams, {"fra": 1.0, "deu": 1.0}, world_size=1, api=hub)


def test_a_misspelt_configuration_is_refused_before_any_document_is_read(tmp_path, monkeypatch):
    """student.corpus.streams names 225 configurations: one misspelt name fails at once, named, with
    every other one, before the first document of any configuration is streamed."""
    def no_reading(*args, **kwargs):
        raise AssertionError("a document was read")
    seen = []

    def names(dataset, revision):
        seen.append((dataset, revision))
        return ["fra_Latn", "deu_Latn"]
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=no_reading))
    (tmp_path / "20231101.fr.jsonl").write_text('{"text": "un"}\n')
    streams = [{"dataset": "HuggingFaceFW/fineweb-2", "revision": SHA,
                "configs": {"fra": "fra_Latn", "deu": "deu_Ltn", "ita": "ita_Latn"}},
               {"dataset": "wikimedia/wikipedia", "revision": "", "local": str(tmp_path),
                "configs": {"fra": "20231101.fr", "eng": "20231101.em"}}]
    with pytest.raises(StudentError) as err:
        sources.pin_streams(streams, None, world_size=1, config_names=names)
    message = str(err.value)
    assert message.startswith("3 streamed configuration(s) not found, before any document was read")
    for lang, config in (("deu", "deu_Ltn"), ("ita", "ita_Latn"), ("eng", "20231101.em")):
        assert f" {lang}: {config} (not among" in message
    assert "fra_Latn" not in message and "20231101.fr (" not in message
    assert seen == [("HuggingFaceFW/fineweb-2", SHA)]  # one call per Hub dataset; the local one reads files
    assert "fix the names in student.corpus.streams" in message
