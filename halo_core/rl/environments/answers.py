"""SQuAD's answer metrics as rewards (``qa_exact_match``, ``qa_f1``): the final message's answer against the row's
``answers`` (a list of accepted strings, or one), the best of them. The answer is the final message's text after its
last ``Answer:``, or all of it; both sides are normalised as SQuAD's evaluation script does (lower case, punctuation
and the articles ``a``, ``an``, ``the`` dropped, whitespace collapsed). The ``search_qa`` environment's graders; any
question-answering run may use them.
"""

from __future__ import annotations

import collections
import re
import string

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
