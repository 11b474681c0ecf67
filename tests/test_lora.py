"""LoRA on the tiny MoE with TRL's keys (``all-linear``: attention, router and every fused expert, as PEFT reads it).

One process against stock TRL + PEFT ``target_parameters``; only adapters train; PEFT's loader and the merged export
reproduce the trained model; an EP2 x TP2 resume continues exactly; DPO's reference and a score head under EP2. Every
split LoRA declares against one process (losses within 1e-5, adapter weights after SGD steps within 1e-4, uneven
lengths) is tests/test_equivalence_matrix.py's ``sft-lora`` row."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from halo_core.testing.compare import assert_close
from launch_kit import GLOBAL_BATCH, LORA, OPTIMIZERS, STEPS, TINY, assert_planned, console, launch, logged, noise_in, write_run

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

@pytest.fixture(scope="module")
def run_file(method_runs):
    return method_runs.config("sft-lora")


@pytest.fixture(scope="module")
def single(method_runs):
    """The one-process run the equivalence matrix compares every layout against (tests/test_equivalence_matrix.py)."""
    return method_runs.single("sft-lora")


def adapter(out) -> dict[str, torch.Tensor]:
    return load_file(str(out / "adapter_model.safetensors"))


def test_the_adapter_reaches_attention_router_and_every_expert(single):
    keys = adapter(single)
    for part in ("self_attn.q_proj.lora_A", "self_attn.o_proj.lora_B", "mlp.gate.lora_A", "mlp.experts.lora_A", "mlp.experts.base_layer.lora_B"):
        assert any(part in key for key in keys), part
    config = json.loads((single / "adapter_config.json").read_text())
    assert sorted(config["target_parameters"]) == ["down_proj", "gate.weight", "gate_up_proj"]
    # gate_proj and up_proj fuse into gate_up_proj: PEFT doubles its rank (and alpha) to keep each half's
    experts_a = next(v for k, v in keys.items() if k.endswith("layers.0.mlp.experts.base_layer.lora_A.weight"))
    assert experts_a.shape == (8 * 8, 64)  # 8 experts x rank 8, hidden 64
    # PEFT's "rank_pattern keys ... were ignored" (the fused pair's key, which the grouped LoRA reads) and "Already
    # found a peft_config attribute" (one adapter injected in several calls) were false alarms, no longer raised
    assert not noise_in(console(single).read_text())


def test_one_process_equals_stock_trl_with_peft_target_parameters(single, run_file, tmp_path):
    """Stock: TRL's SFTTrainer over ``get_peft_model`` with the LoraConfig TRL builds from the same keys (PEFT's
    ParamWrapper on the fused experts), the model Halo's random_init builds, the adapter drawn from the same seed."""
    import datasets
    from peft import get_peft_model, get_peft_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl import ModelConfig, SFTConfig, SFTTrainer, get_peft_config

    args = SFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=GLOBAL_BATCH, max_steps=STEPS, lr_scheduler_type="constant",
                     warmup_steps=0, logging_steps=1, save_strategy="no", router_aux_loss_coef=0.0, seed=5, max_grad_norm=1.0, bf16=False,
                     report_to="none", optim="sgd", learning_rate=0.5, use_cpu=True)
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY), dtype=torch.float32)
    lora = get_peft_config(ModelConfig(use_peft=True, lora_r=4, lora_alpha=8, lora_dropout=0.0, lora_target_modules=["all-linear"]))
    torch.manual_seed(5)
    peft_model = get_peft_model(model, lora)
    data = datasets.load_dataset("json", data_files=str(run_file.parent / "completion.jsonl"), split="train")
    trainer = SFTTrainer(model=peft_model, args=args, train_dataset=data, processing_class=AutoTokenizer.from_pretrained(TINY))
    trainer.train()
    stock_losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert logged(single, "loss") == pytest.approx(stock_losses, abs=1e-5, rel=1e-6)
    stock = {"base_model.model." + k if not k.startswith("base_model.") else k: v for k, v in get_peft_model_state_dict(peft_model).items()}
    ours = adapter(single)
    assert sorted(ours) == sorted(stock)
    for key, tensor in ours.items():
        assert_close(tensor, stock[key], f"{key} after {STEPS} SGD steps, Halo against stock PEFT", rtol=1e-4)


