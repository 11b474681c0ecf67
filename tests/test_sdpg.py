"""`halo launch sdpg`: beta(k) and the per-token terms equal their formulas on hand-built inputs; on one process the
trainer's loss is GRPO's plus beta(k) times a direct implementation of the distillation term (teacher prompt, gate,
normaliser); expert and tensor parallelism on two ranks equal one process; refusals come before start."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pytest
import torch

from halo_core.methods.sdpg import beta_at, distillation_terms, with_context
from halo_core.testing.compare import assert_close
from launch_kit import OPTIMIZERS, STEPS, TINY, TWO_RANKS, launch, weights, write_run

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

TESTS = Path(__file__).resolve().parent
#: A large beta(k) (40, then 25) so the term, small between two views of a random-init model, moves the weights.
SDPG = ["--num_generations=4", "--max_completion_length=10", "--temperature=1.0", "--sdpg_warmup_steps=1", "--sdpg_beta=40",
        "--sdpg_decay=linear", "--sdpg_beta_final=10"]
UNEVEN = "--generation_kwargs={eos_token_id: [3, " + ", ".join(str(i) for i in range(20, 41)) + "]}"


def _rows(count: int = 48, seed: int = 3) -> list[dict]:
    """Prompts of 1 to 30 numbers and the gold answer the teacher view is shown."""
    draw = random.Random(seed)
    rows = []
    for _ in range(count):
        numbers = [draw.randrange(100) for _ in range(draw.randrange(1, 31))]
        rows.append({"prompt": [{"role": "user", "content": "Add " + " ".join(map(str, numbers))}], "answer": sum(numbers)})
    return rows


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sdpg")
    path = write_run(folder, "prompts", "reward_funcs: [grpo_rewards.token_sum]\n")
    (folder / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    return path


def test_beta_rises_then_decays():
    assert [beta_at(k, 10, 2.0, 4, "constant", 0.0) for k in (0, 1, 4, 9)] == [0.0, 0.5, 2.0, 2.0]
    assert [beta_at(k, 10, 2.0, 0.2, "linear", 0.5) for k in (0, 1, 2, 6, 10)] == pytest.approx([0.0, 1.0, 2.0, 1.25, 0.5])
    cosine = [beta_at(k, 12, 1.0, 2, "cosine", 0.0) for k in (2, 7, 12)]
    assert cosine == pytest.approx([1.0, 0.5, 0.0])
    assert beta_at(0, 5, 1.5, 0, "linear", 1.5) == 1.5


@pytest.mark.parametrize("divergence", ["reverse", "forward", "unnormalized"])
def test_each_term_equals_its_formula(divergence):
    """Against sums over the vocabulary written out in float64, on hand-built logits."""
    torch.manual_seed(0)
    student, teacher = torch.randn(3, 4, 7) * 2, torch.randn(3, 4, 7) * 2
    drawn = torch.randint(0, 7, (3, 4))
    got = distillation_terms(student, teacher, drawn, divergence)
    p, q = student.double().softmax(-1), teacher.double().softmax(-1)
    for r in range(3):
        for t in range(4):
            if divergence == "reverse":
                want = sum(p[r, t, v] * math.log(p[r, t, v] / q[r, t, v]) for v in range(7))
            elif divergence == "forward":
                want = sum(q[r, t, v] * math.log(q[r, t, v] / p[r, t, v]) for v in range(7))
            else:
                ratio = q[r, t, drawn[r, t]] / p[r, t, drawn[r, t]]
                want = ratio - 1 - math.log(ratio)
            assert float(got[r, t]) == pytest.approx(float(want), rel=1e-5, abs=1e-7)
    leaf = student.clone().requires_grad_()
    distillation_terms(leaf, teacher.clone().requires_grad_(), drawn, divergence).sum().backward()
    assert leaf.grad.abs().sum() > 0  # the student side carries the gradient (the teacher's is detached in the term)


def test_the_context_joins_the_last_user_turn():
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert with_context(chat, "C")[1]["content"] == "q\n\nC" and chat[1]["content"] == "q"
    assert with_context("Add 1 2", "The correct answer is 3.") == "Add 1 2\n\nThe correct answer is 3."


def test_the_loss_is_grpo_plus_beta_times_the_term(run_file, tmp_path):
    """One process, in process: each step's loss against TRL's GRPO loss (fused head) plus beta(k) times the term
    computed here from the model's own forwards on the prompt with the context written out by hand."""
    import datasets
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from halo_core.methods.grpo import HaloGRPOTrainer
    from halo_core.methods.sdpg import HaloSDPGConfig, HaloSDPGTrainer

    sys.path.insert(0, str(TESTS))
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(TINY)
    args = HaloSDPGConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=3, logging_steps=1, save_strategy="no",
                          seed=5, bf16=False, report_to="none", optim="sgd", learning_rate=0.5, use_cpu=True, num_generations=2,
                          max_completion_length=10, reward_funcs=["grpo_rewards.token_sum"], router_aux_loss_coef=0.0,
                          sdpg_warmup_steps=1, sdpg_beta=2.0, sdpg_beta_final=0.5, generation_kwargs={"eos_token_id": [3, *range(20, 41)]})
    rows = [json.loads(line) for line in (run_file.parent / "prompts.jsonl").read_text().splitlines()]
    data = datasets.load_dataset("json", data_files=str(run_file.parent / "prompts.jsonl"), split="train")
    trainer = HaloSDPGTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    original, checked = HaloSDPGTrainer._compute_loss, []

    def spy(self, model, inputs):
        step = self.state.global_step
        beta = [0.0, 2.0, 0.5 + 1.5 * 0.5][step]
        with torch.no_grad():
            ids, completion, mask = inputs["prompt_ids"], inputs["completion_ids"], inputs["completion_mask"]
            total = 0.0
            for r in range(ids.shape[0]):
                prompt = [t for t, m in zip(ids[r].tolist(), inputs["prompt_mask"][r].tolist()) if m]
                row = next(x for x in rows if tokenizer.apply_chat_template(x["prompt"], add_generation_prompt=True, tokenize=True,
                                                                           return_dict=True)["input_ids"] == prompt)
                hinted = [{"role": "user", "content": row["prompt"][0]["content"] + f"\n\nThe correct answer is {row['answer']}."}]
                teacher_prompt = tokenizer.apply_chat_template(hinted, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
                kept = completion[r][mask[r].bool()].tolist()
                if not kept or inputs["advantages"][r] <= 0:
                    continue
                s = model(input_ids=torch.tensor([prompt + kept])).logits[0, len(prompt) - 1 : -1].double().log_softmax(-1)
                t = model(input_ids=torch.tensor([teacher_prompt + kept])).logits[0, len(teacher_prompt) - 1 : -1].double().log_softmax(-1)
                total += float((s.exp() * (s - t)).sum())
            grpo = HaloGRPOTrainer._compute_loss(self, model, inputs)  # leaves the routes replaying, as the loss pass does
            self._halo_replay_on.close()
            expected = float(grpo) + beta * total / float(inputs["num_items_in_batch"])
        loss = original(self, model, inputs)
        assert float(loss) == pytest.approx(expected, rel=1e-5, abs=1e-6), step
        checked.append((step, total > 0))
        return loss

    trainer._compute_loss = spy.__get__(trainer)
    trainer.train()
    assert [s for s, _ in checked] == [0, 1, 2] and any(positive for _, positive in checked[1:])


def _launch(run_file, out, nproc, *args):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", str(TESTS))
        launch("sdpg", run_file, out, nproc, *OPTIMIZERS["sgd"], *SDPG, UNEVEN, *args)
    return out


@pytest.fixture(scope="module")
def single(run_file, tmp_path_factory):
    return _launch(run_file, tmp_path_factory.mktemp("sdpg-single") / "out", 1)


@pytest.mark.parametrize("name", ["ep2", "tp2", "etp2"])
def test_two_ranks_equal_one_process(single, run_file, tmp_path, name):
    """The TP group pools its prompts: the teacher prompts are built from the pool, in its order."""
    out = _launch(run_file, tmp_path / name, 2, *TWO_RANKS[name][1])
    for key in ("loss", "reward", "sdpg/beta", "sdpg/divergence", "sdpg/distilled_fraction"):
        assert _logged(out, key) == pytest.approx(_logged(single, key), abs=1e-5, rel=1e-6), key
    assert _logged(single, "sdpg/beta") == pytest.approx([40.0, 25.0])  # step 0 weighs 0: no term, nothing logged
    assert all(d > 0 for d in _logged(single, "sdpg/divergence")) and 0 < min(_logged(single, "sdpg/distilled_fraction")) < 1
    reference = weights(single)
    for key, tensor in weights(out).items():
        assert_close(tensor, reference[key], f"{key} after {STEPS} SGD steps at {name}", rtol=1e-4)


def _logged(out: Path, key: str) -> list[float]:
    """``key`` from the steps that log it (the term's metrics: the steps whose beta(k) is above 0)."""
    state = json.loads((out / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    return [entry[key] for entry in state["log_history"] if key in entry and "train_runtime" not in entry]


def _check(tmp_path, *overrides, extra="reward_funcs: [exact_answer]\n", world=2):
    from halo_core.methods.sdpg import HaloSDPGConfig
    from halo_core.trainers.run_checks import check_run
    from halo_core.trainers.run_config import check_layout, load_run_config, parse_overrides

    path = write_run(tmp_path, "prompts", extra)
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(8)))
    run = load_run_config("sdpg", HaloSDPGConfig, path, parse_overrides(list(overrides)))
    check_run(run, world)
    check_layout(run, world)


@pytest.mark.parametrize("overrides, says", [
    (["--sdpg_context=The answer is {solution}."], "sdpg_context 'The answer is {solution}.' reads column 'solution', which dataset"),
    (["--sdpg_divergence=jsd"], "sdpg_divergence: 'jsd' is not one of reverse, forward, unnormalized"),
    (["--sdpg_decay=step"], "sdpg_decay: 'step' is not one of constant, linear, cosine"),
    (["--sdpg_beta=-1"], "sdpg_beta: -1 must be 0 or above"),
    (["--tools=[calculator]"], "tools or an environment with method 'sdpg' are not supported yet"),
    (["--context_parallel_size=2"], "method 'sdpg' cannot train with cp=2"),
])
def test_a_bad_run_is_refused_before_start_with_its_field(tmp_path, overrides, says):
    from halo_core.errors import ConfigError

    with pytest.raises(ConfigError, match=re_escape(says)):
        _check(tmp_path, *overrides)


def re_escape(text: str) -> str:
    import re

    return re.escape(text)
