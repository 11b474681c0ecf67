"""Regenerates ``data/tool_prompts.jsonl`` (sums to answer with a tool) and ``templates/tiny/tool-model``, whose
byte-level BPE (``generate_environments.tool_model``) is trained on every tool default's rendered prompts, these
included: the tool list Qwen3's template writes into every prompt then takes a few hundred tokens, not about 1000.

    python templates/tiny/generate_tools.py      # deterministic; run after generate.py

The embedded default's ``tiny/model`` template renders no tools, so the ``mcp`` environment's default uses this one.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).parent


def _texts(template: str, rows: list[dict]) -> list[str]:
    """What the tokenizer will see: each prompt rendered with the bundled MCP server's tools, and tool calls and results."""
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    sys.path.insert(0, str(HERE.parents[1]))
    from halo_core.rl.environments.mcp import mcp

    environment = mcp()
    renderer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), eos_token="<|im_end|>")
    renderer.chat_template = template
    texts = []
    for row in rows:
        a, b = (int(n) for n in row["prompt"][0]["content"].rstrip("?").split(" is ")[1].split(" + "))
        call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}]}
        conversation = row["prompt"] + [call, {"role": "tool", "name": "add", "content": str(a + b)}, {"role": "assistant", "content": str(a + b)}]
        texts.append(renderer.apply_chat_template(conversation, tools=[environment.add, environment.lookup], tokenize=False))
    return texts


def tool_texts(template: str) -> list[str]:
    """The rendered tool prompts of ``data/tool_prompts.jsonl``, for ``generate_environments.tool_model``."""
    rows = [json.loads(line) for line in (HERE / "data" / "tool_prompts.jsonl").read_text().splitlines()]
    return _texts(template, rows)


def main() -> None:
    rng = random.Random(7)
    rows = []
    for _ in range(200):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append({"prompt": [{"role": "user", "content": f"Use the add tool. What is {a} + {b}?"}], "answer": a + b})
    (HERE / "data" / "tool_prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sys.path.insert(0, str(HERE))
    from generate_environments import tool_model

    tool_model(HERE / "tool-model")


if __name__ == "__main__":
    main()
