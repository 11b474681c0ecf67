"""Multi-turn GRPO through TRL's own tool loop, its turns from Halo's rollout engine: on chat templates of three
families (Qwen3, whose template re-renders earlier turns and is swapped for TRL's training template; Llama 3.2;
GLM-4.5), every token the engine sampled is trained with loss, exactly as sampled, and every token a tool or the
template added has none. Also: ``code_contests`` grading in the sandbox, tool timeouts, and names refused before
start."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import halo_core.methods.grpo as grpo
from halo_core.errors import ConfigError
from halo_core.rl.engines import Rollout
from halo_core.rl.environments import check_tools, load_environment, load_tools
from halo_core.rl.environments.timeout import timed
from launch_kit import TINY

TEMPLATES = Path(__import__("trl").__file__).parent / "chat_templates"
#: family: (TRL's bundled template, eos token, special tokens, plain added tokens, what ends a tool-call turn, an answer turn)
FAMILIES = {
    "qwen3": ("qwen3.jinja", "<|im_end|>", ["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
              ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"], "<|im_end|>", "<|im_end|>"),
    "llama3_2": ("llama3_2.jinja", "<|eot_id|>", ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                                                  "<|eom_id|>", "<|python_tag|>"], [], "<|eot_id|>", "<|eot_id|>"),
    "glm4moe": ("glm4moe.jinja", "<|endoftext|>", ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
                                                   "<|endoftext|>"],
                ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<tool_response>",
                 "</tool_response>", "<think>", "</think>"], "<|observation|>", "<|user|>"),
}


def family_tokenizer(family: str):
    """The tiny byte-level BPE with the family's special tokens and TRL's copy of its chat template (so TRL's
    response parser and, for Qwen3, its training template recognise it)."""
    from transformers import AutoTokenizer

    file, eos, special, plain, _, _ = FAMILIES[family]
    tokenizer = AutoTokenizer.from_pretrained(TINY)
    tokenizer.add_special_tokens({"additional_special_tokens": special})
    tokenizer.add_tokens(plain)
    tokenizer.chat_template = (TEMPLATES / file).read_text()
    tokenizer.eos_token = eos
    if family == "llama3_2":
        tokenizer.bos_token = "<|begin_of_text|>"
    return tokenizer


def tiny_model(tokenizer):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(TINY, vocab_size=len(tokenizer), max_position_embeddings=4096)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def spelt_out(tokenizer, text: str) -> list[int]:
    """``text`` one character per token (added tokens kept whole): ids the tokenizer would never choose itself,
    so a trained sequence that holds them was not re-tokenised."""
    added = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
    ids = []
    for piece in re.split("(" + "|".join(map(re.escape, added)) + ")", text):
        if piece in added:
            ids.append(tokenizer.convert_tokens_to_ids(piece))
        else:
            for char in piece:
                ids += tokenizer.encode(char, add_special_tokens=False)
    return ids


class ScriptedEngine:
    """A rollout engine whose turns are scripted: ``script(row, turn, prompt) -> text`` (the row's place in the
    first call; its turn: how many of this engine's own turns its prompt already holds). Records what it emitted.
    Scripts give every conversation a first turn of its own, so that a later prompt names its conversation."""

    shares_weights = True

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script = tokenizer, script
        self.emitted: list[tuple[list[int], list[int], int, int]] = []  # prompt, completion, row, turn

    def generate(self, prompts, params, **kwargs):
        completions = []
        first = not any(len(prompt) > len(p) + len(c) and prompt[: len(p) + len(c)] == p + c for prompt in prompts
                        for p, c, _, _ in self.emitted)
        if first:
            self.emitted.clear()
        for index, prompt in enumerate(prompts):
            before = [(row, turn) for p, c, row, turn in self.emitted if prompt[: len(p) + len(c)] == p + c]
            row, turn = max(before, key=lambda rt: rt[1], default=(index, -1))
            ids = spelt_out(self.tokenizer, self.script(row, turn + 1, self.tokenizer.decode(prompt)))
            self.emitted.append((list(prompt), ids, row, turn + 1))
            completions.append(ids)
        return Rollout(list(prompts), completions, [[-1.0] * len(c) for c in completions])

    def update_weights(self, named):
        pass

    def close(self):
        pass


def tool_call(tokenizer, family: str, name: str, arguments: dict) -> str:
    """The text a model of ``family`` writes to call ``name``: the template's own rendering of the call, ended by
    the family's end-of-turn token."""
    from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving

    template = None if is_chat_template_prefix_preserving(tokenizer) else get_training_chat_template(tokenizer)
    user = [{"role": "user", "content": "hi"}]
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}
    prompt = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False, chat_template=template)
    whole = tokenizer.apply_chat_template(user + [call], tokenize=False, chat_template=template)
    assert whole.startswith(prompt)
    stop = FAMILIES[family][4]
    text = whole[len(prompt):]
    return text[: text.index(stop)] + stop if stop in text else text.rstrip("\n") + stop


