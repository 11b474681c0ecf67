"""``search_qa``: questions answered from a local corpus the policy searches with BM25 (``bm25s``).

Rows carry ``prompt`` (the question), ``answers`` (the accepted answers: a list of strings, or one) and ``corpus``
(a JSON Lines file of passages, each ``{"text": ...}`` with an optional ``"title"``; a JSON source's relative path
is taken from its file's folder). The environment's tool ``search(query)`` returns the best passages of the row's
corpus; the final answer is graded by the ``qa_exact_match`` and ``qa_f1`` rewards (``answers.py``: SQuAD's exact
match and token F1). bm25s is imported here, so a missing library is refused before start, naming the extra.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

try:
    import bm25s
except ImportError as exc:  # the environment loader turns this into one line naming the key, before start
    raise ImportError(f"{exc}; search_qa's BM25 is the bm25s library: pip install 'halo-core[rl]'") from exc


@functools.lru_cache(maxsize=16)
def _index(path: str, stamp: float):
    """The corpus's passages and their BM25 index, built once per process (``stamp``: the file's mtime)."""
    passages = []
    with open(path) as lines:
        for number, line in enumerate(lines, 1):
            if line.strip():
                row = json.loads(line)
                if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                    raise ValueError(f"corpus {path!r} line {number}: each passage is a JSON object with a 'text' string")
                passages.append(row)
    if not passages:
        raise ValueError(f"corpus {path!r} holds no passages")
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([f"{p.get('title', '')} {p['text']}" for p in passages], stopwords="en", show_progress=False),
                    show_progress=False)
    return passages, retriever


class SearchQA:
    """One rollout's question over its corpus; subclass it to change how many passages a search returns."""

    top_k = 3

    def reset(self, corpus=None, **row) -> None:
        if not corpus or not Path(corpus).is_file():
            raise ValueError(f"environment 'search_qa': corpus {corpus!r} is not a JSON Lines file of passages here")
        self._passages, self._retriever = _index(str(Path(corpus).resolve()), Path(corpus).stat().st_mtime)

    def search(self, query: str) -> str:
        """Search the corpus for passages about a query.

        Args:
            query: Words to look for, e.g. "river Halden".

        Returns:
            The best matching passages, best first.
        """
        tokens = bm25s.tokenize([str(query)], stopwords="en", show_progress=False)
        k = min(self.top_k, len(self._passages))
        found, scores = self._retriever.retrieve(tokens, k=k, show_progress=False)
        hits = [self._passages[int(i)] for i, score in zip(found[0], scores[0]) if score > 0]
        if not hits:
            return "no passage matches"
        return "\n".join(f"[{n}] {p.get('title') + ': ' if p.get('title') else ''}{p['text']}" for n, p in enumerate(hits, 1))