def test_resuming_on_ep2_tp2_restores_adapters_and_their_optimizer_state(run_file, tmp_path):
    """Under AdamW (moments to restore): a run resumed from its step-2 checkpoint ends where the uninterrupted run did;
    expert adapters read as each EP rank's block, TP-split ones into their DTensor shards."""
    adamw = [*OPTIMIZERS["adamw"], "--expert_parallel_size=2", "--tensor_parallel_size=2", "--save_steps=1"]
    from halo_core.trainers.parts.tensor_bytes import ENV

    whole = launch("sft", run_file, tmp_path / "whole", 4, *adamw, env={ENV: str(tmp_path / "tensor-bytes")})
    assert_planned("sft", run_file, whole, 4, adamw)  # halo plan's bytes with adapters are the real ones, rank by rank
    state = json.loads((whole / "checkpoint-2" / "optimizer" / "optimizer.json").read_text())
    names = [n for group in state["param_groups"] for n in group["params"]]
    assert names and all("lora_" in n for n in names), names[:5]  # no optimizer state for any base weight
    resumed = launch("sft", run_file, tmp_path / "resumed", 4, *adamw, f"--resume_from_checkpoint={whole / 'checkpoint-2'}")
    assert logged(resumed, "loss") == pytest.approx(logged(whole, "loss"), abs=1e-6, rel=0)
    expected = adapter(whole)
    for key, tensor in adapter(resumed).items():
        assert torch.equal(tensor, expected[key]), f"{key} after a resumed third AdamW step"


