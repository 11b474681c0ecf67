"""The built-in rewards on hand-made completions, and a reward function's failure named."""

from __future__ import annotations

import pytest

from halo_core.rl.rewards import RewardError, brevity, checked, code_tests, exact_answer, number_format


def test_exact_answer_reads_the_last_number_of_text_or_conversational_completions():
    completions = ["12 + 30 = 42", [{"role": "assistant", "content": "It is 41"}], "no number", "42, I think 43"]
    assert exact_answer(None, completions, answer=[42, 42, 42, 42]) == [1.0, 0.0, 0.0, 0.0]


def test_exact_answer_reads_gsm8k_answers_final_number():
    """GSM8K's ``answer`` is a worked solution ending ``#### N`` (the grpo recipe's data): the reward compares the
    completion's last number with N, not with the numbers of the working, thousands separators dropped."""
    answer = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether.\n#### 72"
    completions = ["24 in May, so 48 + 24 = 72 clips.", "She sold 24.", "seventy-two", "#### 72"]
    assert exact_answer(None, completions, answer=[answer] * 4) == [1.0, 0.0, 0.0, 1.0]
    assert exact_answer(None, ["It costs $1,234.", "1234", "123"], answer=["... #### 1,234"] * 3) == [1.0, 1.0, 0.0]


def test_number_format_wants_one_number_alone():
    assert number_format(None, ["42", " -7 ", "42 apples", "4 2"]) == [1.0, 1.0, 0.0, 0.0]


def test_brevity_scores_two_tokens_whole_and_longer_completions_by_2_over_length():
    assert brevity(None, ["a", "b", "c", "d"], completion_ids=[[5], [5, 3], [5, 6, 7, 3], list(range(12))]) == [1.0, 1.0, 0.5, 2 / 12]


def test_code_tests_pass_fail_time_out_and_run_out_of_memory():
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    wrong = "def add(a, b):\n    return a - b"
    slow = "def add(a, b):\n    while True: pass"
    greedy = "x = bytearray(2 << 30)\ndef add(a, b):\n    return a + b"
    tests = ["assert add(2, 3) == 5"]
    assert code_tests(None, [good, wrong, slow, greedy], tests=[tests] * 4, timeout_s=2.0, memory_mb=256) == [1.0, 0.0, 0.0, 0.0]


def test_a_reward_that_raises_or_miscounts_is_named():
    def broken(prompts, completions, **kwargs):
        raise KeyError("answer")

    def short(prompts, completions, **kwargs):
        return [1.0]

    with pytest.raises(RewardError, match="reward function 'broken' raised KeyError"):
        checked("broken", broken)(None, ["a", "b"])
    with pytest.raises(RewardError, match="reward function 'short' returned 1 rewards for 2 completions"):
        checked("short", short)(None, ["a", "b"])
