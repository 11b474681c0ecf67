"""Regenerates ``templates/tiny/tool-model``: a byte-level BPE trained on the tool-use prompts themselves (the tool
list Qwen3's template writes into every prompt then takes about 290 tokens rather than about 1000 with the arithmetic
tokenizer), Qwen3's chat template (TRL's bundled copy, so TRL parses its tool calls and swaps in its prefix-preserving
training template) and special tokens, and the tiny Qwen3-MoE config with that vocabulary; and
``data/tool_prompts.jsonl``, sums to answer with a tool.

    python templates/tiny/generate_tools.py      # deterministic; run after generate.py

The embedded default's ``tiny/model`` template renders no tools, so the ``mcp`` environment's default uses this one.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).parent
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
VOCAB = 1024
PLAIN = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]


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


def main() -> None:
    import trl
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(7)
    rows = []
    for _ in range(200):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append({"prompt": [{"role": "user", "content": f"Use the add tool. What is {a} + {b}?"}], "answer": a + b})
    (HERE / "data" / "tool_prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    out = HERE / "tool-model"
    template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(_texts(template, rows), trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<pad>", *SPECIAL],
                                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="<|im_end|>", bos_token=None)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL})
    tokenizer.add_tokens(PLAIN)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(out)
    config = json.loads((HERE / "model" / "config.json").read_text())
    config.update(vocab_size=len(tokenizer), max_position_embeddings=1024, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
