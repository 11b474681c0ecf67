"""bench/methods_vs_trl.py on the CPU: its command line, the rows it builds and the data each method trains on (no timing)."""

import importlib
import json
import sys
from pathlib import Path

import pytest
import yaml

BENCH = Path(__file__).resolve().parents[1] / "bench"
TOKENIZER = Path(__file__).resolve().parents[1] / "templates" / "tiny" / "model"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))  # the harness imports its sibling modules by name, as when run as a script
    try:
        yield importlib.import_module("methods_vs_trl")
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOKENIZER)


def test_rows_are_checked_before_anything_runs(bench):
    args = bench.parse_args([])
    assert [m for m, _ in args.plan] == ["dpo", "dpo", "kto", "kto", "reward", "reward", "classify", "classify", "distill", "distill", "smpo"]
    assert (args.seq, args.steps) == (4096, 20)
    assert bench.parse_args(["--rows", "kto:trl-bf16+nockpt+precompute"]).plan == [("kto", "trl-bf16+nockpt+precompute")]
    for rows in (["sft:trl-bf16"], ["dpo"], ["smpo:trl-bf16+nockpt"], ["reward:halo-ep1+precompute"], ["kto:halo-ep1+compiled"],
                 ["classify:trl-bf16+tf-ep"], ["distill:trl-bf16+precompute"]):
        with pytest.raises(SystemExit):
            bench.parse_args(["--rows", *rows])


def test_every_step_trains_on_two_sequences_of_seq_tokens_and_distill_on_one(bench):
    args = bench.parse_args([])
    for method in bench.METHODS:
        assert bench.tokens_per_step(method, bench.method_args(args, method)) == (1 if method == "distill" else 2) * 4096
    assert bench.method_args(args, "kto").batch == 2  # KTO's KL term needs two rows a batch
    assert bench.method_args(args, "distill").batch == 1


@pytest.mark.parametrize("method", ["dpo", "kto", "reward", "classify", "distill"])
def test_every_sequence_is_exactly_seq_tokens(bench, tokenizer, method, tmp_path):
    args = bench.method_args(bench.parse_args(["--seq", "120", "--prompt", "30"]), method)
    data = tmp_path / "rows.jsonl"
    bench.write_data(method, data, 6, args, tokenizer)
    shape = bench.check_data(method, data, tokenizer, 120, args.batch)
    assert shape["sequence_tokens"] == 120
    with pytest.raises(SystemExit):  # the same rows are too short (or, for reward and distill, not exact) for longer sequences
        bench.check_data(method, data, tokenizer, 300, args.batch)


def test_distill_rows_are_gkd_conversations_of_exactly_seq_tokens(bench, tokenizer, tmp_path):
    """GKD's collator takes each row whole (nothing cut, no padding at batch 1), a prompt and a completion in it."""
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl.experimental.utils import DataCollatorForChatML

    args = bench.method_args(bench.parse_args(["--seq", "120", "--prompt", "30"]), "distill")
    data = tmp_path / "rows.jsonl"
    bench.write_data("distill", data, 4, args, tokenizer)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert all([m["role"] for m in r["messages"]] == ["user", "assistant"] for r in rows)
    batch = DataCollatorForChatML(tokenizer=tokenizer, max_length=120)(rows[:2])
    assert batch["input_ids"].shape == (2, 120) and batch["attention_mask"].all()
    completion = (batch["labels"] != -100).sum(1)
    assert ((completion > 0) & (completion < 120 - 30)).all()
    assert bench.check_data("distill", data, tokenizer, 120, 1)["prompt_tokens_min"] >= 30