def train_one_step(tmp_path, monkeypatch, family: str, script, rows: list[dict], **config):
    """One GRPO step of HaloGRPOTrainer with ``script`` as its engine: the tokenizer, the engine, the loss pass's
    inputs and the trainer."""
    import datasets

    tokenizer = family_tokenizer(family)
    engine = ScriptedEngine(tokenizer, lambda row, turn, prompt: script(tokenizer, row, turn, prompt))
    monkeypatch.setattr(grpo, "engine_factory", lambda name: lambda **kwargs: engine)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    seen = []
    loss = grpo.HaloGRPOTrainer._compute_loss
    monkeypatch.setattr(grpo.HaloGRPOTrainer, "_compute_loss",
                        lambda self, model, inputs: seen.append(dict(inputs)) or loss(self, model, inputs))
    args = grpo.HaloGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_steps=1,
                               max_completion_length=600, logging_steps=1, save_strategy="no", bf16=False, report_to="none",
                               use_cpu=True, seed=0, vllm_importance_sampling_correction=False, **config)
    trainer = grpo.HaloGRPOTrainer(model=tiny_model(tokenizer), args=args, train_dataset=datasets.Dataset.from_list(rows),
                                   processing_class=tokenizer)
    trainer.train()
    return tokenizer, engine, seen, trainer


def assert_spans(row: dict, emitted: list) -> tuple[list[int], list[int]]:
    """One trained row against the engine's turns of that conversation: its completion is turn 0, what TRL spliced
    in, turn 1; the loss mask is 1 on exactly the engine's tokens; turn 1 was sampled after exactly the trained
    prefix. Returns turn 0's ids and the spliced ones."""
    prompt = row["prompt_ids"][row["prompt_mask"].bool()].tolist()
    valid = row["completion_mask"].bool()
    completion = row["completion_ids"][valid].tolist()
    mask = (row["completion_mask"] * row["tool_mask"])[valid].tolist()
    starts = [(c, r) for p, c, r, t in emitted if t == 0 and p == prompt]
    assert starts, "turn 0 was sampled after the trained prompt"
    first, conversation = next(((c, r) for c, r in starts if completion[: len(c)] == c), (None, None))
    assert first is not None, "the sampled ids, as sampled"
    answers = [(p, c) for p, c, r, t in emitted if t == 1 and r == conversation]
    assert len(answers) == 1, "a tool-call turn, then an answer turn"
    before, second = answers[0]
    assert completion[len(completion) - len(second):] == second, "the sampled ids, as sampled"
    spliced = completion[len(first): len(completion) - len(second)]
    assert spliced, "the tool turn"
    assert before == prompt + first + spliced, "turn 1 was sampled after exactly the trained prefix"
    assert mask == [1] * len(first) + [0] * len(spliced) + [1] * len(second), "loss on the sampled ids only"
    return first, spliced


def _rows(seen: list[dict]) -> list[dict]:
    assert len(seen) == 1, "one loss pass over the whole generation batch"
    batch = {k: v for k, v in seen[0].items() if isinstance(v, torch.Tensor) and v.ndim == 2}
    return [{k: v[i] for k, v in batch.items()} for i in range(len(batch["prompt_ids"]))]


ARITHMETIC = [{"prompt": [{"role": "user", "content": f"What is {a} * 1000 + 7?"}], "answer": a * 1000 + 7} for a in (3, 4, 5, 6)]


