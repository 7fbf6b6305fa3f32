"""A document as the encoders take it: a text and its words as character ranges.

Here, below both the readers that make documents (`data.conllu`) and the encoders that take them
(`tokens`, which re-exports it as `tokens.Doc`), so that a reader need not import an encoder's module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Doc:
    """A text and its words as character ranges [start, end) into it; immutable and hashable.

    Equal documents (same text, same ranges) are the same document for caching.
    """

    text: str
    words: tuple[tuple[int, int], ...] = ()

    def __post_init__(self):
        if not isinstance(self.text, str):
            raise TypeError(f"Doc.text must be a str, not {type(self.text).__name__}")
        words = tuple((int(start), int(end)) for start, end in self.words)
        for i, (start, end) in enumerate(words):
            if not 0 <= start <= end <= len(self.text):
                raise ValueError(
                    f"word {i} has range [{start}, {end}), not within the text of {len(self.text)} "
                    f"characters {_snippet(self.text)!r}; ranges must satisfy 0 <= start <= end <= len(text)")
        object.__setattr__(self, "words", words)  # lists in, tuples stored: hashable

    @classmethod
    def from_words(cls, words: Sequence[str], sep: str = " ") -> Doc:
        """The words joined by `sep`, each word's range pointing at its place in the joined text."""
        ranges, start = [], 0
        for word in words:
            ranges.append((start, start + len(word)))
            start += len(word) + len(sep)
        return cls(sep.join(words), tuple(ranges))

    def word(self, i: int) -> str:
        start, end = self.words[i]
        return self.text[start:end]


def _snippet(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
