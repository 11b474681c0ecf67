"""The in-process ``hf`` engine on the tiny MoE: a rollout per prompt x generation, log-probs of what was sampled
from the processed scores, the same completions from the same seed."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from halo_core.rl.engines import SamplingParams
from halo_core.rl.hf_engine import HFEngine
from launch_kit import TINY


def test_rollouts_are_reproducible_and_their_log_probs_are_the_samplers():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY), dtype=torch.float32)
    engine = HFEngine(model, AutoTokenizer.from_pretrained(TINY))
    prompts = [[5, 6, 7], [9, 10]]
    params = SamplingParams(num_generations=3, max_completion_length=6, temperature=0.7, top_p=0.9, seed=4)
    first, again = engine.generate(prompts, params), engine.generate(prompts, params)
    assert len(first.completion_ids) == 6 and first.prompt_ids[3] == [9, 10]
    assert first.completion_ids == again.completion_ids and first.logprobs == again.logprobs
    assert all(-1e9 < lp <= 0 for row in first.logprobs for lp in row)
    # Greedy, temperature 0: the log-probs are the plain softmax's at the argmax tokens.
    greedy = engine.generate(prompts[:1], SamplingParams(num_generations=1, max_completion_length=4, temperature=0.0))
    ids = torch.tensor([prompts[0] + greedy.completion_ids[0]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompts[0]) - 1 : -1].log_softmax(-1)
    expected = logits.gather(-1, torch.tensor(greedy.completion_ids[0]).unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(torch.tensor(greedy.logprobs[0]), expected, rtol=1e-5, atol=1e-5)
