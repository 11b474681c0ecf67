"""Regenerates the embedded default: arithmetic chat data, a tokenizer trained on it, and a tiny Qwen3-MoE config.

    python templates/tiny/generate.py      # rewrites templates/tiny/{data,model}; deterministic

The task (add or subtract two numbers below 100) is one a tiny model visibly learns
within a few hundred steps on a CPU, so the first run shows a falling loss. The
preference, KTO and classification sets pose the same sums with a right answer (chosen,
desirable, label 1) and a hedged one off by 1 to 9 (rejected, undesirable, label 0), in
TRL's formats; the hedge is a signal a tiny random-init model finds within a minute (the
arithmetic alone it does not), so every method's metric visibly moves. GRPO's prompts carry their
answer (SDPG's hint; ``exact_answer`` for runs of your own: the GRPO default rewards only an answer's shape); offline GRPO's groups carry four scored completions each.
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


def _sum(rng: random.Random) -> tuple[str, str, str]:
    """A question, its right answer and a wrong one, as the chat strings the data holds."""
    a, b = rng.randrange(100), rng.randrange(100)
    op = rng.choice("+-")
    answer = a + b if op == "+" else a - b
    wrong = answer + rng.choice([-1, 1]) * rng.randrange(1, 10)
    return f"What is {a} {op} {b}?", f"{a} {op} {b} = {answer}", f"{a} {op} {b} = {wrong}, I think"


def preferences(seed: int = 1, count: int = 2000) -> list[dict]:
    """TRL's conversational preference format: prompt, chosen, rejected (DPO, SMPO, reward)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        question, right, wrong = _sum(rng)
        rows.append({"prompt": [{"role": "user", "content": question}], "chosen": [{"role": "assistant", "content": right}],
                     "rejected": [{"role": "assistant", "content": wrong}]})
    return rows


def unpaired(seed: int = 2, count: int = 2000) -> list[dict]:
    """TRL's unpaired preference format: prompt, completion, label (KTO); half the answers right."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        question, right, wrong = _sum(rng)
        good = rng.random() < 0.5
        rows.append({"prompt": [{"role": "user", "content": question}], "completion": [{"role": "assistant", "content": right if good else wrong}],
                     "label": good})
    return rows


def labelled(seed: int = 3, count: int = 2000) -> list[dict]:
    """Sequence classification rows: text, label (1 = the sum is right)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        _, right, wrong = _sum(rng)
        good = rng.random() < 0.5
        rows.append({"text": right if good else wrong, "label": int(good)})
    return rows


def prompts(seed: int = 4, count: int = 2000) -> list[dict]:
    """GRPO prompts with the answer the ``exact_answer`` reward checks: prompt, answer."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        question, right, _ = _sum(rng)
        rows.append({"prompt": [{"role": "user", "content": question}], "answer": int(right.rsplit(" ", 1)[1])})
    return rows


def groups(seed: int = 5, count: int = 1000) -> list[dict]:
    """Offline GRPO groups: prompt, completions, rewards (1 for a plain answer, 0 for a hedged one, half a point more
    for the right sum), four completions a prompt in a shuffled order; the hedge is what a tiny model learns first."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        question, right, wrong = _sum(rng)
        plain_wrong = wrong.removesuffix(", I think")
        scored = [(right, 1.5), (plain_wrong, 1.0), (right + ", I think", 0.5), (wrong, 0.0)]
        rng.shuffle(scored)
        rows.append({"prompt": [{"role": "user", "content": question}],
                     "completions": [[{"role": "assistant", "content": text}] for text, _ in scored],
                     "rewards": [reward for _, reward in scored]})
    return rows


def pairs(seed: int = 6, count: int = 2000) -> list[dict]:
    """Sentence-transformers' (anchor, positive) pairs (embed): a question and its answer's text; the other rows'
    answers are each anchor's in-batch negatives."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        question, answer, _ = _sum(rng)
        rows.append({"anchor": question, "positive": answer})
    return rows


def held_out(count: int = 64, seed: int = 1) -> list[dict]:
    """The SFT default's evaluation set: sums of the same kind that the training rows do not pose."""
    seen = {r["prompt"][0]["content"] for r in examples()}
    rows = []
    for row in examples(seed):
        if row["prompt"][0]["content"] not in seen and len(rows) < count:
            seen.add(row["prompt"][0]["content"])
            rows.append(row)
    return rows


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoConfig, PreTrainedTokenizerFast

    rows = examples()
    data = HERE / "data"
    data.mkdir(exist_ok=True)
    _write(data / "arithmetic.jsonl", rows)
    _write(data / "arithmetic-eval.jsonl", held_out())
    _write(data / "preference.jsonl", preferences())
    _write(data / "unpaired.jsonl", unpaired())
    _write(data / "labelled.jsonl", labelled())
    _write(data / "prompts.jsonl", prompts())
    _write(data / "groups.jsonl", groups())
    _write(data / "pairs.jsonl", pairs())

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