@pytest.mark.slow  # generates with a tiny model per chat template
@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_engines_tokens_are_trained_as_sampled_and_tool_tokens_are_not(tmp_path, monkeypatch, family):
    def script(tokenizer, row, turn, prompt):
        if turn == 0:  # each row its own arguments, so every conversation is told apart
            return tool_call(tokenizer, family, "calculator", {"expression": f"{row} * 1000 + 7"})
        return f"It is {row * 1000 + 7}." + FAMILIES[family][5]

    tokenizer, engine, seen, trainer = train_one_step(tmp_path, monkeypatch, family, script, ARITHMETIC,
                                                      tools=["calculator"], reward_funcs=["exact_answer"])
    rows = _rows(seen)
    assert len(rows) == 4 and len(engine.emitted) == 8
    for row in rows:
        first, spliced = assert_spans(row, engine.emitted)
        result = str(int(re.search(r"(\d+) \* 1000", tokenizer.decode(first))[1]) * 1000 + 7)
        assert result in tokenizer.decode(spliced), "the calculator's result is in the tool turn"
        assert first != tokenizer.encode(tokenizer.decode(first), add_special_tokens=False), "the test's ids are not the canonical ones"
    if family == "qwen3":  # its template drops earlier turns' reasoning; TRL trains with its own prefix-preserving one
        assert trainer.chat_template is not None and trainer.chat_template != tokenizer.chat_template
    else:
        assert trainer.chat_template is None
    logged = trainer.state.log_history[0]
    assert logged["tools/call_frequency"] == 1.0 and logged["tools/failure_frequency"] == 0.0


def test_the_span_check_catches_an_off_by_one_and_a_re_tokenised_turn(tmp_path, monkeypatch):
    def script(tokenizer, row, turn, prompt):
        return tool_call(tokenizer, "qwen3", "calculator", {"expression": f"{row} + 1"}) if turn == 0 else f"{row + 1}<|im_end|>"

    tokenizer, engine, seen, _ = train_one_step(tmp_path, monkeypatch, "qwen3", script, ARITHMETIC, tools=["calculator"],
                                                reward_funcs=["exact_answer"])
    row = _rows(seen)[0]
    shifted = dict(row, tool_mask=torch.cat([row["tool_mask"][:1], row["tool_mask"][:-1]]))  # the tool span one token late
    with pytest.raises(AssertionError, match="loss on the sampled ids only"):
        assert_spans(shifted, engine.emitted)
    first, _ = assert_spans(row, engine.emitted)
    canonical = tokenizer.encode(tokenizer.decode(first), add_special_tokens=False)
    valid = int(row["completion_mask"].sum())
    ids = canonical + row["completion_ids"][len(first):valid].tolist()
    retokenised = dict(row, completion_ids=torch.tensor(ids), completion_mask=torch.ones(len(ids), dtype=torch.long),
                       tool_mask=torch.cat([torch.ones(len(canonical), dtype=torch.long), row["tool_mask"][len(first):valid]]))
    with pytest.raises(AssertionError, match="the sampled ids, as sampled"):
        assert_spans(retokenised, engine.emitted)


def hang(seconds: float) -> str:
    """Wait, then answer.

    Args:
        seconds: How long to wait.
    """
    time.sleep(seconds)
    return "done"


@pytest.mark.slow  # waits out a tool's timeout
def test_a_hanging_tool_times_out_and_the_conversation_goes_on(tmp_path, monkeypatch, caplog):
    def script(tokenizer, row, turn, prompt):
        return tool_call(tokenizer, "qwen3", "hang", {"seconds": 60 + row}) if turn == 0 else f"I could not wait {row}.<|im_end|>"

    start = time.monotonic()
    with caplog.at_level("WARNING", logger="halo_core.rl.environments.timeout"):
        tokenizer, engine, seen, trainer = train_one_step(tmp_path, monkeypatch, "qwen3", script, ARITHMETIC, tools=["test_environments.hang"],
                                                          reward_funcs=["exact_answer"], tool_timeout_s=0.5)
    assert time.monotonic() - start < 45
    for row in _rows(seen):
        assert "tool 'hang' timed out after 0.5 s" in tokenizer.decode(assert_spans(row, engine.emitted)[1])
    assert trainer.state.log_history[0]["tools/failure_frequency"] == 1.0
    assert sum("timed out after 0.5 s (tool_timeout_s)" in r.getMessage() for r in caplog.records) == 4


