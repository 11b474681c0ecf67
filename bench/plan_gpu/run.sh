#!/bin/bash
# bench/plan_vs_peak.py on a GPU machine: the 3B benchmark MoE (random init, bf16), random words packed to
# 4,096 tokens (random words: every packed row is full, which the bundled arithmetic rows, 23 short ones, are not), one
# process; with and without activation checkpointing. Prints the Markdown rows of benchmarks.md.
set -e
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/halo-plugin-qwen3-moe >/dev/null 2>&1 || true
M=$(mktemp -d)
cp bench/configs/qwen3-moe-3b.config.json $M/config.json
cp templates/tiny/model/tokenizer.json templates/tiny/model/tokenizer_config.json templates/tiny/model/chat_template.jinja $M/
python3 - "$M/words.jsonl" <<'PY'
import json, random, sys
draw = random.Random(0)
words = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "seven", "paper", "light", "north", "quiet"]
with open(sys.argv[1], "w") as f:
    for _ in range(16):
        f.write(json.dumps({"text": " ".join(draw.choice(words) for _ in range(3000))}) + "\n")
PY
cat > $M/sft.yaml <<YAML
model_name_or_path: $M
random_init: true
dataset:
  - path: $M/words.jsonl
max_length: 4096
packing: true
per_device_train_batch_size: 1
bf16: true
max_steps: 3
logging_steps: 1
YAML
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for ckpt in false true; do
  echo "activation_checkpointing: $ckpt"
  python3 bench/plan_vs_peak.py $M/sft.yaml --method sft --nproc 1 -- --activation_checkpointing=$ckpt 2>&1 | grep -E '^\|'
done
