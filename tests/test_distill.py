"""`halo launch distill`: the divergences against their formulas, one process against stock `GKDTrainer`, on-policy rows with a dense teacher under FSDP2 beside an EP
student, self-distillation, and the refusals before start (every declared split on two ranks against one process on
fixed data: tests/test_equivalence_matrix.py).

The teacher is the tiny MoE at another seed (or a tiny dense Qwen3 on the same tokenizer). float32, gloo, SGD: logged
losses within 1e-5, weights within 1e-4 relative.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from halo_core.methods.divergence import generalized_jsd
from halo_core.testing.compare import assert_close
from launch_kit import GLOBAL_BATCH, OPTIMIZERS, STEPS, TINY, assert_planned, launch, logged, saved_tiny_model, uneven_rows, weights, write_run

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _save(model, folder: Path) -> Path:
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(TINY / name, folder)
    return folder


@pytest.fixture(scope="module")
def teachers(tmp_path_factory) -> dict[str, Path]:
    """``moe``: the tiny MoE at seed 1; ``dense``: a tiny dense Qwen3 with the same vocabulary."""
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config

    root = tmp_path_factory.mktemp("teachers")
    moe = saved_tiny_model(root / "moe", seed=1)  # the teacher of the matrix's distill runs (launch_kit.MATRIX)
    config = Qwen3Config(vocab_size=320, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=12, max_position_embeddings=128, pad_token_id=0, eos_token_id=3)
    torch.manual_seed(2)
    dense = _save(AutoModelForCausalLM.from_config(config), root / "dense")
    return {"moe": moe, "dense": dense}


@pytest.fixture(scope="module")
def single(method_runs) -> Path:
    """One process over the MoE teacher (fixed data): the run the equivalence matrix compares every split against
    (tests/test_equivalence_matrix.py)."""
    return method_runs.single("distill")


# -- the divergences ----------------------------------------------------------------------------------------------

def _direct(student: torch.Tensor, teacher: torch.Tensor, beta: float, temperature: float) -> torch.Tensor:
    """The generalised JSD written out in probabilities, in float64."""
    p = torch.softmax(teacher.double() / temperature, -1)
    q = torch.softmax(student.double() / temperature, -1)
    kl = lambda a, b: (a * (a.log() - b.log())).sum(-1)  # noqa: E731
    if beta == 0:
        return kl(p, q)
    if beta == 1:
        return kl(q, p)
    m = beta * p + (1 - beta) * q
    return beta * kl(p, m) + (1 - beta) * kl(q, m)


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_each_divergence_is_its_formula_and_gkds(beta, temperature):
    from trl.experimental.gkd import GKDTrainer

    torch.manual_seed(0)
    student, teacher = torch.randn(3, 5, 11) * 3, torch.randn(3, 5, 11) * 3
    got = generalized_jsd(student, teacher, beta, temperature)
    assert got.shape == (3, 5)
    assert torch.allclose(got.double(), _direct(student, teacher, beta, temperature), atol=1e-5, rtol=1e-5)
    # GKD's own loss (token mean over the batch) on the same logits
    stock = GKDTrainer.generalized_jsd_loss(student, teacher, labels=torch.zeros(3, 5, dtype=torch.long), beta=beta, temperature=temperature)
    assert float(got.sum() / 15) == pytest.approx(float(stock), abs=1e-6)


def test_forward_and_reverse_kl_are_not_symmetric():
    """beta=0 and beta=1 are different divergences on the same logits (the key is wired, not ignored)."""
    torch.manual_seed(3)
    student, teacher = torch.randn(4, 9) * 2, torch.randn(4, 9) * 2
    forward, reverse = generalized_jsd(student, teacher, 0.0), generalized_jsd(student, teacher, 1.0)
    assert not torch.allclose(forward, reverse, atol=1e-3)
    assert torch.all(generalized_jsd(student, student, 0.5) < 1e-6)


def test_rows_are_right_padded_and_labelled_on_their_completions_only():
    """Conversational and plain-text rows through distill's collator: real tokens first (right padding), labels on the
    completion tokens alone, the prompts left-padded for generation."""
    from transformers import AutoTokenizer
    from trl.experimental.utils import DataCollatorForChatML

    from halo_core.methods.distill import RightPadded

    tokenizer = AutoTokenizer.from_pretrained(TINY)
    rows = [{"prompt": [{"role": "user", "content": "1 2 3 4 5 6 7"}], "completion": [{"role": "assistant", "content": "8"}]},
            {"prompt": "9 +", "completion": " 10 11"}]
    batch = RightPadded(DataCollatorForChatML(tokenizer=tokenizer, max_length=128))(rows)
    mask, ids, labels = batch["attention_mask"], batch["input_ids"], batch["labels"]
    lengths = mask.sum(1)
    assert lengths[0] != lengths[1]
    for row, n in enumerate(lengths.tolist()):
        assert mask[row, :n].all() and not mask[row, n:].any()  # right-padded
        assert (ids[row, n:] == tokenizer.pad_token_id).all() and (labels[row, n:] == -100).all()
    assert 0 < int((labels[0] != -100).sum()) < int(lengths[0]) - len(tokenizer("1 2 3 4 5 6 7", add_special_tokens=False)["input_ids"])
    text_ids = tokenizer("9 +", add_special_tokens=False)["input_ids"]
    completion = tokenizer(" 10 11", add_special_tokens=False)["input_ids"]
    n = int(lengths[1])
    assert ids[1, :n].tolist() == text_ids + completion
    assert labels[1, :n].tolist() == [-100] * len(text_ids) + completion
    assert (batch["prompt_attention_mask"][:, -1] == 1).all()  # prompts stay left-padded
    assert batch["prompts"][1][batch["prompt_attention_mask"][1].bool()].tolist() == text_ids


# -- one process against stock GKDTrainer --------------------------------------------------------------------------

def _stock(teacher: Path, output_dir: Path) -> tuple[list[dict], dict[str, torch.Tensor]]:
    import datasets
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    from halo_core.parallel.loading import model_class_for

    config = AutoConfig.from_pretrained(TINY)
    torch.manual_seed(5)
    model = model_class_for(config).from_config(config, dtype=torch.float32)
    args = GKDConfig(output_dir=str(output_dir), use_cpu=True, per_device_train_batch_size=GLOBAL_BATCH, max_steps=STEPS, lmbda=0.0,
                     lr_scheduler_type="constant", warmup_steps=0, logging_steps=1, save_strategy="no", seed=5, max_grad_norm=1.0,
                     bf16=False, report_to="none", optim="sgd", learning_rate=0.5)
    rows = [{"messages": r["prompt"] + r["completion"]} for r in uneven_rows("completion")]
    trainer = GKDTrainer(model=model, teacher_model=AutoModelForCausalLM.from_pretrained(teacher, dtype=torch.float32), args=args,
                         train_dataset=datasets.Dataset.from_list(rows), processing_class=AutoTokenizer.from_pretrained(TINY))
    trainer.train()
    return [e for e in trainer.state.log_history if "loss" in e], {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_one_process_is_stock_gkd(single, teachers, tmp_path):
    """Same student, teacher, data and seed (lmbda 0: the fixed rows): Halo's losses and weights are stock GKDTrainer's.
    Halo right-pads the rows GKD left-pads; positions differ by each row's padding, which RoPE turns into rounding."""
    stock_logs, stock_weights = _stock(teachers["moe"], tmp_path / "stock")
    assert logged(single, "loss") == pytest.approx([e["loss"] for e in stock_logs], abs=1e-5, rel=0)
    assert min(logged(single, "loss")) > 1e-3  # a teacher at another seed: the divergence is live
    for key, tensor in weights(single).items():
        assert_close(tensor, stock_weights[key], f"{key} after {STEPS} SGD steps, Halo against stock GKDTrainer", rtol=1e-4)