PROBLEMS = [{"prompt": [{"role": "user", "content": "Write double(x)."}], "tests": ["assert double(2) == 4", "assert double(-1) == -2"]},
            {"prompt": [{"role": "user", "content": "Write square(x)."}], "tests": ["assert square(3) == 9", "assert square(0) == 0"]}]


@pytest.mark.slow  # a generation and sandboxed runs
def test_code_contests_runs_the_models_code_and_scores_it(tmp_path, monkeypatch):
    solutions = {("double", 0): "def double(x):\n    return 2 * x", ("double", 1): "def double(x):\n    return x + 2",  # right once
                 ("square", 0): "def square(x):\n    return x * x", ("square", 1): "def square(x):\n    while True: pass"}

    def script(tokenizer, row, turn, prompt):
        if turn == 1:
            return "Done.<|im_end|>"
        return tool_call(tokenizer, "qwen3", "run_tests", {"code": solutions["double" if "double" in prompt else "square", row % 2]})

    monkeypatch.setattr("halo_core.rl.environments.code_contests.CodeContests.timeout_s", 2.0)
    tokenizer, engine, seen, trainer = train_one_step(tmp_path, monkeypatch, "qwen3", script, PROBLEMS, environment="code_contests")
    said = [tokenizer.decode(assert_spans(row, engine.emitted)[1]) for row in _rows(seen)]
    assert sorted(re.search(r"\d/2 tests passed", s)[0] for s in said) == ["0/2 tests passed", "1/2 tests passed"] + ["2/2 tests passed"] * 2
    assert any("timed out after 2 s" in s for s in said)
    assert trainer.state.log_history[0]["rewards/CodeContests/mean"] == pytest.approx((1.0 + 0.5 + 1.0 + 0.0) / 4)


# -- the sandbox's grading -----------------------------------------------------------------------------------------

TESTS = ["assert double(2) == 4", "assert double(0) == 0", "assert double(-3) == -6"]


@pytest.mark.parametrize("code, reward, says", [
    ("def double(x):\n    return 2 * x", 1.0, "3/3 tests passed"),
    ("```python\ndef double(x):\n    return x + 2\n```", 1 / 3, "1/3 tests passed; test 2 (assert double(0) == 0): AssertionError"),
    ("def double(x):\n    return x", 1 / 3, "1/3 tests passed"),
    ("double = None", 0.0, "0/3 tests passed; test 1 (assert double(2) == 4): TypeError"),
    ("def double(x):\n    while True: pass", 0.0, "0/3 tests passed; timed out after 1 s"),
    ("blob = bytearray(1 << 33)", 0.0, "0/3 tests passed; solution raised MemoryError"),
    ("def double(x):\n    return bytearray(1 << 33)", 0.0, "test 1 (assert double(2) == 4): MemoryError"),
    ("import os\nos._exit(0)", 0.0, "0/3 tests passed; the program ended before any test ran (exit code 0)"),
    ("import sys\nprint('pass')\nsys.exit(0)", 0.0, "0/3 tests passed; solution raised SystemExit"),
])
def test_code_contests_grades_in_the_sandbox(code, reward, says):
    environment = load_environment("code_contests")()
    environment.timeout_s = 1.0
    environment.reset(prompt="", tests=TESTS)
    assert environment.get_reward() == 0.0  # nothing run yet
    start = time.monotonic()
    summary = environment.run_tests(code)
    assert time.monotonic() - start < 10
    assert says in summary, summary
    assert environment.get_reward() == pytest.approx(reward)


def test_code_contests_needs_tests_in_its_rows():
    with pytest.raises(ValueError, match="needs a 'tests' column"):
        load_environment("code_contests")().reset(prompt="Write f.")


def test_the_python_tool_and_the_calculator():
    calculator, python = load_tools(["calculator", "python"])
    assert calculator("(3 + 4) * 12") == "84" and calculator("7 / 2") == "3.5"
    for bad in ("9 ** 9 ** 9", "__import__('os')", "x + 1"):
        with pytest.raises(ValueError):
            calculator(bad)
    assert python("print(6 * 7)") == "42"
    assert python("print(1)\n1 / 0") == "1\nZeroDivisionError: division by zero"


# -- timeouts ----------------------------------------------------------------------------------------------------