def test_only_adapters_train_and_peft_and_the_merged_export_reproduce_the_trained_model(run_file, tmp_path):
    """In process, so the trained model itself can be asked: its base is bit-identical to the base the run wrote
    before step one, no base weight has a gradient or optimizer state, and stock PEFT loading the adapter over
    that base (and ``halo export --merge``'s model) give the trained model's logits."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig

    from halo_core.lora.peft_format import base_state
    from halo_core.methods.sft import HaloSFTTrainer
    from halo_core.trainers.run_config import load_run_config, parse_overrides
    from halo_core.trainers.runtime import train

    out = tmp_path / "run"
    overrides = [f"--output_dir={out}", "--per_device_train_batch_size=4", "--max_steps=2", "--save_strategy=no", "--bf16=false",
                 "--report_to=none", "--learning_rate=5e-2", "--lora_dropout=0.1", "--merge_adapter=true"]
    trainer = train(load_run_config("sft", SFTConfig, run_file, parse_overrides(overrides)), HaloSFTTrainer, SFTConfig)
    model = trainer.model
    initial = load_file(str(out / "base" / "model.safetensors"))
    for name, tensor in base_state(model).items():
        if name in initial:  # a tied head is stored once
            assert torch.equal(tensor, initial[name]), f"{name} changed in training"
    trained = {id(p) for p in model.parameters() if p.requires_grad}
    assert all(p.grad is None for p in model.parameters() if id(p) not in trained)
    assert trainer.optimizer.state and all(id(p) in trained for p in trainer.optimizer.state)
    assert sum(p.numel() for p in model.parameters() if id(p) in trained) < 0.2 * sum(p.numel() for p in model.parameters())

    ids = torch.tensor([[5, 9, 17, 33, 2, 64, 80, 3], [7, 7, 12, 90, 101, 4, 0, 0]])
    model.eval()
    with torch.no_grad():
        ours = model(input_ids=ids).logits
        base = AutoModelForCausalLM.from_pretrained(out / "base", dtype=torch.float32)
        peft = PeftModel.from_pretrained(base, str(out)).eval()(input_ids=ids).logits
        merged = AutoModelForCausalLM.from_pretrained(out / "merged", dtype=torch.float32)(input_ids=ids).logits  # merge_adapter: true
    assert_close(peft, ours, "stock PEFT over the saved base against the trained model", rtol=1e-5)
    assert_close(merged, ours, "the merged export against the trained model", rtol=1e-5)
    assert (ours - AutoModelForCausalLM.from_pretrained(out / "base", dtype=torch.float32)(input_ids=ids).logits).abs().max() > 1e-3


@pytest.mark.parametrize("method, kind", [("dpo", "preference"), ("reward", "preference")])
def test_a_reference_method_and_a_score_head_method_train_adapters_under_ep2_as_on_one_process(method, kind, tmp_path):
    """The adapters are the model's, whatever the method: DPO's frozen reference is the base without them (what
    TRL's PEFT path gets by disabling the adapter), the reward model's score head trains whole (PEFT's SEQ_CLS)."""
    from launch_kit import COMMON, HEAD_COMMON

    run_file = write_run(tmp_path, kind, LORA)
    common = HEAD_COMMON if method == "reward" else COMMON
    one = launch(method, run_file, tmp_path / "single", 1, *OPTIMIZERS["sgd"], common=common)
    two = launch(method, run_file, tmp_path / "ep2", 2, *OPTIMIZERS["sgd"], "--expert_parallel_size=2", common=common)
    assert logged(two, "loss") == pytest.approx(logged(one, "loss"), abs=1e-5, rel=1e-6)
    expected = adapter(one)
    assert (method == "reward") == ("base_model.model.score.weight" in expected)
    for key, tensor in adapter(two).items():
        assert_close(tensor, expected[key], f"{key} after {STEPS} SGD steps at ep2", rtol=1e-4)


def test_halo_export_merge_writes_a_plain_checkpoint_of_the_trained_run(single, tmp_path):
    """The trained run's adapter (attention, router, every fused expert) merged tensor by tensor equals stock PEFT's
    ``merge_and_unload`` over the whole base, saved by transformers: same keys (the experts one tensor each, as the
    base stores them), dtypes and bits; and it gives PEFT's logits."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from conftest import run_halo
    from export_kit import assert_same_checkpoint, reference

    result = run_halo("export", "--merge", str(single), str(tmp_path / "merged"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    reference(single, tmp_path / "peft")
    assert_same_checkpoint(tmp_path / "merged", tmp_path / "peft")
    ids = torch.tensor([[5, 9, 17, 33, 2, 64, 80, 3]])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)(input_ids=ids).logits
        base = AutoModelForCausalLM.from_pretrained(single / "base", dtype=torch.float32)
        peft = PeftModel.from_pretrained(base, str(single))(input_ids=ids).logits
    assert_close(merged, peft, "halo export --merge against PEFT over the base", rtol=1e-5)


def test_a_lora_mistake_and_an_export_without_adapter_exit_2_with_one_line(run_file, tmp_path):
    from conftest import run_halo

    refused = run_halo("launch", "sft", str(run_file), "--nproc", "2", "--dry-run", "--", "--lora_target_modules=[gate_up_proj]", cwd=tmp_path)
    assert refused.returncode == 2 and "lora_target_parameters" in refused.stderr and "Traceback" not in refused.stderr
    empty = run_halo("export", "--merge", str(tmp_path), str(tmp_path / "merged"), cwd=tmp_path)
    assert empty.returncode == 2 and "holds no adapter" in empty.stderr and "Traceback" not in empty.stderr
    unmerged = run_halo("export", str(tmp_path), str(tmp_path / "merged"), cwd=tmp_path)
    assert unmerged.returncode == 2 and "add --merge" in unmerged.stderr and "Traceback" not in unmerged.stderr


def test_grouped_dropout_is_the_direct_formula_while_training_and_off_in_eval():
    """s * B_e A_e dropout(x) per expert, against a direct loop over experts with the same dropout mask."""
    from torch import nn

    from halo_core.lora import grouped

    experts = nn.Module()
    experts.w_lora_A = nn.Parameter(torch.randn(3, 4, 8))  # grouped_mm: rows of a multiple of 16 bytes
    experts.w_lora_B = nn.Parameter(torch.randn(3, 4, 4))
    rows, counts = torch.randn(7, 8), torch.tensor([3, 0, 4])
    offsets = torch.cumsum(counts, 0).to(torch.int32)
    spec = grouped.ExpertLora(scaling=0.5, dropout=0.3)
    torch.manual_seed(0)
    got = grouped.delta(experts, spec, "w", rows, offsets)
    torch.manual_seed(0)
    dropped = nn.functional.dropout(rows, 0.3)
    ids = torch.repeat_interleave(torch.arange(3), counts)
    direct = torch.stack([0.5 * experts.w_lora_B[e] @ experts.w_lora_A[e] @ dropped[i] for i, e in enumerate(ids.tolist())])
    assert_close(got, direct, "grouped LoRA with dropout against the per-expert formula")
    experts.eval()
    plain = torch.stack([0.5 * experts.w_lora_B[e] @ experts.w_lora_A[e] @ rows[i] for i, e in enumerate(ids.tolist())])
    assert_close(grouped.delta(experts, spec, "w", rows, offsets), plain, "grouped LoRA in eval mode (no dropout)")
