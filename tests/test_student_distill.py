"""The distillation pieces: layer map, objective, PCA, EMA, data, and the training loop (resuming, ranks)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from encoder_study.core import tables
from encoder_study.encoders.tokens import PieceTokenizer
from encoder_study.provenance import artefacts
from encoder_study.recipes.student import StudentError, architecture, data, distill, objective, sources

ROOT = Path(__file__).resolve().parents[1]
TATOEBA = ROOT / "config" / "texts" / "tatoeba_sample.tsv"
UDHR = ROOT / "config" / "texts" / "udhr_sample"
# A student and a run small enough for a test: bert-tiny (2 x 16) teaches 2 x 16.
TINY_STUDENT = {"layers": 2, "width": 16, "heads": 2, "intermediate": 32, "embedding_width": 8,
                "max_positions": 32}
TINY_RUN = {"steps": 6, "batch_windows": 4, "window_lengths": [16, 24], "stats_windows": 8, "warmup": 2,
            "log_every": 2, "threads": 1, "lr": 3e-3, "ema_decay": 0.9}


# --- layer map -------------------------------------------------------------------------------------------

def test_uniform_layer_map_rounds_half_up_and_ends_at_the_final_state():
    assert objective.layer_map(6, 22) == [4, 7, 11, 15, 18, 22]  # the study's student and mmBERT
    assert objective.layer_map(3, 6) == [2, 4, 6]
    assert objective.layer_map(2, 3) == [2, 3]  # 1.5 rounds up
    assert objective.layer_map(1, 5) == [5]


@pytest.mark.parametrize("given, message", [([2, 4], "3 layers"), ([0, 2, 4], "from 1 to 6"),
                                            ([2, 7, 6], "from 1 to 6"), ([2, 2, 6], "increasing"),
                                            ([4, 2, 6], "increasing")])
def test_given_layer_map_is_checked(given, message):
    assert objective.layer_map(3, 6, [1, 3, 6]) == [1, 3, 6]
    with pytest.raises(StudentError, match=message):
        objective.layer_map(3, 6, given)


# --- objective -------------------------------------------------------------------------------------------

def _identity_objective(weights=None):
    obj = objective.Objective(2, 2, [1, 2], mean=torch.tensor([1.0, 1.0]), std=torch.tensor([2.0, 2.0]),
                              weights=weights)
    with torch.no_grad():
        for linear in obj.maps:
            linear.weight.copy_(torch.eye(2))
            linear.bias.zero_()
    return obj


def test_objective_on_hand_computed_values():
    # Two real tokens and one padding token whose (huge) values must not count.
    mask = torch.tensor([[1, 1, 0]])
    teacher = [torch.zeros(1, 3, 2),
               torch.tensor([[[1.0, 3.0], [0.0, 4.0], [50.0, -50.0]]]),   # layer-normalised: [-1, 1] twice
               torch.tensor([[[3.0, 1.0], [1.0, -1.0], [9.0, 9.0]]])]     # standardised: [1, 0], [0, -1]
    student_states = [torch.tensor([[[-1.0, 1.0], [1.0, 1.0], [1e3, 1e3]]]),   # squared errors 0 and 2
                      torch.tensor([[[1.0, 0.0], [1.0, 0.0], [-1e3, 7.0]]])]   # 0 and 1; cosines 1 and 0
    obj = _identity_objective({"hidden": 1.0, "final": 2.0, "cosine": 3.0})
    total, terms = obj(student_states, teacher, mask)
    # The layer norm's epsilon (1e-5 on variances 1 and 4) moves the targets by < 1e-5.
    assert terms["hidden"].item() == pytest.approx(1.0, abs=1e-4)      # (0 + 2) / 2 tokens
    assert terms["final"].item() == pytest.approx(0.5, abs=1e-6)
    assert terms["cosine"].item() == pytest.approx(0.5, abs=1e-6)
    assert total.item() == pytest.approx(1.0 + 2 * 0.5 + 3 * 0.5, abs=1e-4)
    # A global token count (another rank's two tokens) halves every term: ranks' losses add up.
    half_total, half = obj(student_states, teacher, mask, tokens=4.0)
    assert half_total.item() == pytest.approx(total.item() / 2, rel=1e-6)
    assert half["cosine"].item() == pytest.approx(0.25, abs=1e-6)


def test_objective_refuses_unknown_terms():
    with pytest.raises(ValueError, match="unknown loss terms"):
        _identity_objective({"cos": 1.0})


def test_feature_stats_merge_batches_exactly():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 5, 3, generator=gen) * 3 + 7, torch.randn(3, 4, 3, generator=gen)
    mask_a, mask_b = torch.ones(2, 5), torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    stats = objective.FeatureStats()
    stats.add(a, mask_a)
    stats.add(b, mask_b)
    mean, std = stats.result()
    real = torch.cat([a.reshape(-1, 3), b[mask_b.bool()]]).double()
    assert torch.allclose(mean.double(), real.mean(0), atol=1e-6)
    assert torch.allclose(std.double(), real.std(0, unbiased=False), atol=1e-6)


# --- PCA and EMA -----------------------------------------------------------------------------------------

def _low_rank_table(rows=300, width=12, rank=3, seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    scales = torch.tensor([5.0, 2.0, 1.0])[:rank]  # distinct variances: the components are unique
    basis, _ = torch.linalg.qr(torch.randn(width, rank, generator=gen))
    codes = torch.randn(rows, rank, generator=gen) * scales
    return codes @ basis.T + torch.randn(width, generator=gen)


def test_pca_recovers_a_low_rank_table_with_fixed_signs():
    table = _low_rank_table()
    reduced, components, mean = distill.pca(table, 3)
    assert reduced.shape == (300, 3) and components.shape == (3, 12)
    assert (reduced @ components + mean - table).abs().max().item() < 1e-5
    assert torch.allclose(components @ components.T, torch.eye(3), atol=1e-6)
    assert (reduced.var(0)[:-1] >= reduced.var(0)[1:]).all()  # largest variance first
    biggest = components.abs().argmax(dim=1)
    assert (components[torch.arange(3), biggest] > 0).all()
    # Reflecting the table through its mean leaves the covariance, so the signed components, unchanged.
    again, components_2, _ = distill.pca(2 * mean - table, 3)
    assert torch.allclose(components_2, components, atol=1e-6)
    assert torch.allclose(again, -reduced, atol=1e-5)
    assert torch.equal(distill.pca(table, 3)[1], components)  # and it is deterministic


def test_pca_init_lifts_the_reduced_table_back_when_widths_agree():
    table = _low_rank_table()
    config = architecture.StudentConfig(layers=1, width=12, heads=2, intermediate=8, embedding_width=3,
                                        max_positions=8)
    encoder = architecture.build(config, vocab_size=300, seed=0)
    distill.pca_init(encoder, table)
    with torch.no_grad():
        lifted = encoder.projection(encoder.tokens.weight)
    assert (lifted - table).abs().max().item() < 1e-5


def test_ema_known_updates():
    module = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        module.weight.fill_(1.0)
    plain, warm = distill.EMA(module, 0.5, warmup=False), distill.EMA(module, 0.99)
    with torch.no_grad():
        module.weight.fill_(3.0)
    for ema in (plain, warm):
        ema.update(module)
    assert plain.shadow["weight"].item() == 2.0                              # 0.5 * 1 + 0.5 * 3
    assert warm.shadow["weight"].item() == pytest.approx(2.8, abs=1e-6)       # rate min(0.99, 1/10)
    plain.update(module)
    warm.update(module)
    assert plain.shadow["weight"].item() == 2.5
    assert warm.shadow["weight"].item() == pytest.approx(2.8 * 2 / 11 + 3 * 9 / 11, abs=1e-6)


# --- data ------------------------------------------------------------------------------------------------

def test_language_weights_are_proportional_to_the_square_root():
    weights = data.language_weights({"fra": 400, "eng": 100, "xxx": 0}, power=0.5)
    assert list(weights) == ["eng", "fra"]
    assert weights["fra"] == pytest.approx(2 / 3) and weights["eng"] == pytest.approx(1 / 3)
    assert data.language_weights({"a": 400, "b": 100}, power=1.0)["a"] == pytest.approx(0.8)


def _synthetic_corpus() -> data.Corpus:
    # Stream values tell language (hundreds) and place, so a window shows where it came from.
    streams = {"aaa": np.arange(1000, 1400), "bbb": np.arange(2000, 2100), "ccc": np.arange(3000, 3005)}
    return data.Corpus(streams, {"aaa": 900, "bbb": 100, "ccc": 100}, prefix=[7], suffix=[8], power=0.5)


def test_windows_have_the_asked_lengths_specials_and_padding():
    corpus = _synthetic_corpus()
    seen_lengths = set()
    for step in range(20):
        batch = corpus.batch(seed=3, step=step, windows=6, lengths=(16, 32), pad_id=0)
        ids, mask = batch.input_ids.numpy(), batch.attention_mask.numpy()
        seen_lengths.add(ids.shape[1])
        for row, m, lang in zip(ids, mask, batch.langs, strict=True):
            real = row[m.astype(bool)]
            assert (m[:len(real)] == 1).all() and (row[len(real):] == 0).all()  # padding after the window
            assert real[0] == 7 and real[-1] == 8
            body = real[1:-1]
            assert (np.diff(body) == 1).all()  # consecutive pieces of one stream
            if lang == "ccc":
                assert len(real) == 7  # the whole short stream
            else:
                assert len(real) == ids.shape[1] and body[0] // 1000 == {"aaa": 1, "bbb": 2}[lang]
    assert seen_lengths == {16, 32}


def test_batches_are_a_function_of_seed_and_step_and_follow_the_weights():
    corpus = _synthetic_corpus()
    one = corpus.batch(seed=1, step=5, windows=8, lengths=(16,))
    assert torch.equal(one.input_ids, corpus.batch(seed=1, step=5, windows=8, lengths=(16,)).input_ids)
    assert not torch.equal(one.input_ids, corpus.batch(seed=1, step=6, windows=8, lengths=(16,)).input_ids)
    assert not torch.equal(one.input_ids, corpus.batch(seed=2, step=5, windows=8, lengths=(16,)).input_ids)
    langs = corpus.batch(seed=0, step=0, windows=4000, lengths=(16,)).langs
    expected = {"aaa": 3 / 5, "bbb": 1 / 5, "ccc": 1 / 5}  # sqrt(900) : sqrt(100) : sqrt(100)
    for lang, share in expected.items():
        assert langs.count(lang) / len(langs) == pytest.approx(share, abs=0.03)
    shard = one.rows(slice(1, None, 2))
    assert shard.langs == one.langs[1::2] and torch.equal(shard.input_ids, one.input_ids[1::2])


def test_corpus_from_documents_and_the_embedded_sample(tiny_exports):
    tokenizer = PieceTokenizer(tiny_exports["bert-tiny"] / "tokenizer.json")
    docs = [data.Document("eng", "the cat sat"), data.Document("fra", "le chat"),
            data.Document("eng", "a dog"), data.Document("deu", "")]
    corpus = data.Corpus.build(docs, tokenizer, None, 0.5)
    assert corpus.langs == ["eng", "fra"]  # no text, no language
    sep = list(tokenizer.suffix)
    first, _ = tokenizer.encode("the cat sat")
    second, _ = tokenizer.encode("a dog")
    assert corpus.streams["eng"].tolist() == first.tolist() + sep + second.tolist() + sep
    assert corpus.weights["eng"] == pytest.approx(math.sqrt(16) / (math.sqrt(16) + math.sqrt(7)))
    sample = sources.embedded_documents(TATOEBA, UDHR)
    assert len({d.lang for d in sample}) > 20 and all(d.text for d in sample)


def test_streamed_documents_read_pinned_revisions(monkeypatch):
    calls = []

    def load_dataset(name, config, split, streaming, revision):
        calls.append((name, config, split, streaming, revision))
        return iter([{"text": f"{config} one"}, {"text": "  "}, {"text": f"{config} two"},
                     {"text": f"{config} three"}])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    streams = [{"dataset": "HuggingFaceFW/fineweb-2", "revision": "A" * 40,
                "configs": {"fra": "fra_Latn", "deu": "deu_Latn"}, "max_documents": 3},
               {"dataset": "wikimedia/wikipedia", "revision": "d" * 40, "configs": {"fra": "20231101.fr"},
                "max_documents": 5, "max_chars": 30}]
    docs = list(sources.streamed_documents(streams))
    assert calls == [("HuggingFaceFW/fineweb-2", "deu_Latn", "train", True, "a" * 40),  # lowercased
                     ("HuggingFaceFW/fineweb-2", "fra_Latn", "train", True, "a" * 40),
                     ("wikimedia/wikipedia", "20231101.fr", "train", True, "d" * 40)]
    assert [(d.lang, d.text) for d in docs] == [
        ("deu", "deu_Latn one"), ("deu", "deu_Latn two"),  # 3 rows read, the blank one skipped
        ("fra", "fra_Latn one"), ("fra", "fra_Latn two"),
        ("fra", "20231101.fr one"), ("fra", "20231101.fr two")]  # 30 characters cap the third
    with pytest.raises(StudentError, match="no revision to stream at"):  # resolve_revisions first
        list(sources.streamed_documents([{"dataset": "x", "revision": "", "configs": {"fra": "f"}}]))


# --- training --------------------------------------------------------------------------------------------

def test_training_config_defaults_keys_and_schedule():
    config = distill.TrainingConfig.from_dict({"steps": 10, "warmup": 2, "lr": 1.0})
    assert [config.lr_at(s) for s in (0, 1, 2)] == [0.5, 1.0, 1.0]
    assert config.lr_at(6) == pytest.approx(0.5)  # linear: halfway through the 8 decay steps
    cosine = distill.TrainingConfig.from_dict({"steps": 10, "warmup": 2, "lr": 1.0, "schedule": "cosine",
                                             "min_lr_ratio": 0.2})
    assert cosine.lr_at(6) == pytest.approx(0.6)
    chunked = distill.TrainingConfig.from_dict({**dataclasses.asdict(cosine), "chunk_steps": 5})
    assert cosine.identity() == chunked.identity()  # chunks do not change the run
    with pytest.raises(StudentError, match="unknown keys"):
        distill.TrainingConfig.from_dict({"stepz": 3})


class Crash(Exception):
    """What the test-only stop raises: the process dies between two steps."""


def crash_before(monkeypatch, step: int) -> None:
    """Make the loop die just before it takes step `step` + 1, as a killed job would."""
    real = distill._Run.train_step

    def train_step(self):
        if self.step == step:
            raise Crash(f"stopped before step {step + 1}")
        real(self)

    monkeypatch.setattr(distill._Run, "train_step", train_step)


def _run(teacher_dir: Path, workdir: Path, chunk_steps: int = 0, **overrides) -> tuple[dict, ...]:
    config = dict(TINY_RUN, chunk_steps=chunk_steps, **overrides)
    return distill.distill(teacher_dir, sources.embedded_documents(TATOEBA, UDHR), TINY_STUDENT, config,
                         workdir / "checkpoint.pt", workdir / "student.pt", amounts=None, device=None,
                         progress=False)


def _states(workdir: Path) -> tuple[dict, dict]:
    saved = torch.load(workdir / "student.pt", weights_only=True)
    checkpoint = torch.load(workdir / "checkpoint.pt", weights_only=True)
    return saved, checkpoint


def test_a_run_resumed_after_a_crash_gives_the_uninterrupted_weights_bit_for_bit(tiny_exports, tmp_path,
                                                                                 monkeypatch):
    teacher = tiny_exports["bert-tiny"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    rows = _run(teacher, whole, chunk_steps=2)
    with monkeypatch.context() as patch:
        crash_before(patch, 3)  # after the save at step 2: step 3 is lost and taken again
        with pytest.raises(Crash):
            _run(teacher, resumed, chunk_steps=2)
    assert not (resumed / "student.pt").exists()
    assert torch.load(resumed / "checkpoint.pt", weights_only=True)["step"] == 2
    assert _run(teacher, resumed, chunk_steps=2) == rows
    # The same student, byte for byte: weights, log rows and chunk ranges alike.
    assert (resumed / "student.pt").read_bytes() == (whole / "student.pt").read_bytes()
    (saved_a, check_a), (saved_b, check_b) = _states(whole), _states(resumed)
    for a, b in ((saved_a["state_dict"], saved_b["state_dict"]), (check_a["student"], check_b["student"]),
                 (check_a["objective"], check_b["objective"])):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert saved_a["rows"] == saved_b["rows"] == list(rows)
    assert [r["step"] for r in saved_a["rows"]] == [2, 4, 6]
    assert [c["last_step"] for c in check_b["chunks"]] == [2, 4, 6]
    # Saving every chunk does not change the run: one save at the end gives the same weights.
    once = tmp_path / "once"
    _run(teacher, once)
    saved_c, check_c = _states(once)
    assert all(torch.equal(saved_a["state_dict"][k], saved_c["state_dict"][k]) for k in saved_a["state_dict"])
    assert [c["last_step"] for c in check_c["chunks"]] == [6]
    distill.write_log(saved_a["rows"], tmp_path / "training.csv")
    table = tables.read_csv(tmp_path / "training.csv")
    assert list(table[0]) == list(distill.LOG_COLUMNS)
    assert float(table[-1]["loss"]) == saved_a["rows"][-1]["loss"]
    # The EMA student loads as a post-norm encoder with the factorised table and runs.
    encoder, record = distill.load_student(whole / "student.pt")
    assert record["layer_map"] == [1, 2] and encoder.settings.embedding_width == 8
    out = encoder(torch.tensor([[2, 5, 6, 3]]), torch.ones(1, 4, dtype=torch.long))
    assert out.shape == (1, 4, 16) and torch.isfinite(out).all()
    # Another run's settings do not resume this checkpoint.
    with pytest.raises(distill.CheckpointError, match="lr"):
        distill.distill(teacher, sources.embedded_documents(TATOEBA, UDHR), TINY_STUDENT,
                      dict(TINY_RUN, lr=1e-3), resumed / "checkpoint.pt", resumed / "other.pt", amounts=None,
                      device=None, progress=False)


_RANK = """
import json, os
import torch.distributed as dist
from encoder_study.recipes.student import data, distill, sources
args = json.loads(os.environ["DISTILL_TEST"])
docs = sources.embedded_documents(args["tatoeba"], args["udhr"])
right = distill.shard
for name, shard in (("right", right), ("wrong", lambda rank, world: slice(0, None, world))):
    distill.shard = shard  # "wrong": every rank takes rank 0's windows
    out = os.path.join(args["dir"], name)
    os.makedirs(out, exist_ok=True)
    distill.distill(args["teacher"], docs, args["student"], args["run"], os.path.join(out, "checkpoint.pt"),
                  os.path.join(out, "student.pt"), amounts=None, device=None, progress=False)
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_ranks(teacher: Path, workdir: Path) -> tuple[dict, dict]:
    """Checkpoints of two runs on two gloo ranks (one process group): right and wrong sharding."""
    args = {"teacher": str(teacher), "tatoeba": str(TATOEBA), "udhr": str(UDHR), "student": TINY_STUDENT,
            "run": TINY_RUN, "dir": str(workdir)}
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, DISTILL_TEST=json.dumps(args), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-c", _RANK], env=env, stderr=subprocess.PIPE,
                                      text=True))
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    right, wrong = (torch.load(workdir / name / "checkpoint.pt", weights_only=True)
                    for name in ("right", "wrong"))
    return right, wrong


