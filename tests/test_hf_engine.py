"""The in-process ``hf`` engine on the tiny MoE: at one process it samples what stock ``generate`` samples from
the same generator state, with the processed scores' log-probs; on two expert-parallel ranks each rank's
completions are the one-process run's rows."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from halo_core.rl.engines import SamplingParams
from halo_core.rl.hf_engine import HFEngine
from halo_core.testing.spawn import spawn
from launch_kit import TINY

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

PROMPTS = [[5, 6, 7], [9, 10], [11], [12, 13, 14, 15]]  # uneven: every batch is left-padded
PARAMS = SamplingParams(num_generations=2, max_completion_length=8)


def _model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY), dtype=torch.float32).eval()


def _config(tokenizer, **extra) -> GenerationConfig:
    return GenerationConfig(do_sample=True, temperature=0.9, top_p=0.95, top_k=50, pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id, max_new_tokens=PARAMS.max_completion_length, **extra)


@pytest.mark.parametrize("extra", [{}, {"min_new_tokens": 6, "repetition_penalty": 1.3, "min_p": 0.01}], ids=["sampling", "processors"])
def test_one_process_samples_what_stock_generate_samples(extra):
    model, tokenizer = _model(), AutoTokenizer.from_pretrained(TINY)
    engine = HFEngine(model, tokenizer, _config(tokenizer, **extra))
    torch.manual_seed(3)
    rollout = engine.generate(PROMPTS, PARAMS)
    after = torch.get_rng_state()
    rows = [p for p in PROMPTS for _ in range(PARAMS.num_generations)]
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in rows])
    torch.manual_seed(3)
    stock = model.generate(input_ids=ids, attention_mask=(ids != pad).long(), generation_config=_config(tokenizer, **extra),
                           return_dict_in_generate=True, output_scores=True)
    assert torch.equal(torch.get_rng_state(), after)  # the process's generator moved on exactly as stock's did
    scores = torch.stack(stock.scores, dim=1).log_softmax(-1)
    distinct = set()
    for row, (prompt, completion, logprobs) in enumerate(zip(rollout.prompt_ids, rollout.completion_ids, rollout.logprobs)):
        assert prompt == rows[row]
        tokens = stock.sequences[row, width:].tolist()
        end = next((i + 1 for i, t in enumerate(tokens) if t == tokenizer.eos_token_id), len(tokens))
        assert completion == tokens[:end]
        expected = scores[row, :end].gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(torch.tensor(logprobs), expected, rtol=1e-5, atol=1e-5)
        distinct.add(tuple(completion))
    assert len(distinct) > 1  # sampled, not greedy
    assert all(len(c) >= extra.get("min_new_tokens", 1) for c in rollout.completion_ids)


def test_an_own_seed_leaves_the_process_generator_alone():
    model, tokenizer = _model(), AutoTokenizer.from_pretrained(TINY)
    engine = HFEngine(model, tokenizer, _config(tokenizer))
    seeded = SamplingParams(num_generations=2, max_completion_length=6, seed=4)
    before = torch.get_rng_state()
    first, again = engine.generate(PROMPTS[:2], seeded), engine.generate(PROMPTS[:2], seeded)
    assert torch.equal(torch.get_rng_state(), before)
    assert first.completion_ids == again.completion_ids and first.logprobs == again.logprobs


def _two_ranks(rank, world, out):
    from halo_core.parallel.config import ParallelConfig
    from halo_core.parallel.layout_state import layout_of
    from halo_core.trainers.parts.layout import lay_out

    model = lay_out(_model(), ParallelConfig(ep=2))
    tokenizer = AutoTokenizer.from_pretrained(TINY)
    engine = HFEngine(model, tokenizer, _config(tokenizer), group=layout_of(model).group("dp"))
    torch.manual_seed(3)
    # Rank 1's prompts end sooner than rank 0's: it keeps stepping until rank 0 is done.
    mine = PROMPTS[:3] if rank == 0 else PROMPTS[3:]
    rollout = engine.generate(mine, PARAMS)
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"ids": rollout.completion_ids, "logprobs": rollout.logprobs}, f)


def test_two_expert_parallel_ranks_sample_the_one_process_rows(tmp_path):
    model, tokenizer = _model(), AutoTokenizer.from_pretrained(TINY)
    torch.manual_seed(3)
    whole = HFEngine(model, tokenizer, _config(tokenizer)).generate(PROMPTS, PARAMS)
    spawn(_two_ranks, 2, str(tmp_path))
    parts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert parts[0]["ids"] + parts[1]["ids"] == whole.completion_ids
    torch.testing.assert_close(torch.tensor([x for p in parts for row in p["logprobs"] for x in row]),
                               torch.tensor([x for row in whole.logprobs for x in row]), rtol=1e-5, atol=1e-5)

