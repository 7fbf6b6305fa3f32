"""The preflight (recipe `preflight`) against a local server that answers as the Hugging Face Hub and the
download hosts do for the few calls it makes; never the real network (`no_network` refuses any other
host). Each fault is named in one line: a misspelt dataset configuration, a missing revision, a missing
weights file, a moved URL, an unpinned URL (a warning), a full disk; an unreachable host is one line."""

from __future__ import annotations

import json
import re
import shutil
import socket
import threading
import time
from collections import namedtuple
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import cli_runner
from encoder_study.core import cluster
from encoder_study.recipes import preflight
from encoder_study.recipes.preflight import plan, remote

COMMIT = "a" * 40
OTHER = "b" * 40
# The dataset card's configurations, as the Hub's API gives them (cardData.configs).
CARD = {"configs": [{"config_name": c, "data_files": [{"split": "train", "path": f"data/{c}/*"}]}
                    for c in ("afr_Latn", "deu_Latn")]}
FILES = {"config.json": 600, "tokenizer.json": 9_000_000, "model.safetensors": 1_100_000_000}


class Hub(BaseHTTPRequestHandler):
    """The Hub's model and dataset API at a revision, HEAD of resolve/<commit>/<file>, and plain files."""

    def log_message(self, *args):  # quiet
        pass

    def _send(self, status, body=b"", headers=None):
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    def _route(self):
        path = self.path
        if path.startswith("/api/models/"):
            repo, _, revision = path.removeprefix("/api/models/").partition("/revision/")
            if revision != COMMIT:
                return self._send(404, headers={"X-Error-Code": "RevisionNotFound"})
            names = [n for n in FILES if not (repo == "org/noweights" and n.endswith(".safetensors"))]
            body = {"sha": COMMIT, "siblings": [{"rfilename": n} for n in names]}
            return self._send(200, json.dumps(body).encode())
        if "/resolve/" in path:
            file = path.rsplit("/", 1)[1]
            if file.endswith(".safetensors"):  # large files: a redirect to storage, the size in a header
                return self._send(302, headers={"Location": "http://127.0.0.1:9/storage",
                                                "X-Linked-Size": str(FILES[file])})
            return self._send(200, headers={"Content-Length": str(FILES[file])})
        if path.startswith("/api/datasets/"):
            repo, _, revision = path.removeprefix("/api/datasets/").partition("/revision/")
            if revision not in (COMMIT, "main"):
                return self._send(404, headers={"X-Error-Code": "RevisionNotFound"})
            return self._send(200, json.dumps({"sha": COMMIT, "cardData": CARD}).encode())
        if path == "/files/train.conllu":
            return self._send(200, headers={"Content-Length": "13000000"})
        if path == "/files/moved.conllu":
            return self._send(301, headers={"Location": "/files/gone.conllu"})
        return self._send(404)

    do_GET = do_HEAD = _route


@pytest.fixture
def no_network(monkeypatch):
    """Any name but the loopback's is refused: a test that reached the real network would fail."""
    real = socket.getaddrinfo

    def loopback_only(host, *args, **kwargs):
        if host not in ("127.0.0.1", "localhost"):
            raise OSError(f"test reached for the network: {host}")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", loopback_only)


@pytest.fixture
def hub(monkeypatch, no_network):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HF_ENDPOINT", base)
    yield base
    server.shutdown()
    server.server_close()


def config(base, models=None, streams=None, treebank=None):
    """A config as the rule passes it (preflight.smk's preflight_config), every source on the server."""
    return {
        "models": models or [{"name": "xlmr", "source": "hf", "repo": "org/model", "revision": COMMIT}],
        "retrieval": {"model": "xlmr"},
        "texts": {"tatoeba": "config/texts/tatoeba_sample.tsv", "tatoeba_sha256": "",
                  "udhr": "config/texts/udhr_sample", "udhr_sha256": ""},
        "treebank": treebank or {"source": "synthetic", "extra_tests": {}},
        "tagging": {"device": "auto", "runs": []},
        "student": {"device": "auto", "processes": 1,
                    "corpus": {"source": "stream", "streams": streams or [
                        {"dataset": "HuggingFaceFW/fineweb-2", "revision": COMMIT,
                         "configs": {"afr": "afr_Latn", "deu": "deu_Latn"}}]}},
        "rehearsal": {"enabled": False},
    }


def checks_of(cfg, sizes=None):
    return plan.run_tasks(plan.source_tasks(cfg, remote.Client(timeout=5), sizes or remote.Sizes()))


def failing(checks):
    return preflight.failures(checks)


