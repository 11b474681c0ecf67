"""The ``search_qa`` environment (issue 47, item 3): BM25 search (bm25s) over a local corpus offered to the policy as
TRL's tool, and the answer graded by SQuAD's exact match and token F1 against hand-computed values. Then the tool
loop in process (a scripted policy searches, then answers) and the embedded default through ``halo launch grpo``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from halo_core.rl.environments import load_environment
from halo_core.rl.environments.answers import answer_of, exact_match, normalize, qa_exact_match, qa_f1, token_f1

TINY = Path(__file__).resolve().parents[1] / "templates" / "tiny"
CORPUS = str(TINY / "data" / "corpus.jsonl")


@pytest.mark.parametrize("prediction, truth, em, f1", [
    ("The Tista.", "Tista", 1.0, 1.0),  # article and punctuation dropped
    ("the river Tista in Norway", "Tista", 0.0, 2 * (1 / 4) * 1 / (1 / 4 + 1)),  # 1 of 4 tokens, all of the truth: 0.4
    ("Ultramarine blue", "ultramarine", 0.0, 2 / 3),  # precision 1/2, recall 1
    ("a dark, volcanic rock!", "volcanic rock", 0.0, 0.8),  # "dark volcanic rock": precision 2/3, recall 1
    ("tista tista", "Tista", 0.0, 2 / 3),  # a repeated token counts once against one in the truth
    ("giraffe", "the okapi", 0.0, 0.0),
    ("", "Tista", 0.0, 0.0),
    ("the", "a", 1.0, 1.0),  # both normalise to nothing: SQuAD counts them equal
])
def test_exact_match_and_f1_are_squads(prediction, truth, em, f1):
    assert exact_match(prediction, truth) == em
    assert token_f1(prediction, truth) == pytest.approx(f1)


def test_the_rewards_take_the_best_accepted_answer_from_the_final_message():
    conversation = [{"role": "assistant", "content": "", "tool_calls": []}, {"role": "tool", "content": "[1] Basalt: ..."},
                    {"role": "assistant", "content": "It is in the corpus. Answer: a dark volcanic rock"}]
    answers = [["volcanic rock", "a dark volcanic rock"], "volcanic rock", ["Tista"]]
    completions = [conversation, "Answer: dark volcanic rock", "Answer: Tista river"]
    assert qa_exact_match(None, completions, answers) == [1.0, 0.0, 0.0]
    assert qa_f1(None, completions, answers) == pytest.approx([1.0, 0.8, 2 / 3])
    assert answer_of("The Tista") == "The Tista" and normalize("  The  Tista!! ") == "tista"


def test_search_ranks_the_corpus_with_bm25():
    environment = load_environment("search_qa")()
    assert environment.reset(prompt="Which river flows through Halden?", answers=["Tista"], corpus=CORPUS) is None
    found = environment.search("river Halden")
    titles = re.findall(r"^\[\d\] (\w[\w ]*):", found, re.M)
    # the two passages naming both words first (the shorter one, BM25's length normalisation, ahead), then the one naming Halden
    assert titles == ["Tista", "Halden", "Fredriksten"], found
    assert environment.search("pigment painters").startswith("[1] Lapis lazuli: ")
    assert environment.search("the of a") == "no passage matches"  # stopwords only


def test_a_row_without_a_corpus_is_refused(tmp_path):
    environment = load_environment("search_qa")()
    with pytest.raises(ValueError, match="corpus 'nowhere.jsonl' is not a JSON Lines file"):
        environment.reset(corpus="nowhere.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"title": "no text"}\n')
    with pytest.raises(ValueError, match="line 1: each passage is a JSON object with a 'text' string"):
        environment.reset(corpus=str(bad))


def test_the_policy_searches_and_its_answer_is_graded(tmp_path, monkeypatch):
    """One GRPO step in process, the engine scripted: every conversation calls ``search``, TRL hands it the passages
    (no loss on them), and the answers after it (right for half the rows) are graded."""
    from test_environments import _rows, assert_spans, tool_call, train_one_step

    rows = [json.loads(line) for line in (TINY / "data" / "search_qa.jsonl").read_text().splitlines()][:2]
    rows = [dict(row, corpus=CORPUS) for row in rows]

    def script(tokenizer, row, turn, prompt):
        if turn == 0:
            words = "river Halden" if "Which river" in prompt else "pigment lapis lazuli"
            return tool_call(tokenizer, "qwen3", "search", {"query": f"{words} {row}"})  # each conversation its own first turn
        right = "Tista" if "Which river" in prompt else "ultramarine"
        return f"Answer: {right if row % 2 == 0 else 'Oslo'}<|im_end|>"

    tokenizer, engine, seen, trainer = train_one_step(tmp_path, monkeypatch, "qwen3", script, rows, environment="search_qa",
                                                      reward_funcs=["qa_exact_match", "qa_f1"])
    said = [tokenizer.decode(assert_spans(row, engine.emitted)[1]) for row in _rows(seen)]
    assert all("[1] Tista: The Tista is a river" in s or "[1] Lapis lazuli: " in s for s in said), said
    logged = trainer.state.log_history[0]
    assert logged["tools/call_frequency"] == 1.0 and logged["rewards/qa_exact_match/mean"] == 0.5 and logged["rewards/qa_f1/mean"] == 0.5


def test_the_embedded_default_runs_through_halo_launch(tmp_path):
    """``templates/configs/tiny-search-qa-grpo.yaml``, one step: the environment made per rollout from the bundled rows
    (the corpus found beside the data file from another working directory), the tool loop, both graders logged and a
    checkpoint left."""
    from launch_kit import launch_tool_default

    _, logged = launch_tool_default("tiny-search-qa-grpo.yaml", tmp_path)
    assert {"rewards/qa_f1/mean", "rewards/qa_exact_match/mean", "tools/call_frequency"} <= set(logged), logged


def test_the_tool_models_template_is_one_trl_parses():
    """The tool defaults' tokenizer carries TRL's own Qwen3 template (TRL recognises templates by their text): if TRL's
    copy changes, regenerate with templates/tiny/generate_environments.py."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema

    tokenizer = add_response_schema(AutoTokenizer.from_pretrained(TINY / "tool-model"))
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "river Halden"}}\n</tool_call><|im_end|>'
    parsed = tokenizer.parse_response(call, prefix="")
    assert parsed["tool_calls"][0]["function"] == {"name": "search", "arguments": {"query": "river Halden"}}
    assert tokenizer.eos_token == "<|im_end|>" and len(tokenizer) == json.loads((TINY / "tool-model" / "config.json").read_text())["vocab_size"]


def test_without_bm25s_the_environment_is_refused_before_start_naming_the_extra(monkeypatch):
    import sys

    from halo_core.errors import ConfigError
    from halo_core.methods.grpo import HaloGRPOConfig
    from halo_core.rl.environments import check_tools

    monkeypatch.setitem(sys.modules, "bm25s", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "halo_core.rl.environments.search_qa", raising=False)
    args = HaloGRPOConfig(output_dir="unused", use_cpu=True, report_to="none", reward_funcs=["qa_f1"], environment="search_qa")
    with pytest.raises(ConfigError) as caught:
        check_tools(args)
    message = str(caught.value)
    assert message.startswith("environment: 'search_qa' cannot be loaded") and "pip install 'halo-core[rl]'" in message, message
    assert "\n" not in message
