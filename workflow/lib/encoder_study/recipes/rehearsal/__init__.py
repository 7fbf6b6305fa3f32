"""The full study rehearsed at full size on one CPU machine (config/rehearsal.yaml over config/paper.yaml).

Two jobs. `write_streams` writes the stand-ins of the student's streamed corpora: for each stream and
language, a `<config>.jsonl` of generated documents in the dataset's row format, which the streaming
reader then reads through `datasets` as it reads the Hub (encoder_study.recipes.student.data, `local`).

`resources` (`rehearsal.resources`, apart: a reader of the run's record) reads what every job of
the run measured (its fragment's peak resident memory and seconds, and Snakemake's benchmark file
where the rule writes one), puts it beside what the config's `resources` ask for each rule, and
`check` refuses a request below its measured peak:

    rows = resources(rules, "provenance", "results/benchmarks", margin=1.5)
    problems = check(rows)   # one line per rule whose mem_mb is below its peak

The peak is the larger of two measurements: the fragment's (`provenance.peak_rss_mb`: the kernel's
high-water marks of the command and of the children it waited for) and the benchmark's max_rss
(Snakemake samples every second for 30 s, then every 30 s, so it can miss a short peak).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from ...core import files
from ...core.errors import UserError


class RehearsalError(UserError):
    pass


# ---------------------------------------------------------------------------------------------------------
# Stand-ins for the streamed corpora

# Letters of the generated words by ISO 15924 script (FineWeb-2's configs end in it: fra_Latn); a
# config without one (Wikipedia's 20231101.fr) writes Latin letters.
_SCRIPTS = {
    "Latn": "abcdefghijklmnopqrstuvwxyzàéèçöüñ",
    "Cyrl": "абвгдеёжзийклмнопрстуфхцчшщыэюя",
    "Grek": "αβγδεζηθικλμνξοπρστυφχψω",
    "Arab": "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "Hebr": "אבגדהוזחטיכלמנסעפצקרשת",
    "Deva": "अआइईउऊएऐओऔकखगघचछजझटठडढणतथदधनपफबभमयरलवशषसह",
    "Thai": "กขคงจฉชซญดตถทธนบปผพฟมยรลวศสหอฮ",
    "Hani": "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年",
    "Jpan": "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをん",
    "Hang": "가나다라마바사아자차카타파하거너더러머버서어저처커터퍼허",
}
_SCRIPTS["Kore"] = _SCRIPTS["Hang"]
_SCRIPTS["Hans"] = _SCRIPTS["Hant"] = _SCRIPTS["Hani"]


def _letters(config: str) -> str:
    script = config.rsplit("_", 1)[-1] if "_" in config else "Latn"
    return _SCRIPTS.get(script, _SCRIPTS["Latn"])


def _document(rng: np.random.Generator, letters: str, words: int) -> str:
    """`words` generated words of 1-9 letters, a sentence end every 6-20 words."""
    out, sentence = [], int(rng.integers(6, 21))
    for i in range(words):
        word = "".join(letters[j] for j in rng.integers(0, len(letters), size=int(rng.integers(1, 10))))
        out.append(word + ("." if (i + 1) % sentence == 0 else ""))
    return " ".join(out)


def _row(dataset: str, config: str, index: int, text: str) -> dict:
    """One row as the dataset gives it (FineWeb-2's and Wikipedia's fields), else `id` and `text`."""
    ident = f"rehearsal-{config}-{index}"
    if "fineweb" in dataset.lower():
        lang, _, script = config.partition("_")
        return {"text": text, "id": ident, "dump": "rehearsal", "url": f"https://example.org/{ident}",
                "date": "2024-01-01T00:00:00Z", "file_path": "rehearsal", "language": lang,
                "language_score": 1.0, "language_script": script, "minhash_cluster_size": 1,
                "top_langs": json.dumps({config + "_score": 1.0})}
    if "wikipedia" in dataset.lower():
        return {"id": str(index), "url": f"https://example.org/wiki/{ident}", "title": ident, "text": text}
    return {"id": ident, "text": text}


def write_streams(streams: Iterable[Mapping], documents: int, words: int, seed: int) -> list[Path]:
    """Write `documents` generated documents of `words` words for every (stream, language), from `seed`,
    into `<stream's local directory>/<config>.jsonl`, where the reader looks for them."""
    written = []
    for s_index, stream in enumerate(sorted(streams, key=lambda s: s["dataset"])):
        if not stream.get("local"):
            raise RehearsalError(f"stream {stream['dataset']}: no `local` directory for its stand-ins")
        for c_index, config in enumerate(sorted(stream["configs"].values())):
            rng = np.random.default_rng([seed, s_index, c_index])
            letters = _letters(config)
            lines = [json.dumps(_row(stream["dataset"], config, i, _document(rng, letters, words)),
                                ensure_ascii=False) for i in range(documents)]
            path = Path(stream["local"]) / f"{config}.jsonl"
            files.write_text(path, "\n".join(lines) + "\n")
            written.append(path)
    return sorted(written)


# ---------------------------------------------------------------------------------------------------------
# Resources from measurement