def test_a_timed_tool_keeps_what_trl_reads_and_passes_errors_through():
    from transformers.utils import get_json_schema

    limited = timed(hang, 0.2)
    assert limited.__name__ == "hang" and get_json_schema(limited) == get_json_schema(hang)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="tool 'hang' timed out after 0.2 s"):
        limited(5)
    assert time.monotonic() - start < 2
    assert limited(0) == "done"
    with pytest.raises(TypeError):
        timed(lambda x: 1 / x, 1.0)("zero")


def test_an_async_tool_times_out():
    import asyncio

    async def slow(seconds: float) -> str:
        """Wait.

        Args:
            seconds: How long.
        """
        await asyncio.sleep(seconds)
        return "done"

    limited = timed(slow, 0.2)
    assert asyncio.iscoroutinefunction(limited)
    with pytest.raises(TimeoutError, match="tool 'slow' timed out"):
        asyncio.run(limited(5))


class Counter:
    """An environment with state, a tool that hangs and a static tool."""

    def reset(self, **row):
        self.count = 0

    def step(self) -> str:
        """Count one.

        Returns:
            The count.
        """
        self.count += 1
        return str(self.count)

    def stall(self) -> str:
        """Never answer."""
        threading.Event().wait(30)
        return ""

    @staticmethod
    def echo(text: str) -> str:
        """Echo.

        Args:
            text: What to echo.
        """
        return text

    def get_reward(self) -> float:
        return float(self.count)


def make_counter():
    return Counter()


@pytest.mark.parametrize("name", ["test_environments.Counter", "test_environments.make_counter"], ids=["class", "function"])
def test_an_environments_tools_are_timed_and_the_rest_is_kept(name):
    environment = load_environment(name, timeout_s=0.2)()
    assert type(environment).__name__ == "Counter" and isinstance(environment, Counter)
    environment.reset()
    assert environment.step() == "1" and environment.echo("hi") == "hi" and environment.get_reward() == 1.0
    with pytest.raises(TimeoutError, match="tool 'stall' timed out after 0.2 s"):
        environment.stall()
    assert type(load_environment(name, timeout_s=0.2)()) is type(environment)  # one class: TRL matches rewards by type


# -- names, before start -------------------------------------------------------------------------------------------


def undocumented(x):
    return x


@pytest.mark.parametrize("fields, says, fix", [
    ({"tools": ["nope"]}, "tools: 'nope' is unknown; installed: ['calculator', 'python'], or a dotted import path", "'halo.tools' entry-point group"),
    ({"tools": ["no_module.f"]}, "tools: 'no_module.f' is unknown (importing 'no_module' failed", "'halo.tools' entry-point group"),
    ({"environment": "maze"}, "environment: 'maze' is unknown; installed: ['code_contests', 'mcp', 'search_qa', 'swe']", "'halo.environments' entry-point group"),
    ({"tools": ["test_environments.undocumented"]}, "tools: 'test_environments.undocumented' cannot be offered to the model", "a type hint"),
    ({"tool_timeout_s": 0.0, "tools": ["calculator"]}, "tool_timeout_s=0.0 must be above 0", "or empty for no limit"),
])
def test_bad_names_are_refused_naming_the_key(fields, says, fix):
    args = grpo.HaloGRPOConfig(output_dir="unused", use_cpu=True, report_to="none", reward_funcs=["exact_answer"], **fields)
    with pytest.raises(ConfigError) as caught:
        check_tools(args)
    message = str(caught.value)
    assert says in message and fix in message and "\n" not in message, message


def test_an_environment_may_stand_in_for_reward_funcs(tmp_path):
    from halo_core.trainers.run_checks import check_run
    from halo_core.trainers.run_config import load_run_config, parse_overrides
    from launch_kit import write_run

    config = write_run(tmp_path, "prompts", "environment: code_contests\n")
    check_run(load_run_config("grpo", grpo.HaloGRPOConfig, config, parse_overrides([])), 1)


@pytest.mark.slow  # a fresh `halo` interpreter loading the stack
def test_the_cli_refuses_an_unknown_environment_with_one_line_and_exit_2(tmp_path):
    from launch_kit import write_run

    config = write_run(tmp_path, "prompts", "reward_funcs: [exact_answer]\nenvironment: maze\n")
    done = subprocess.run([sys.executable, "-m", "halo_cli", "launch", "grpo", str(config), "--dry-run"], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 2 and "environment: 'maze' is unknown" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len([line for line in done.stderr.splitlines() if line.strip()]) == 1