def test_on_policy_rows_with_a_dense_teacher_beside_an_ep_student(teachers, tmp_path):
    """lmbda 1: every step trains on the student's own completions (the hf engine), scored by a dense teacher under
    FSDP2 while the student's experts are split over the two ranks; two ranks equal one process. With an MoE aux-loss
    coefficient, as the embedded default has, so generation runs with the router logits the trainer turned on."""
    config = write_run(tmp_path, "completion", f"teacher_model_name_or_path: {teachers['dense']}\nlmbda: 1.0\nmax_new_tokens: 6\n")
    aux = "--router_aux_loss_coef=0.01"  # the trainer then asks the model for router logits, which generation must not
    one = launch("distill", config, tmp_path / "one", 1, *OPTIMIZERS["sgd"], aux)
    two = launch("distill", config, tmp_path / "two", 2, *OPTIMIZERS["sgd"], aux, "--expert_parallel_size=2",
                 env={"HALO_TENSOR_BYTES": str(tmp_path / "tensor-bytes")})
    # halo plan counts the teacher as build_teacher lays it out (dense: no expert split, FSDP2 over both ranks)
    assert_planned("distill", config, two, 2, [*OPTIMIZERS["sgd"], aux, "--expert_parallel_size=2"])
    assert logged(two, "loss") == pytest.approx(logged(one, "loss"), abs=1e-5, rel=0)
    assert min(logged(one, "loss")) > 0
    expected = weights(one)
    for key, tensor in weights(two).items():
        assert_close(tensor, expected[key], f"{key} after {STEPS} SGD steps, on-policy at ep2 with a dense FSDP2 teacher", rtol=1e-4)


