"""Regenerates the fixtures of the ``swe`` and ``search_qa`` embedded defaults; deterministic:

    python templates/tiny/generate_environments.py

- ``swe/statslib.bundle``: a git repository (one file, ``git bundle``) of a tiny Python package with two bugs and its
  own tests, committed with fixed names and dates so its commit id never changes; ``data/swe.jsonl``: one task per bug.
- ``data/corpus.jsonl`` (passages) and ``data/search_qa.jsonl`` (questions whose answers are in them).
- ``tool-model/``: a tiny tokenizer with Qwen3's chat tokens, trained on these defaults' rendered prompts, with TRL's
  copy of Qwen3's chat template (TRL parses tool calls only for templates it knows), and the tiny Qwen3-MoE config
  with its vocabulary and room for prompts that list tools.
"""

from __future__ import annotations

import json
import sys
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).parent

REPO = {
    "README.md": "# statslib\n\nSmall statistics helpers.\n",
    "statslib/__init__.py": "from statslib.stats import mean, median\n",
    "statslib/stats.py": (
        "def mean(values):\n"
        "    \"\"\"The arithmetic mean of a non-empty list of numbers.\"\"\"\n"
        "    return sum(values) / (len(values) - 1)\n"
        "\n"
        "\n"
        "def median(values):\n"
        "    \"\"\"The middle value of a non-empty list; for an even count, the mean of the two middle values.\"\"\"\n"
        "    ordered = sorted(values)\n"
        "    return ordered[len(ordered) // 2]\n"),
    "tests/test_mean.py": (
        "from statslib import mean\n"
        "\n"
        "\n"
        "def test_mean_of_three():\n"
        "    assert mean([1, 2, 3]) == 2\n"
        "\n"
        "\n"
        "def test_mean_of_one():\n"
        "    assert mean([5]) == 5\n"),
    "tests/test_median.py": (
        "from statslib import median\n"
        "\n"
        "\n"
        "def test_median_of_an_odd_count():\n"
        "    assert median([3, 1, 2]) == 2\n"
        "\n"
        "\n"
        "def test_median_of_an_even_count():\n"
        "    assert median([4, 1, 3, 2]) == 2.5\n"),
}
TASKS = [("mean([1, 2, 3]) returns 3.0 instead of 2.0, and mean([5]) raises ZeroDivisionError. Fix statslib.",
          "python -m pytest tests/test_mean.py"),
         ("median([4, 1, 3, 2]) returns 3 instead of 2.5: for an even count it must average the two middle values. Fix statslib.",
          "python -m pytest tests/test_median.py")]

PASSAGES = [
    ("Halden", "Halden is a town in Norway on the Iddefjord. The river Tista flows through the town into the fjord."),
    ("Fredriksten", "Fredriksten is a fortress above Halden, built in the 1680s on a steep hill."),
    ("Tista", "The Tista is a river in southeastern Norway that ends in Halden."),
    ("Aurora", "An aurora is light in the night sky, seen most often near the magnetic poles."),
    ("Basalt", "Basalt is a dark volcanic rock formed when lava rich in iron and magnesium cools quickly."),
    ("Kelp", "Kelp is a large brown seaweed that grows in cold, shallow ocean water and forms underwater forests."),
    ("Lapis lazuli", "Lapis lazuli is a deep blue stone, ground into the pigment ultramarine by painters."),
    ("Okapi", "The okapi is a mammal of the Congo rainforest, a relative of the giraffe with striped legs."),
]
QUESTIONS = [("Which river flows through Halden?", ["Tista", "the Tista"]),
             ("Which pigment is made from lapis lazuli?", ["ultramarine"]),
             ("What kind of rock is basalt?", ["volcanic rock", "a dark volcanic rock"]),
             ("The okapi is a relative of which animal?", ["the giraffe", "giraffe"])]
ASK = " Search the corpus, then answer with the answer alone."

