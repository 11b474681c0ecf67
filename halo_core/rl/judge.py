"""``llm_judge``: a reward graded by a language model behind any OpenAI-compatible endpoint.

Each completion is sent, with its prompt and a rubric, to ``{base_url}/chat/completions`` (stdlib HTTP; the
``Authorization: Bearer`` header from ``api_key`` or ``OPENAI_API_KEY``) and the judge replies with a whole number from
0 to ``max_score``; the reward is that number over ``max_score``. Arguments come from ``reward_kwargs: {llm_judge: ...}``:

- ``base_url`` (``http://host:8000/v1``) and ``model`` (the served model's name): a judge that already runs (vLLM,
  SGLang, a hosted API);
- ``model`` alone, a local model folder: Halo serves it as the judge itself, one server subprocess per training
  process on a free port of 127.0.0.1 (``halo_core.testing.engine_server``'s chat endpoint, greedy), ended with the
  process; no network;
- ``rubric`` (a ``rubric`` column, when the data has one, replaces it row by row), ``max_score`` (10),
  ``timeout_s`` (60, per request), ``retries`` (2, of a request that timed out or failed), ``failed_score`` (0.0:
  the reward of a completion whose judgement never came or could not be read), ``max_tokens`` (16),
  ``temperature`` (0.0), ``concurrency`` (8 requests at a time).

A reply is malformed when it has no ``choices[0].message.content`` or its first number is not within 0 to
``max_score``; it is not retried. Every batch logs ``llm_judge/timeouts``, ``llm_judge/errors`` and
``llm_judge/malformed`` (counts, through TRL's ``log_metric``) and one warning line when any is above 0.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from halo_core.rl.rewards import text

DEFAULT_RUBRIC = "The answer is correct and says nothing else."
INSTRUCTION = ("Grade the answer against the rubric.\nRubric: {rubric}\nQuestion: {question}\nAnswer: {answer}\n"
               "Reply with one whole number from 0 to {max_score} ({max_score}: the answer meets the rubric fully).")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_log = logging.getLogger(__name__)


class _Failed(Exception):
    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind


def score_of(reply: dict, max_score: float) -> float:
    """The judgement in an OpenAI chat reply, over ``max_score``; ``_Failed('malformed')`` if it has none."""
    try:
        content = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise _Failed("malformed", f"no choices[0].message.content in {json.dumps(reply)[:200]}") from None
    found = _NUMBER.search(content or "")
    if found is None or not 0 <= float(found[0]) <= max_score:
        raise _Failed("malformed", f"no score from 0 to {max_score:g} in {content!r:.200}")
    return float(found[0]) / max_score


def _post(url: str, body: dict, api_key: str | None, timeout_s: float) -> dict:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            raw = response.read()
    except (TimeoutError, socket.timeout) as exc:
        raise _Failed("timeouts", f"{url}: no reply in {timeout_s:g} s") from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, (TimeoutError, socket.timeout)):
            raise _Failed("timeouts", f"{url}: no reply in {timeout_s:g} s") from exc
        raise _Failed("errors", f"{url}: {exc}") from exc
    except OSError as exc:  # connection reset mid-reply
        raise _Failed("errors", f"{url}: {exc}") from exc
    try:
        return json.loads(raw)
    except ValueError:
        raise _Failed("malformed", f"{url}: not JSON: {raw[:200]!r}") from None


def judge_one(url: str, body: dict, api_key: str | None, timeout_s: float, retries: int, max_score: float) -> float:
    """One judgement: the request retried after a timeout or failure, ``_Failed`` when none came or it is malformed."""
    for attempt in range(retries + 1):
        try:
            reply = _post(url, body, api_key, timeout_s)
            break
        except _Failed as failed:
            if failed.kind == "malformed" or attempt == retries:
                raise
    return score_of(reply, max_score)


def _question(prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content") or "" for m in prompt if m.get("role") == "user"]
    return users[-1] if users else text(prompt)


@functools.lru_cache(maxsize=None)
def local_judge(folder: str) -> str:
    """The base URL of ``folder`` served as the judge by this process's own subprocess (started once, ended at exit or
    with this process)."""
    def die_with_parent():  # PR_SET_PDEATHSIG: a trainer killed outright takes its judge along
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)

    errors = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe nobody reads: a chatty server would fill one and stall
    server = subprocess.Popen([sys.executable, "-m", "halo_core.testing.engine_server", "--model", folder, "--port", "0"],
                              stdout=subprocess.PIPE, stderr=errors, text=True, preexec_fn=die_with_parent)
    atexit.register(lambda: (server.kill(), server.wait()))
    first = {}
    reader = threading.Thread(target=lambda: first.setdefault("line", server.stdout.readline()), daemon=True)
    reader.start()
    reader.join(300.0)
    found = re.search(r"serving on (\S+)", first.get("line", ""))
    if found is None:
        ended = "line" in first  # its stdout closed: it exited, and its last error line says why
        if ended:
            server.wait(30.0)
        server.kill()
        errors.seek(0)
        error = errors.read().strip().splitlines()[-1:] if ended else ["no reply in 300 s"]
        raise RuntimeError(f"llm_judge: serving {folder!r} as the judge failed: {error[0] if error else 'no message'}")
    return f"http://{found[1]}/v1"


def llm_judge(prompts, completions, base_url: str | None = None, model: str | None = None, rubric=DEFAULT_RUBRIC,
              api_key: str | None = None, max_score: float = 10, timeout_s: float = 60.0, retries: int = 2, failed_score: float = 0.0,
              max_tokens: int = 16, temperature: float = 0.0, concurrency: int = 8, log_metric=None, **columns) -> list[float]:
    if base_url is None:
        base_url = local_judge(str(Path(model).resolve()))
    url = base_url.rstrip("/") + "/chat/completions"
    api_key = api_key or os.environ.get("OPENAI_API_KEY")
    rubrics = rubric if isinstance(rubric, (list, tuple)) else [rubric] * len(completions)
    bodies = [{"model": model or "judge", "max_tokens": max_tokens, "temperature": temperature, "messages": [
        {"role": "user", "content": INSTRUCTION.format(rubric=r or DEFAULT_RUBRIC, question=_question(p), answer=text(c),
                                                       max_score=f"{max_score:g}")}]}
        for p, c, r in zip(prompts, completions, rubrics)]
    failures = {"timeouts": 0, "errors": 0, "malformed": 0}
    last = {}
    counting = threading.Lock()

    def one(body):
        try:
            return judge_one(url, body, api_key, timeout_s, retries, max_score)
        except _Failed as failed:
            with counting:
                failures[failed.kind] += 1
                last[failed.kind] = str(failed)
            return failed_score

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        scores = list(pool.map(one, bodies))
    if log_metric is not None:
        for kind, count in failures.items():
            log_metric(f"llm_judge/{kind}", float(count))
    if any(failures.values()):
        _log.warning("llm_judge: %d of %d judgements failed (%s), scored %g; last: %s", sum(failures.values()), len(bodies),
                     ", ".join(f"{k} {v}" for k, v in failures.items() if v), failed_score, "; ".join(last.values()))
    return scores


def check_options(base_url=None, model=None, max_score=10, timeout_s=60.0, retries=2, concurrency=8, **options) -> None:
    """What ``reward_kwargs: {llm_judge: ...}`` must hold, checked before start (``rewards.configured``)."""
    if base_url is None:
        if model is None:
            raise ValueError("model is not set; give model: a local model folder to serve as the judge (e.g. runs/tiny-qwen3-moe), "
                             "or base_url: http://HOST:PORT/v1 and the served model's name")
        if not (Path(model) / "config.json").is_file():
            raise ValueError(f"model: {model!r} is not a local model folder (no config.json there) and base_url is not set; give "
                             f"the folder of a trained model, or base_url: http://HOST:PORT/v1 of a running judge")
    elif not str(base_url).startswith(("http://", "https://")):
        raise ValueError(f"base_url: {base_url!r} is not an http(s) URL; write it as http://HOST:PORT/v1")
    for key, value, low in (("max_score", max_score, 0), ("timeout_s", timeout_s, 0)):
        if not isinstance(value, (int, float)) or value <= low:
            raise ValueError(f"{key}: {value!r} must be a number above {low}")
    for key, value, low in (("retries", retries, 0), ("concurrency", concurrency, 1)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{key}: {value!r} must be a whole number of at least {low}")


llm_judge.check_options = check_options