def test_self_distillation_is_against_the_starting_weights(tmp_path):
    """No teacher path: the teacher is the student's own starting weights (one frozen copy), so the divergence and its
    gradient are 0 and the student ends where it began (a teacher at another seed moves it: the layout tests)."""
    from transformers import AutoConfig

    from halo_core.parallel.loading import model_class_for

    config = write_run(tmp_path, "completion", "lmbda: 0.0\n")
    out = launch("distill", config, tmp_path / "run", 1, *OPTIMIZERS["sgd"])
    assert logged(out, "loss") == [0.0] * STEPS
    torch.manual_seed(5)  # launch_kit's seed: the random init every run starts from
    start = model_class_for(AutoConfig.from_pretrained(TINY)).from_config(AutoConfig.from_pretrained(TINY), dtype=torch.float32).state_dict()
    for key, tensor in weights(out).items():
        assert torch.equal(tensor, start[key]), key


# -- refusals before start -----------------------------------------------------------------------------------------

def _check(tmp_path, teacher: Path | None, *overrides: str, kind: str = "completion"):
    from halo_core.trainers.run_checks import check_run
    from halo_core.trainers.run_config import load_run_config, parse_overrides
    from halo_core.methods.distill import HaloDistillConfig

    extra = f"teacher_model_name_or_path: {teacher}\n" if teacher else ""
    config = write_run(tmp_path, kind, extra)
    check_run(load_run_config("distill", HaloDistillConfig, config, parse_overrides(list(overrides))), 2)


def test_a_teacher_with_another_vocabulary_is_refused(tmp_path, teachers):
    from transformers import AutoConfig

    from halo_core.errors import ConfigError

    folder = tmp_path / "wide"
    shutil.copytree(teachers["moe"], folder)
    config = AutoConfig.from_pretrained(folder)
    config.vocab_size = 321
    config.save_pretrained(folder)
    with pytest.raises(ConfigError, match=re.escape("has vocab_size 321 but the student has 320")):
        _check(tmp_path, folder)


def test_a_teacher_with_another_tokenizer_is_refused(tmp_path, teachers):
    from transformers import AutoTokenizer

    from halo_core.errors import ConfigError

    folder = tmp_path / "other"
    shutil.copytree(teachers["moe"], folder)
    tokenizer = AutoTokenizer.from_pretrained(TINY)
    tokenizer.add_tokens(["<teacher-only>"])
    tokenizer.save_pretrained(folder)
    with pytest.raises(ConfigError, match="has another tokenizer than the student"):
        _check(tmp_path, folder)


@pytest.mark.parametrize("overrides, says", [
    (["--lmbda=0.5", "--tensor_parallel_size=2"], "generates on-policy rows"),
    (["--loss_temperature=0"], "loss_temperature: 0 must be above 0"),
    (["--lmbda=0.5", "--temperature=0"], "temperature: 0 must be above 0 to sample on-policy rows"),
    (["--lmbda=0", "--teacher_expert_parallel_size=2"], "the teacher"),
])
def test_bad_keys_are_refused_before_start(tmp_path, teachers, overrides, says):
    from halo_core.errors import ConfigError

    teacher = teachers["dense"] if "--teacher_expert_parallel_size=2" in overrides else teachers["moe"]
    with pytest.raises(ConfigError, match=re.escape(says)):
        _check(tmp_path, teacher, *overrides)


def test_rows_without_messages_or_completions_are_refused(tmp_path):
    from halo_core.errors import ConfigError

    with pytest.raises(ConfigError, match="lacks 'messages' or 'completion'"):
        _check(tmp_path, None, kind="prompts")
