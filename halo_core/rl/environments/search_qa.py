"""``search_qa``: questions answered from a local corpus the policy searches with BM25 (``bm25s``).

Rows carry ``prompt`` (the question), ``answers`` (the accepted answers: a list of strings, or one) and ``corpus``
(a JSON Lines file of passages, each ``{"text": ...}`` with an optional ``"title"``; a JSON source's relative path
is taken from its file's folder). The environment's tool ``search(query)`` returns the best passages of the row's
corpus; the final answer is graded by the ``qa_exact_match`` and ``qa_f1`` rewards, SQuAD's exact match and token
F1 against the best of ``answers`` after SQuAD's normalisation (lower case, no punctuation, no articles ``a``,
``an``, ``the``, single spaces). The answer is the final message's text after its last ``Answer:``, or all of it.
"""

from __future__ import annotations

import collections
import functools
import json
import re
import string
from pathlib import Path

from halo_core.errors import ConfigError

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize(answer: str) -> str:
    """SQuAD's normalisation (its evaluation script's ``normalize_answer``)."""
    answer = "".join(ch for ch in str(answer).lower() if ch not in set(string.punctuation))
    return " ".join(_ARTICLES.sub(" ", answer).split())


def exact_match(prediction: str, truth: str) -> float:
    return float(normalize(prediction) == normalize(truth))


def token_f1(prediction: str, truth: str) -> float:
    """The harmonic mean of token precision and recall after normalisation (SQuAD's ``f1_score``)."""
    predicted, true = normalize(prediction).split(), normalize(truth).split()
    common = sum((collections.Counter(predicted) & collections.Counter(true)).values())
    if not predicted or not true:
        return float(predicted == true)
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(true)
    return 2 * precision * recall / (precision + recall)


def answer_of(completion) -> str:
    """The answer a completion gives: its final message's text after the last ``Answer:``, or all of it."""
    if not isinstance(completion, str):
        completion = next((m.get("content") or "" for m in reversed(completion)
                           if m.get("role", "assistant") == "assistant" and m.get("content")), "")
    return re.split(r"answer\s*:", completion, flags=re.I)[-1].strip()


def _best(metric, completions, answers) -> list[float]:
    rewards = []
    for completion, accepted in zip(completions, answers):
        accepted = [accepted] if isinstance(accepted, str) else list(accepted or [])
        rewards.append(max((metric(answer_of(completion), truth) for truth in accepted), default=0.0))
    return rewards


def qa_exact_match(prompts, completions, answers, **kwargs) -> list[float]:
    """1.0 when the answer equals one of the row's ``answers`` after SQuAD's normalisation."""
    return _best(exact_match, completions, answers)


def qa_f1(prompts, completions, answers, **kwargs) -> list[float]:
    """SQuAD's token F1 of the answer against the best of the row's ``answers``."""
    return _best(token_f1, completions, answers)


def _bm25s():
    try:
        import bm25s
    except ImportError:
        raise ConfigError("environment: 'search_qa' needs the bm25s library; install it with pip install 'halo-core[rl]'") from None
    return bm25s


@functools.lru_cache(maxsize=16)
def _index(path: str, stamp: float):
    """The corpus's passages and their BM25 index, built once per process (``stamp``: the file's mtime)."""
    bm25s = _bm25s()
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
        bm25s = _bm25s()
        tokens = bm25s.tokenize([str(query)], stopwords="en", show_progress=False)
        k = min(self.top_k, len(self._passages))
        found, scores = self._retriever.retrieve(tokens, k=k, show_progress=False)
        hits = [self._passages[int(i)] for i, score in zip(found[0], scores[0]) if score > 0]
        if not hits:
            return "no passage matches"
        return "\n".join(f"[{n}] {p.get('title') + ': ' if p.get('title') else ''}{p['text']}" for n, p in enumerate(hits, 1))