TOOL_SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
TOOL_PLAIN = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def repository(bundle: Path) -> str:
    """The package committed once, with fixed identity and dates, as a bundle; returns the commit id."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "Halo", "GIT_AUTHOR_EMAIL": "halo@example.invalid", "GIT_COMMITTER_NAME": "Halo",
           "GIT_COMMITTER_EMAIL": "halo@example.invalid", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+00:00",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+00:00", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    git = lambda *args, cwd: subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout  # noqa: E731
    with tempfile.TemporaryDirectory() as work:
        git("init", "--quiet", "--initial-branch=main", ".", cwd=work)
        for name, content in REPO.items():
            Path(work, name).parent.mkdir(parents=True, exist_ok=True)
            Path(work, name).write_text(content)
        git("add", ".", cwd=work)
        git("commit", "--quiet", "-m", "statslib: mean and median", cwd=work)
        bundle.parent.mkdir(parents=True, exist_ok=True)
        git("bundle", "create", "--quiet", str(bundle.resolve()), "HEAD", "main", cwd=work)
        return git("rev-parse", "HEAD", cwd=work).strip()


def _conversations(template: str) -> list[str]:
    """What the tool defaults' prompts render to (their tools listed by Qwen3's template), a tool call and a tool turn:
    the text the tool model's tokenizer is trained on, so a prompt that lists tools is a few hundred tokens, not a
    thousand (the hf engine's generation recomputes the whole sequence at every token)."""
    import inspect

    from transformers import AutoTokenizer

    from halo_core.rl.environments.search_qa import SearchQA
    from halo_core.rl.environments.swe import SWE

    renderer = AutoTokenizer.from_pretrained(HERE / "model")
    renderer.chat_template = template
    texts = []
    for environment, data in ((SWE, "swe.jsonl"), (SearchQA, "search_qa.jsonl")):
        tools = [f for name, f in inspect.getmembers(environment, inspect.isfunction) if name not in ("reset", "get_reward") and not name.startswith("_")]
        for line in (HERE / "data" / data).read_text().splitlines():
            row = json.loads(line)
            call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                "name": tools[0].__name__, "arguments": {name: "statslib/stats.py Halden" for name in list(inspect.signature(tools[0]).parameters)[1:]}}}]}
            messages = row["prompt"] + [call, {"role": "tool", "name": tools[0].__name__, "content": "[1] Halden: a town"},
                                        {"role": "assistant", "content": "Answer: Tista"}]
            texts.append(renderer.apply_chat_template(messages, tools=tools, tokenize=False))
    return texts


def tool_model(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoConfig, PreTrainedTokenizerFast
    import trl

    template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    texts = _conversations(template) + list(REPO.values()) + [f"{title}: {body}" for title, body in PASSAGES]
    texts += [m["content"] for line in (HERE / "data" / "arithmetic.jsonl").read_text().splitlines()[:500]
              for m in (lambda row: row["prompt"] + row["completion"])(json.loads(line))]
    sys.path.insert(0, str(HERE))
    from generate_tools import tool_texts  # the mcp default's prompts: one tool model serves every tool default

    texts += tool_texts(template)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=1024, special_tokens=["<pad>", *TOOL_SPECIAL],
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<|im_end|>", bos_token=None)
    fast.add_tokens(TOOL_PLAIN)
    fast.chat_template = template
    folder.mkdir(exist_ok=True)
    fast.save_pretrained(folder)
    config = AutoConfig.from_pretrained(HERE / "model", vocab_size=len(fast), max_position_embeddings=1024, pad_token_id=fast.pad_token_id,
                                        eos_token_id=fast.eos_token_id)
    config.save_pretrained(folder)


def main() -> None:
    commit = repository(HERE / "swe" / "statslib.bundle")
    _write(HERE / "data" / "swe.jsonl", [{"prompt": [{"role": "user", "content": problem}], "repo": "../swe/statslib.bundle",
                                          "base_commit": commit, "test_command": command} for problem, command in TASKS])
    _write(HERE / "data" / "corpus.jsonl", [{"title": title, "text": body} for title, body in PASSAGES])
    _write(HERE / "data" / "search_qa.jsonl", [{"prompt": [{"role": "user", "content": question + ASK}], "answers": answers,
                                                "corpus": "corpus.jsonl"} for question, answers in QUESTIONS])
    shutil.rmtree(HERE / "tool-model", ignore_errors=True)
    tool_model(HERE / "tool-model")


if __name__ == "__main__":
    main()
