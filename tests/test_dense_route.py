"""A model no plugin claims (a dense Llama) trains through the plain FSDP2 route, exactly like one process."""

import shutil

import pytest
from transformers import AutoConfig

from halo_core.testing.compare import assert_close
from test_launch import COMMON, ROOT, launch, losses, weights

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)


@pytest.fixture(scope="module")
def dense_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dense") / "llama"
    tokenizer = ROOT / "templates" / "tiny" / "model"
    shutil.copytree(tokenizer, folder, ignore=shutil.ignore_patterns("config.json"))
    moe = AutoConfig.from_pretrained(tokenizer)
    AutoConfig.for_model(
        "llama", vocab_size=moe.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=moe.pad_token_id, eos_token_id=moe.eos_token_id, bos_token_id=None,
    ).save_pretrained(folder)
    return folder


def test_dense_model_fsdp2_run_matches_one_process(dense_model, tmp_path):
    args = [*COMMON, f"--model_name_or_path={dense_model}", "--expert_parallel_size=1", "--save_strategy=steps", "--save_steps=4"]
    one, two = tmp_path / "one", tmp_path / "two"
    launch(one, *args, "--per_device_train_batch_size=2")
    launch(two, *args, "--per_device_train_batch_size=1", nproc=2)
    assert losses(two) == pytest.approx(losses(one), abs=1e-4)
    reference = weights(one)
    for name, tensor in weights(two).items():
        assert_close(tensor, reference[name], f"{name}: dense model, FSDP2 over 2 ranks")
    assert AutoConfig.from_pretrained(two).model_type == "llama"


def test_dense_model_refuses_expert_parallelism(dense_model, tmp_path):
    from conftest import run_halo

    result = run_halo("launch", "sft", str(ROOT / "templates" / "configs" / "tiny-qwen3-moe.yaml"), "--nproc", "2", "--",
                      f"--model_name_or_path={dense_model}", f"--output_dir={tmp_path}")
    assert result.returncode == 2 and "no installed family plugin claims model type 'llama', so it trains with data parallelism (FSDP2) only, not ep=2" in result.stderr
