"""The ``llm_judge`` reward against a stub OpenAI-compatible server (fixed judgements: parsing, the rubric and the key
sent, timeouts retried, errors and malformed replies scored ``failed_score`` and counted), its refusals before start,
and the embedded default through ``halo launch grpo`` with the tiny model served locally as the judge."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import run_halo
from halo_core.errors import ConfigError
from halo_core.rl.judge import llm_judge
from halo_core.rl.rewards import load_rewards
from launch_kit import TINY, noise_in, saved_tiny_model

CONFIGS = Path(__file__).resolve().parents[1] / "templates" / "configs"


class Stub:
    """A chat-completions server whose reply to an answer is ``replies[answer]``: a string (the judge's text), a
    number (seconds to stall before replying "9"), ``500``-like ``("status", code)``, or ``("raw", bytes)``."""

    def __init__(self, replies: dict):
        self.replies, self.seen = replies, []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.seen.append((self.path, self.headers.get("Authorization"), body))
                answer = body["messages"][-1]["content"].split("Answer: ")[1].split("\n")[0]
                reply = stub.replies[answer]
                if isinstance(reply, float):
                    time.sleep(reply)
                    reply = "9"
                code, data = 200, None
                if isinstance(reply, tuple):
                    code, data = (reply[1], b"{}") if reply[0] == "status" else (200, reply[1])
                elif isinstance(reply, dict):
                    data = json.dumps(reply).encode()
                else:
                    data = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]}).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (a timeout)
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def asked(self, answer: str) -> int:
        return sum(f"Answer: {answer}\n" in body["messages"][-1]["content"] for _, _, body in self.seen)


@pytest.fixture
def stub():
    made = []

    def start(replies):
        made.append(Stub(replies))
        return made[-1]

    yield start
    for each in made:
        each.server.shutdown()


def test_judgements_are_parsed_and_failures_scored_and_counted(stub, caplog):
    server = stub({"right": "Score: 7/10", "perfect": "10", "over": "11", "words": "good", "slow": 1.5, "broken": ("status", 500),
                   "not json": ("raw", b"<html>"), "empty": {"choices": []}})
    answers = list(server.replies)
    logged = {}
    with caplog.at_level("WARNING", logger="halo_core.rl.judge"):
        scores = llm_judge(["What is 3 + 4?"] * len(answers), answers, base_url=server.url, model="judge", api_key="sk-test",
                           timeout_s=0.5, retries=1, failed_score=-1.0, log_metric=lambda key, value: logged.__setitem__(key, value))
    assert dict(zip(answers, scores)) == {"right": 0.7, "perfect": 1.0, "over": -1.0, "words": -1.0, "slow": -1.0, "broken": -1.0,
                                          "not json": -1.0, "empty": -1.0}
    assert logged == {"llm_judge/timeouts": 1.0, "llm_judge/errors": 1.0, "llm_judge/malformed": 4.0}
    assert server.asked("slow") == 2 and server.asked("broken") == 2 and server.asked("words") == 1  # retried: no reply; not: a bad one
    path, key, body = server.seen[0]
    assert path == "/v1/chat/completions" and key == "Bearer sk-test" and body["model"] == "judge" and body["temperature"] == 0.0
    assert "What is 3 + 4?" in body["messages"][0]["content"]
    assert [r.getMessage() for r in caplog.records if "6 of 8 judgements failed (timeouts 1, errors 1, malformed 4)" in r.getMessage()]


def test_a_rubric_column_replaces_the_argument_row_by_row(stub):
    server = stub({"a": "5", "b": "5"})
    conversation = [[{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Name a colour."}]] * 2
    rewards = load_rewards(["llm_judge"], {"llm_judge": {"base_url": server.url, "model": "judge", "rubric": "never sent"}})[0]
    assert rewards(conversation, [[{"role": "assistant", "content": "a"}], [{"role": "assistant", "content": "b"}]],
                   rubric=["Red is best.", None]) == [0.5, 0.5]
    sent = [body["messages"][0]["content"] for _, _, body in server.seen]
    assert sorted("Rubric: Red is best." in s for s in sent) == [False, True]
    assert all("Question: Name a colour." in s and "never sent" not in s for s in sent)


@pytest.mark.parametrize("names, options, says", [
    (["llm_judge"], {}, "reward_kwargs: llm_judge: model is not set; give model: a local model folder"),
    (["llm_judge"], {"llm_judge": {"model": "no/such/folder"}}, "model: 'no/such/folder' is not a local model folder"),
    (["llm_judge"], {"llm_judge": {"base_url": "localhost:8000", "model": "m"}}, "base_url: 'localhost:8000' is not an http(s) URL"),
    (["llm_judge"], {"llm_judge": {"base_url": "http://h/v1", "modle": "m"}}, "['modle'] are not arguments of reward 'llm_judge'"),
    (["llm_judge"], {"llm_judge": {"base_url": "http://h/v1", "prompts": []}}, "['prompts'] are not arguments of reward 'llm_judge'"),
    (["llm_judge"], {"llm_judge": {"base_url": "http://h/v1", "retries": -1}}, "retries: -1 must be a whole number of at least 0"),
    (["brevity"], {"llm_judge": {"model": "m"}}, "reward_kwargs: ['llm_judge'] are not in reward_funcs ['brevity']"),
])
def test_bad_judge_arguments_are_refused_before_start(names, options, says):
    with pytest.raises(ConfigError) as caught:
        load_rewards(names, options)
    assert says in str(caught.value) and "\n" not in str(caught.value), caught.value


def test_a_local_judge_that_cannot_start_says_why(tmp_path):
    from halo_core.rl.judge import local_judge

    (tmp_path / "config.json").write_text("{}")  # passes the check before start, fails to load
    with pytest.raises(RuntimeError, match=r"serving '.*' as the judge failed: ValueError: Unrecognized model"):
        local_judge(str(tmp_path))


@pytest.fixture(scope="module")
def judge_model(tmp_path_factory):
    """The tiny model with weights, as the SFT default leaves it (random here: the wiring is what is tested)."""
    return saved_tiny_model(tmp_path_factory.mktemp("judge"))


def test_the_judge_default_runs_through_halo_launch_with_a_local_judge(tmp_path, judge_model):
    out = tmp_path / "run"
    result = run_halo("launch", "grpo", str(CONFIGS / "tiny-judge-grpo.yaml"), "--nproc", "1", "--", f"--output_dir={out}",
                      "--max_steps=2", "--logging_steps=1", "--save_steps=2",
                      f"--reward_kwargs={json.dumps({'llm_judge': {'model': str(judge_model), 'max_score': 100}})}", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not noise_in(result.stdout + result.stderr)
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    steps = [e for e in state["log_history"] if "loss" in e]
    assert len(steps) == 2
    for entry in steps:  # every judgement came back (malformed ones would score 0 and be counted)
        assert entry["llm_judge/timeouts"] == 0 and entry["llm_judge/errors"] == 0 and "rewards/llm_judge/mean" in entry