def test_a_good_config_passes_with_every_file_and_its_size(hub):
    sizes = remote.Sizes()
    checks = checks_of(config(hub), sizes)
    assert failing(checks) == [], checks
    weights = next(c for c in checks if c.where.endswith("/model.safetensors"))
    assert weights.status == "ok" and "1,100,000,000 bytes" in weights.found  # from X-Linked-Size
    assert {c.where.rsplit("/", 1)[1] for c in checks if c.what == "hub file xlmr"} == set(FILES)
    assert sizes.exports["xlmr"] == FILES["model.safetensors"]
    assert any(c.what == "hub dataset configs HuggingFaceFW/fineweb-2" and c.status == "ok"
               and c.found.startswith("2 of 2") for c in checks)


def test_a_misspelt_dataset_configuration_is_one_line(hub):
    streams = [{"dataset": "HuggingFaceFW/fineweb-2", "revision": COMMIT,
                "configs": {"afr": "afr_Latn", "deu": "deu_Latnn"}}]
    lines = failing(checks_of(config(hub, streams=streams)))
    assert len(lines) == 2  # the dataset's summary row and the configuration's own
    assert any("deu_Latnn" in line and "closest: 'deu_Latn'" in line for line in lines), lines


def test_a_missing_revision_is_one_line(hub):
    models = [{"name": "xlmr", "source": "hf", "repo": "org/model", "revision": OTHER}]
    lines = failing(checks_of(config(hub, models=models)))
    assert lines == [f"hub model xlmr (org/model@{OTHER}): no revision {OTHER} in model repository "
                     "org/model (HTTP 404): fix the revision"]


def test_a_missing_weights_file_is_one_line(hub):
    models = [{"name": "xlmr", "source": "hf", "repo": "org/noweights", "revision": COMMIT}]
    lines = failing(checks_of(config(hub, models=models)))
    assert len(lines) == 1 and "*.safetensors" in lines[0] and "no such file" in lines[0], lines


def test_a_moved_url_is_one_line_and_an_unpinned_one_a_warning(hub):
    treebank = {"source": "ewt", "train": f"{hub}/files/train.conllu", "train_sha256": "",
                "dev": f"{hub}/files/moved.conllu", "dev_sha256": "", "test": f"{hub}/files/train.conllu",
                "test_sha256": "ab" * 32, "extra_tests": {}}
    checks = checks_of(config(hub, treebank=treebank))
    lines = failing(checks)
    assert len(lines) == 1 and lines[0].startswith("treebank.dev") and "HTTP 404" in lines[0], lines
    assert "redirected to" in lines[0] and "gone.conllu" in lines[0]
    train = next(c for c in checks if c.what == "treebank.train")
    assert train.status == "warning" and "not pinned: the first run prints `pin:" in train.found
    assert "13.00 MB" in train.found
    assert next(c for c in checks if c.what == "treebank.test").status == "ok"  # pinned


def test_a_full_disk_is_one_line(hub):
    sizes = remote.Sizes()
    checks_of(config(hub), sizes)
    usage = namedtuple("usage", "total used free")
    check = plan.disk(sizes, "results", usage=lambda path: usage(10**10, 10**10 - 10**6, 10**6))
    assert check.status == "fail" and "not enough space" in check.found
    assert preflight.failures([check]) == [f"disk (results): {check.found}"]
    roomy = plan.disk(sizes, "results", usage=lambda path: usage(10**13, 0, 10**13))
    assert roomy.status == "ok"


@pytest.mark.parametrize("architecture", [f"config/models/{name}.json"
                                          for name in ("bert-tiny", "modernbert-tiny", "xlmr-tiny")])
def test_a_twins_disk_is_counted_from_its_shapes_as_the_build_makes_it(architecture, tmp_path, hub):
    """A rehearsal's twins are BGE-M3's size: their snapshot and export count in the disk estimate, from
    a parameter count on the meta device that equals what encoders.tiny.build makes."""
    from encoder_study.encoders import tiny

    built = tiny.build(architecture, 0, tmp_path / "twin")["parameters"]
    assert plan.twin_parameters(architecture) == built
    sizes = remote.Sizes()
    checks = checks_of(config(hub, models=[{"name": "twin", "source": "tiny", "architecture": architecture,
                                            "seed": 0}]), sizes)
    twin = next(c for c in checks if c.what == "tiny model twin")
    assert twin.status == "ok" and f"{built:,} parameters" in twin.found
    assert sizes.exports["twin"] == 8 * built


def test_an_unreachable_host_is_one_line_and_ends_at_once(monkeypatch, no_network):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")  # nothing listens: refused
    models = [{"name": n, "source": "hf", "repo": f"org/{n}", "revision": COMMIT} for n in ("a", "b", "c")]
    started = time.monotonic()
    checks = checks_of(config("", models=models))
    lines = failing(checks)
    assert time.monotonic() - started < 5
    assert len(lines) == 1 and lines[0].startswith("127.0.0.1: cannot connect"), lines
    assert "3 more check(s) of this host skipped" in lines[0]  # two models and the dataset: not asked


