"""Regenerates ``templates/tiny/tool-model``: the tiny model's tokenizer with Qwen3's chat template (TRL's bundled copy,
so TRL parses its tool calls and swaps in its prefix-preserving training template) and its special tokens, and a
config with room for the tool list a tool-use prompt carries; and ``data/tool_prompts.jsonl``, sums to answer with a tool.

    python templates/tiny/generate_tools.py      # deterministic; run after generate.py

The embedded default's ``tiny/model`` template renders no tools, so the ``mcp`` environment's default uses this one.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
PLAIN = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]


def main() -> None:
    import trl
    from transformers import AutoTokenizer

    out = HERE / "tool-model"
    tokenizer = AutoTokenizer.from_pretrained(HERE / "model")
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL})
    tokenizer.add_tokens(PLAIN)
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.save_pretrained(out)
    config = json.loads((HERE / "model" / "config.json").read_text())
    config.update(vocab_size=len(tokenizer), max_position_embeddings=2048, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
                  pad_token_id=tokenizer.pad_token_id)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    rng = random.Random(7)
    rows = []
    for _ in range(200):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append({"prompt": [{"role": "user", "content": f"Use the add tool. What is {a} + {b}?"}], "answer": a + b})
    (HERE / "data" / "tool_prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
