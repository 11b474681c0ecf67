"""`halo launch offline-grpo`: the trainer's loss is the direct formula of each loss type on the model's own
log-probs and hand-computed advantages; malformed groups are refused before start (every declared split against one
process on groups whose completions differ in length: tests/test_equivalence_matrix.py)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from launch_kit import TINY

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)



@pytest.fixture(scope="module")
def run_file(method_runs):
    return method_runs.config("offline-grpo")


def _direct(model, rows, loss_type, max_completion_length=64):
    """GRPO's loss written out: per completion its tokens' log-probs from the full softmax, ratio 1, advantage A."""
    per_sequence, token_sums, tokens = [], 0.0, 0
    for prompt_ids, completion_ids, advantage in rows:
        ids = torch.tensor([prompt_ids + completion_ids])
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].log_softmax(-1)
        logp = logits.gather(-1, torch.tensor(completion_ids).unsqueeze(-1)).squeeze(-1)
        term = -(torch.exp(logp - logp.detach()) * advantage)
        per_sequence.append(term.mean())
        token_sums, tokens = token_sums + term.sum(), tokens + len(completion_ids)
    if loss_type == "grpo":
        return torch.stack(per_sequence).mean()
    if loss_type == "bnpo":
        return token_sums / tokens
    return token_sums / (len(rows) * max_completion_length)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
@pytest.mark.parametrize("normalizer", ["z_norm", "quantile_norm"])
def test_the_trainers_loss_is_the_direct_formula(tmp_path, loss_type, normalizer):
    import datasets
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from halo_core.methods.offline_grpo import OfflineGRPOConfig, OfflineGRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(TINY)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY), dtype=torch.float32)
    groups = [{"prompt": "1 2 3", "completions": ["4", "4 5 6 7", "9 9"], "rewards": [1.0, 0.0, 3.0]},
              {"prompt": "8", "completions": ["1 1 1 1 1", "2"], "rewards": [0.5, 0.5]}]  # a flat group: no signal
    args = OfflineGRPOConfig(output_dir=str(tmp_path), loss_type=loss_type, advantage_normalizer=normalizer, max_completion_length=64,
                             use_cpu=True, report_to="none", per_device_train_batch_size=5)
    trainer = OfflineGRPOTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(groups), processing_class=tokenizer)
    flat = trainer.train_dataset
    assert len(flat) == 5
    batch = trainer.data_collator([flat[i] for i in range(5)])
    loss = trainer.compute_loss(model, batch)
    from halo_core.rl.advantages import group_advantages

    advantages = torch.cat([group_advantages(torch.tensor(g["rewards"]), normalizer) for g in groups])
    rows = [(flat[i]["prompt_ids"], flat[i]["completion_ids"], advantages[i]) for i in range(5)]
    assert all(r[1][-1] == tokenizer.eos_token_id for r in rows)  # text completions end with EOS, as TRL's do
    expected = _direct(model, rows, loss_type)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    grads = torch.autograd.grad(loss, model.lm_head.weight)[0]
    direct = torch.autograd.grad(_direct(model, rows, loss_type), model.lm_head.weight)[0]
    torch.testing.assert_close(grads, direct, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("row, message", [
    ({"prompt": "1", "completions": ["a", "b"], "rewards": [1.0]}, "row 1 has 2 completions and 1 rewards"),
    ({"prompt": "1", "completions": ["a"], "rewards": [1.0]}, "row 1 has 1 completion; a group needs at least 2"),
])
def test_malformed_groups_are_refused_before_start(tmp_path, row, message):
    from halo_core.errors import ConfigError
    from halo_core.methods.offline_grpo import OfflineGRPOConfig
    from halo_core.trainers.run_checks import check_run
    from halo_core.trainers.run_config import load_run_config, parse_overrides

    (tmp_path / "groups.jsonl").write_text(json.dumps(row) + "\n")
    config = tmp_path / "run.yaml"
    config.write_text(f"model_name_or_path: {TINY}\nrandom_init: true\ndataset:\n  - path: groups.jsonl\n")
    with pytest.raises(ConfigError) as caught:
        check_run(load_run_config("offline-grpo", OfflineGRPOConfig, config, parse_overrides([])))
    assert re.search(re.escape(message), str(caught.value)) and "\n" not in str(caught.value)


@pytest.mark.parametrize("overrides, says", [
    (["--loss_type=dapo"], "loss_type='dapo' is refused by OfflineGRPOConfig: loss_type must be one of"),
    (["--advantage_normalizer=rank"], "advantage_normalizer='rank' is refused by OfflineGRPOConfig"),
    (["--loss_type=dr_grpo"], "loss_type='dr_grpo' is refused by OfflineGRPOConfig: loss_type 'dr_grpo' divides by max_completion_length"),
])
def test_an_impossible_key_is_refused_before_start_with_its_field(run_file, overrides, says):
    from halo_core.errors import ConfigError
    from halo_core.methods.offline_grpo import OfflineGRPOConfig
    from halo_core.trainers.run_checks import check_run
    from halo_core.trainers.run_config import load_run_config, parse_overrides

    with pytest.raises(ConfigError) as caught:
        check_run(load_run_config("offline-grpo", OfflineGRPOConfig, run_file, parse_overrides(overrides)))
    assert says in str(caught.value) and "\n" not in str(caught.value)