def test_cuda_asked_with_a_cpu_build_of_torch_fails():
    import torch

    if torch.version.cuda:
        pytest.skip("this torch is a CUDA build")
    cfg = config("")
    cfg["student"]["device"] = "cuda"
    lines = preflight.failures(plan.software(cfg, []))
    assert len(lines) == 1 and "student.device is cuda" in lines[0], lines
    assert preflight.failures(plan.software(config(""), ["tagging_train"]))  # GPUs asked, CPU build
    cfg = config("")
    cfg["rehearsal"]["enabled"] = True  # the rehearsal runs the GPU rules on the CPU by design
    assert preflight.failures(plan.software(cfg, ["tagging_train"])) == []


def test_the_cluster_check_is_the_workflows_own():
    """With the Slurm profile, every job's request against the nodes (core.cluster.problems): one line per
    rule naming the key, as the check at the workflow's start."""
    nodes = [cluster.Node("cpu", 2, 8000, 0, float("inf")), cluster.Node("gpu", 2, 8000, 1, float("inf"))]
    requests = {"parity_latency": {"threads": 8, "mem_mb": 1000, "runtime": 10, "gpus": 0,
                                   "threads_key": "parity.latency_threads"},
                "export_model": {"threads": 1, "mem_mb": 1000, "runtime": 10, "gpus": 0,
                                 "threads_key": "threads.default"}}
    checks = plan.cluster_checks(requests, None, "slurm", read_nodes=lambda: nodes)
    lines = preflight.failures(checks)
    assert len(lines) == 2 and "1 of 2 rules' jobs fit" in lines[0]
    assert "parity_latency asks for 8 CPUs (parity.latency_threads), the largest node has 2" in lines[1]
    assert plan.cluster_checks(requests, None, "none")[0].status == "skipped"


def test_the_commands_write_the_table_and_fail_naming_each_failure(hub, tmp_path, capsys):
    models = [{"name": "xlmr", "source": "hf", "repo": "org/model", "revision": OTHER}]
    out, md = tmp_path / "preflight.json", tmp_path / "preflight.md"
    prov = tmp_path / "p" / "preflight_check.md"
    run = cli_runner("preflight")
    assert run("check", "--config", json.dumps(config(hub, models=models)), "--requests", "{}", "--cluster",
               "none", "--results-dir", str(tmp_path), "--out", str(out), "--markdown", str(md),
               "--provenance", str(prov)) == 0
    assert out.is_file() and prov.is_file() and "| what | where | found | ok |" in md.read_text()
    capsys.readouterr()
    assert run("verdict", "--table", str(out)) == 2
    err = capsys.readouterr().err
    assert "1 failure(s):\nhub model xlmr" in err and "Traceback" not in err
    shutil.rmtree(tmp_path / "p")


def test_the_rehearsal_passes_offline_and_writes_the_table(tmp_path):
    """`snakemake preflight` with config/rehearsal.yaml over config/paper.yaml: every source is local (twins,
    the embedded texts, the synthetic treebank, PUD's stand-in, the streams' stand-ins that rule
    rehearsal_streams writes), so it passes without the network; the Hub endpoint points nowhere."""
    import os
    import subprocess
    import sys

    from conftest import copy_workflow

    copy = copy_workflow(tmp_path / "wf")
    env = dict(os.environ, HF_ENDPOINT="http://127.0.0.1:1")
    done = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "preflight", "--configfile",
                           "config/paper.yaml", "config/rehearsal.yaml"], cwd=copy, env=env,
                          capture_output=True, text=True, timeout=300)
    table = json.loads((copy / "results/preflight/preflight.json").read_text())
    statuses = {c["what"]: c["status"] for c in table["checks"]}
    # The twins' snapshots and exports count (about 9.2 GB): twice 4 bytes per parameter each check
    # names, and a machine with less free space than that is told so.
    found = {c["what"]: c["found"] for c in table["checks"]}
    counts = [int(re.search(r"([\d,]+) parameters", found[f"tiny model {n}"]).group(1).replace(",", ""))
              for n in ("xlm-roberta-base", "mmbert-base", "bge-m3")]
    need = int(re.search(r"\(([\d,]+) bytes\) needed", found["disk"]).group(1).replace(",", ""))
    assert need == 8 * sum(counts) and sum(counts) > 10**9
    roomy = shutil.disk_usage(copy).free >= need
    assert done.returncode == (0 if roomy else 1), done.stdout + done.stderr
    assert statuses.pop("disk") == ("ok" if roomy else "fail")
    assert statuses["local stream wikimedia/wikipedia"] == "ok" and "fail" not in statuses.values()
    assert statuses["tiny model bge-m3"] == "ok"
    assert (copy / "results/preflight/preflight.md").is_file()
