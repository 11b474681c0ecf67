#!/bin/bash
# bench/plan_vs_peak.py on a GPU machine: the 3B benchmark MoE (random init, bf16), the bundled arithmetic
# rows (4,000 short chat rows) packed to 4,096 tokens, one process; with and without activation checkpointing. Prints the Markdown rows of benchmarks.md.
set -e
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/halo-plugin-qwen3-moe >/dev/null 2>&1 || true
M=$(mktemp -d)
cp bench/configs/qwen3-moe-3b.config.json $M/config.json
cp templates/tiny/model/tokenizer.json templates/tiny/model/tokenizer_config.json templates/tiny/model/chat_template.jinja $M/
cat > $M/sft.yaml <<YAML
model_name_or_path: $M
random_init: true
dataset:
  - path: $PWD/templates/tiny/data/arithmetic.jsonl
max_length: 4096
packing: true
per_device_train_batch_size: 1
bf16: true
max_steps: 3
logging_steps: 1
YAML
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for ckpt in ${CKPTS:-false true}; do
  echo "activation_checkpointing: $ckpt"
  python3 bench/plan_vs_peak.py $M/sft.yaml --method sft --nproc 1 -- --activation_checkpointing=$ckpt 2>&1 | grep -E '^\|'
done