def test_the_teacher_is_the_students_config_at_another_seed(bench, tmp_path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(TOKENIZER)
    folder = bench.saved_teacher(tmp_path, config)
    assert folder == tmp_path / bench.TEACHER
    teacher = AutoModelForCausalLM.from_pretrained(folder, dtype="auto")
    assert teacher.dtype == torch.bfloat16
    torch.manual_seed(0)  # the student, as the stock row and Halo's random_init draw it
    student = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    name = next(n for n, _ in student.named_parameters() if "q_proj" in n)
    assert not torch.equal(teacher.state_dict()[name], student.state_dict()[name])


def test_a_halo_row_launches_its_method_with_its_own_keys(bench, tmp_path):
    from sft_halo_row import halo_command
    from transformers import TrainingArguments
    from trl import KTOConfig, RewardConfig
    from trl.experimental.gkd import GKDConfig

    args = bench.parse_args(["--workdir", str(tmp_path)])
    for method, config in (("kto", KTOConfig), ("reward", RewardConfig), ("classify", TrainingArguments), ("distill", GKDConfig)):
        margs = bench.method_args(args, method)
        variant = "halo-ep1+compile+nockpt"
        command = halo_command(variant, bench.parse(variant, method), margs, tmp_path, method, bench.halo_fields(method, tmp_path))
        assert command[command.index("launch") + 1] == method
        run = yaml.safe_load(Path(command[command.index(method) + 1]).read_text())
        assert run["compile_layers"] and not run["gradient_checkpointing"] and run["per_device_train_batch_size"] == margs.batch
        assert ("router_aux_loss_coef" in run) == (method in ("kto", "distill"))
        if method == "distill":  # fixed rows only, GKD's JSD, the teacher the stock row loads
            assert (run["lmbda"], run["beta"], run["teacher_model_name_or_path"]) == (0.0, 0.5, str((tmp_path / bench.TEACHER).resolve()))
        assert run.pop("num_labels", 2) == 2 and (method == "classify" or "num_labels" not in run)
        for key in ("compile_layers", "expert_parallel_size", "random_init", "dataset", "model_name_or_path"):
            run.pop(key)
        if method == "classify":
            run.pop("max_length")  # ClassifyConfig's, over TrainingArguments
        config(**{**run, "use_cpu": True})  # every other key is one the method's config takes


def test_smpo_is_set_beside_stock_dpo_and_each_method_beside_its_own(bench):
    rows = [{"method": m, "variant": v, "tokens_per_s": t} for m, v, t in (
        ("dpo", "trl-bf16+nockpt", 20), ("dpo", "halo-ep1+compile+nockpt", 30), ("kto", "trl-bf16+nockpt", 10),
        ("kto", "halo-ep1+compile+nockpt", 15), ("kto", "halo-ep1+precompute", 15), ("smpo", "halo-ep1+compile+nockpt", 40),
        ("distill", "trl-bf16+nockpt", 8), ("distill", "halo-ep1+compile+nockpt", 10))]
    ratios = bench.ratios_to_stock(rows)
    assert [ratios[i][0] for i in range(4)] == [1.0, 1.5, 1.0, 1.5]
    assert ratios[4][1] == "none" and ratios[5] == (2.0, "dpo:trl-bf16+nockpt")
    assert ratios[7] == (1.25, "distill:trl-bf16+nockpt")


def test_flops_count_what_each_step_runs(bench):
    config = json.loads((BENCH / "configs" / "qwen3-moe-3b.config.json").read_text())
    flops = lambda method, variant="trl-bf16": bench.flops_per_trained_token(method, bench.parse(variant, method), config, 4096)  # noqa: E731
    assert flops("dpo") == pytest.approx(flops("smpo") * 4 / 3)
    assert flops("kto") == pytest.approx(flops("smpo") * 2)
    assert flops("kto", "trl-bf16+precompute") == pytest.approx(flops("smpo") * 4 / 3)
    assert flops("reward") == flops("classify") < flops("smpo")
    assert flops("distill") == pytest.approx(flops("dpo"))  # the student's training pass and the teacher's forward
    assert flops("distill", "halo-ep1+compile+nockpt") == flops("distill")
