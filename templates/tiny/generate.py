"""Regenerates the embedded default: arithmetic chat data, a tokenizer trained on it, and a tiny Qwen3-MoE config.

    python templates/tiny/generate.py      # rewrites templates/tiny/{data,model}; deterministic

The task (add or subtract two numbers below 100) is one a tiny model visibly learns
within a few hundred steps on a CPU, so the first run shows a falling loss.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
EXAMPLES = 4000
SPECIAL = ["<pad>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MODEL = {
    "model_type": "qwen3_moe",
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
    "output_router_logits": False,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
}


def examples(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(EXAMPLES):
        a, b = rng.randrange(100), rng.randrange(100)
        op = rng.choice("+-")
        answer = a + b if op == "+" else a - b
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"What is {a} {op} {b}?"}],
                "completion": [{"role": "assistant", "content": f"{a} {op} {b} = {answer}"}],
            }
        )
    return rows


def main() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoConfig, PreTrainedTokenizerFast

    rows = examples()
    data = HERE / "data"
    data.mkdir(exist_ok=True)
    (data / "arithmetic.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    texts = [m["content"] for r in rows for m in r["prompt"] + r["completion"]]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<|end|>", bos_token=None)
    fast.chat_template = CHAT_TEMPLATE
    model_dir = HERE / "model"
    fast.save_pretrained(model_dir)

    config = AutoConfig.for_model(**MODEL, vocab_size=len(fast), pad_token_id=fast.pad_token_id, eos_token_id=fast.eos_token_id, bos_token_id=None)
    config.save_pretrained(model_dir)


if __name__ == "__main__":
    main()