def test_two_ranks_match_one_process_over_the_global_batch(tiny_exports, tmp_path):
    """Two gloo processes, each with half of every batch, train the weights one process trains.

    Tolerance 1e-6: the ranks sum their halves' gradients (each a sum over its own tokens) where one
    process sums all tokens at once, so float additions happen in another order; nothing else differs.
    Taking the wrong windows (both ranks rank 0's) moves the weights by far more.
    """
    teacher = tiny_exports["bert-tiny"]
    one = tmp_path / "one"
    _run(teacher, one)
    _, single = _states(one)
    double, wrong = _two_ranks(teacher, tmp_path / "two")
    diffs = {k: (single["student"][k] - double["student"][k]).abs().max().item() for k in single["student"]}
    diffs.update({f"map.{k}": (single["objective"][k] - double["objective"][k]).abs().max().item()
                  for k in single["objective"]})
    worst = max(diffs.values())
    print(f"two ranks vs one process: max abs difference {worst:.3g} ({max(diffs, key=diffs.get)})")
    assert worst < 1e-6
    assert double["fingerprint"]["world_size"] == 2
    assert [r["tokens"] for r in double["rows"]] == [r["tokens"] for r in single["rows"]]
    for a, b in zip(single["rows"], double["rows"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    wrong_diff = max((single["student"][k] - wrong["student"][k]).abs().max().item()
                     for k in single["student"])
    print(f"with the wrong windows: {wrong_diff:.3g}")
    assert wrong_diff > 1e-4


# --- device, precision, progress -------------------------------------------------------------------------

def _distill(teacher, workdir, run=TINY_RUN, **kwargs):
    options = {"amounts": None, "device": "cpu", "progress": False, **kwargs}
    return distill.distill(teacher, sources.embedded_documents(TATOEBA, UDHR), TINY_STUDENT, run,
                         workdir / "checkpoint.pt", workdir / "student.pt", **options)


def test_bf16_autocast_trains_in_float32_weights_and_is_part_of_the_identity(tiny_exports, tmp_path, capsys):
    teacher = tiny_exports["bert-tiny"]
    fp32 = _distill(teacher, tmp_path / "fp32", precision="fp32", progress=True)
    bf16 = _distill(teacher, tmp_path / "bf16", precision="bf16")
    saved32, saved16 = (torch.load(tmp_path / d / "student.pt", weights_only=True) for d in ("fp32", "bf16"))
    assert saved16["fingerprint"]["precision"] == "bf16" and saved32["fingerprint"]["precision"] == "fp32"
    assert saved16["fingerprint"]["device"] == "cpu"
    assert all(v.dtype == torch.float32 for v in saved16["state_dict"].values() if v.is_floating_point())
    assert all(math.isfinite(r["loss"]) for r in bf16)
    # bf16 products round to 8 bits of mantissa: the losses are near the float32 ones, not equal.
    assert [r["loss"] for r in bf16] != [r["loss"] for r in fp32]
    assert bf16[-1]["loss"] == pytest.approx(fp32[-1]["loss"], rel=0.1)
    # Lines while it prepares, before the first step, so that a long preparation is not a silent log;
    # then a line per log row on stderr, with the time left; none without `progress`.
    err = capsys.readouterr().err.splitlines()
    first_step = next(i for i, line in enumerate(err) if line.startswith("distill: step"))
    preparing = [line for line in err[:first_step] if line.startswith("distill: ")]
    assert len(preparing) == 3, err
    assert preparing[0].endswith("languages: tokenizing")
    assert preparing[1].startswith("distill: corpus ready: ")
    assert "the teacher's feature statistics over" in preparing[2]
    # The bf16 run, without `progress`, said nothing.
    assert sum(line.startswith("distill: ") and not line.startswith("distill: step")
               and " saved to " not in line for line in err) == 3
    lines = [line for line in err if line.startswith("distill: step")]
    assert [line.split()[2] for line in lines] == ["2/6,", "4/6,", "6/6,"]
    assert all(" loss " in line and " elapsed 0:" in line and " left 0:" in line for line in lines)
    assert lines[-1].endswith("left 0:00:00")


def test_a_checkpoint_resumes_only_on_its_device_type_and_precision(tiny_exports, tmp_path, monkeypatch):
    """What a GPU's checkpoint meets on a CPU node: refused, naming the device (the fingerprint is the
    one a CUDA run writes; CUDA itself cannot run here)."""
    teacher, run = tiny_exports["bert-tiny"], dict(TINY_RUN, chunk_steps=2)
    with monkeypatch.context() as patch:
        crash_before(patch, 2)
        with pytest.raises(Crash):
            _distill(teacher, tmp_path, run, device="cpu")
    checkpoint = tmp_path / "checkpoint.pt"
    assert torch.load(checkpoint, weights_only=True)["step"] == 2
    with pytest.raises(distill.CheckpointError, match="precision: 'fp32' then, 'bf16' now"):
        _distill(teacher, tmp_path, run, precision="bf16")
    state = torch.load(checkpoint, weights_only=True)
    state["fingerprint"]["device"] = "cuda"
    torch.save(artefacts.seal(state), checkpoint)  # with the SHA-256 of its new content
    with pytest.raises(distill.CheckpointError, match="device: 'cuda' then, 'cpu' now"):
        _distill(teacher, tmp_path, run, device="cpu")
    assert not (tmp_path / "student.pt").exists()


def test_the_device_used_reaches_the_fragment(tiny_exports, tmp_path):
    from encoder_study import provenance

    _distill(tiny_exports["bert-tiny"], tmp_path, device="auto")
    facts = provenance.device()
    assert facts["torch device"].split(", ")[0] == "cpu"
    assert "fp32" in facts["torch precision"]
    assert facts["torch CUDA"] == "not available" and facts["torch CUDA build"] == "none (CPU build)"
