"""`halo launch grpo` with the in-process `hf` engine: one process equals stock `trl.GRPOTrainer` (completions,
rewards, losses, post-SGD weights), two expert-parallel ranks equal one process, routing replay holds the
recorded experts through the batch, and the refusals come before start, naming the field."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from halo_core.testing.compare import assert_close
from launch_kit import COMMON, GLOBAL_BATCH, OPTIMIZERS, STEPS, TINY, TWO_RANKS, launch, logged, weights, write_run

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

TESTS = Path(__file__).resolve().parent
GRPO = ["--num_generations=2", "--max_completion_length=12", "--temperature=1.0"]
KEYS = ("loss", "reward", "rewards/grpo_rewards.token_sum/mean", "completions/mean_length", "entropy")


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("grpo"), "prompts", "reward_funcs: [grpo_rewards.token_sum]\n")


def _launch(run_file, out, nproc, *args, pools: int | None = None):
    """``pools``: ranks holding different rows (a TP group's ranks all score one pooled batch); default every rank."""
    record = out.parent / f"{out.name}.completions"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", str(TESTS))
        patch.setenv("HALO_TEST_RECORD", str(record))
        launch("grpo", run_file, out, nproc, *OPTIMIZERS["sgd"], *GRPO, *args)
    return out, _completions(record, pools or nproc)


def _completions(record: Path, ranks: int) -> list[list]:
    """Per step, every rank's (prompt, completion ids) pairs in rank order."""
    per_rank = [[json.loads(line) for line in Path(f"{record}.{r}").read_text().splitlines()] for r in range(ranks)]
    return [[pair for call in step for pair in zip(map(json.dumps, call["prompts"]), call["completions"])] for step in zip(*per_rank)]


#: More ids that end a completion (TRL's generation_kwargs): a random-init model then stops at uneven lengths.
UNEVEN = "--generation_kwargs={eos_token_id: [3, " + ", ".join(str(i) for i in range(20, 41)) + "]}"
_SINGLE: dict = {}


def _single(run_file, *args: str):
    if args not in _SINGLE:
        _SINGLE[args] = _launch(run_file, run_file.parent / f"single-{len(_SINGLE)}", 1, *args)
    return _SINGLE[args]


@pytest.fixture(scope="module")
def single(run_file):
    return _single(run_file)


@pytest.mark.parametrize("name, options", [("ep2", ["--loss_type=dapo"]), ("tp2", ["--loss_type=dapo"]),
                                           ("etp2", ["--loss_type=bnpo", "--beta=0.1"])])
def test_two_ranks_equal_one_process(run_file, tmp_path, name, options):
    """The method's splits on two ranks (expert, tensor, expert-tensor parallelism); TRL's default loss, and bnpo,
    whose token mean Halo takes over the whole batch, with a KL penalty to Halo's laid-out reference. Under TP both ranks train on their pooled rows: the record
    holds each rank's copy of the pool, in which rank 0's rows come first."""
    out, completions = _launch(run_file, tmp_path / name, 2, *TWO_RANKS[name][1], *options, UNEVEN, pools=1 if name == "tp2" else 2)
    base, expected = _single(run_file, *options, UNEVEN)
    assert len(expected) == STEPS and completions == expected
    lengths = [len(ids) for step in expected for _, ids in step]
    assert min(lengths) < max(lengths) == 12, lengths  # uneven completions, some cut at max_completion_length
    for key in KEYS + (("kl",) if "--beta=0.1" in options else ()):
        assert logged(out, key) == pytest.approx(logged(base, key), abs=1e-5, rel=1e-6), key
    if "--beta=0.1" in options:
        assert logged(base, "kl")[0] == 0 and logged(base, "kl")[-1] > 0  # the reference stays where the policy began
    assert any(abs(x) > 1e-4 for x in logged(base, "loss"))
    reference = weights(base)
    for key, tensor in weights(out).items():
        assert_close(tensor, reference[key], f"{key} after {STEPS} SGD steps at {name}", rtol=1e-4)


def test_one_process_equals_stock_grpo_trainer(single, run_file, tmp_path, monkeypatch):
    """Stock TRL on one process over the model Halo's random_init builds (seeded, then from_config)."""
    import datasets
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, str(TESTS))
    import grpo_rewards

    record = tmp_path / "stock.completions"
    monkeypatch.setenv("HALO_TEST_RECORD", str(record))
    args = GRPOConfig(output_dir=str(tmp_path / "stock"), per_device_train_batch_size=GLOBAL_BATCH, max_steps=STEPS, lr_scheduler_type="constant",
                      warmup_steps=0, logging_steps=1, save_strategy="no", seed=5, max_grad_norm=1.0, bf16=False, report_to="none",
                      optim="sgd", learning_rate=0.5, use_cpu=True, num_generations=2, max_completion_length=12, temperature=1.0,
                      router_aux_loss_coef=0.0)
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY), dtype=torch.float32)
    data = datasets.load_dataset("json", data_files=str(run_file.parent / "prompts.jsonl"), split="train")
    trainer = GRPOTrainer(model=model, reward_funcs=[grpo_rewards.token_sum], args=args, train_dataset=data,
                          processing_class=AutoTokenizer.from_pretrained(TINY))
    trainer.train()
    base, halo = single
    assert _completions(record, 1) == halo
    stock = [e for e in trainer.state.log_history if "loss" in e]
    for key in ("loss", "reward", "completions/mean_length", "entropy"):
        assert logged(base, key) == pytest.approx([e[key] for e in stock], abs=1e-5, rel=1e-6), key
    saved = weights(base)
    for key, tensor in model.state_dict().items():
        assert_close(saved[key], tensor, f"{key} after {STEPS} SGD steps, Halo against stock", rtol=1e-4)


@pytest.mark.parametrize("iterations, correction", [(2, True), (1, False)], ids=["moved", "own-old-pass"])
def test_replay_holds_the_recorded_experts_while_the_policy_moves(run_file, tmp_path, iterations, correction):
    """Two updates per generation batch (num_iterations=2): the second runs on moved weights, where the live routers
    choose other experts for some tokens; the experts the loss pass hands on are the recorded ones throughout.
    With one update per batch and no IS correction TRL takes no old log-probs, and Halo records the routes itself."""
    import datasets
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from halo_core.methods.grpo import HaloGRPOConfig, HaloGRPOTrainer
    from halo_core.rl.routing import route_rows

    sys.path.insert(0, str(TESTS))
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY), dtype=torch.float32)
    # epsilon=100: the moved routers put the ratio far from 1, where clipping would zero the gradient this checks.
    args = HaloGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=4, logging_steps=1, save_strategy="no",
                          seed=5, bf16=False, report_to="none", optim="sgd", learning_rate=0.5, use_cpu=True, num_generations=2,
                          max_completion_length=12, num_iterations=iterations, epsilon=100.0, reward_funcs=["grpo_rewards.token_sum"], router_aux_loss_coef=0.0,
                          vllm_importance_sampling_correction=correction)
    data = datasets.load_dataset("json", data_files=str(run_file.parent / "prompts.jsonl"), split="train")
    trainer = HaloGRPOTrainer(model=model, args=args, train_dataset=data, processing_class=AutoTokenizer.from_pretrained(TINY))
    experts = [m for n, m in trainer.model.named_modules() if n.endswith("mlp.experts")]
    handed, changed = [], []
    hooks = [m.register_forward_pre_hook(lambda mod, a: handed.append(a[1].clone()) if torch.is_grad_enabled() else None) for m in experts]
    original = HaloGRPOTrainer._compute_loss

    seen, grads, signal, trl_old_pass = set(), [], [], []
    for router in trainer._halo_replay.routers.values():
        router.weight.register_hook(lambda g: grads.append(float(g.abs().sum())))

    def spy(self, model, inputs):
        routes = inputs["halo_routes_0"]  # [rows, tokens, layers, k], recorded in the old-policy pass
        if id(routes) in seen:  # the batch's second update: move the routers as a far step would
            with torch.no_grad():
                for router in self._halo_replay.routers.values():
                    router.weight.add_(torch.randn_like(router.weight))
        seen.add(id(routes))
        signal.append(bool(inputs["advantages"].abs().sum() > 0))
        trl_old_pass.append("old_per_token_logps" in inputs)
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        with torch.no_grad(), self._halo_replay.record() as now:  # what the live routers choose on these weights
            self.model(input_ids=ids, attention_mask=mask)
        differs = (route_rows(now, ids.shape[0])[0] != routes).any(-1).any(-1) & mask.bool()
        changed.append(bool(differs.any()))
        handed.clear()
        loss = original(self, model, inputs)
        assert len(handed) == len(experts)
        for layer, index in enumerate(handed):
            assert torch.equal(index.reshape(routes.shape[0], routes.shape[1], -1), routes[:, :, layer]), f"layer {layer}: not the recorded experts"
        return loss

    trainer._compute_loss = spy.__get__(trainer)
    trainer.train()
    for hook in hooks:
        hook.remove()
    moved = [False, True, False, True] if iterations == 2 else [False] * 4
    assert trl_old_pass == [iterations == 2] * 4  # without one, the recorded routes are Halo's own pass's
    assert changed == moved, "live routing must differ from the recorded on moved weights only"
    assert len(grads) == 4 * len(experts) and any(signal[i] for i, m in enumerate(moved) if m or iterations == 1)
    for step, has_signal in enumerate(signal):  # replayed routers still get gradients (live gate weights)
        assert all(g > 0 for g in grads[step * len(experts) : (step + 1) * len(experts)]) == has_signal, step


def _check(tmp_path, *overrides, extra="reward_funcs: [exact_answer]\n", world=2):
    """What `halo launch grpo RUN --nproc 2` checks before any process starts, in process."""
    from halo_core.methods.grpo import HaloGRPOConfig
    from halo_core.trainers.run_checks import check_run
    from halo_core.trainers.run_config import check_layout, load_run_config, parse_overrides

    run = load_run_config("grpo", HaloGRPOConfig, write_run(tmp_path, "prompts", extra), parse_overrides(list(overrides)))
    check_run(run, world)
    check_layout(run, world)


@pytest.mark.parametrize("overrides, extra, says", [
    (["--context_parallel_size=2"], None, "method 'grpo' cannot train with cp=2"),
    ([], "", "reward_funcs is empty"),
    ([], "reward_funcs: [no_such_reward]\n", "reward_funcs: 'no_such_reward' is unknown"),
    (["--rollout_engine=nope"], None, "rollout_engine 'nope' is unknown"),
    (["--num_generations=4", "--per_device_train_batch_size=1"], None, "generation_batch_size (2) must be divisible by num_generations (4)"),
    (["--beta=-0.1"], None, "beta=-0.1 must be 0 or above"),
    (["--compile_layers=true"], None, "compile_layers: true with routing_replay: true is not supported yet"),
])
def test_a_bad_run_is_refused_before_start_with_its_field(tmp_path, overrides, extra, says):
    from halo_core.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        _check(tmp_path, *overrides, **({} if extra is None else {"extra": extra}))
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_routing_replay_written_on_is_refused_for_a_family_that_cannot_replay(tmp_path):
    """PhiMoE's routers sample experts without torch.topk (its family declares routing_replay=False): replay written
    on is refused before start; left at its default it is off for that family, and the run is accepted."""
    from halo_core.errors import ConfigError
    from halo_core.tiny import tiny_config

    phimoe = tmp_path / "phimoe"
    tiny_config("phimoe").save_pretrained(phimoe)
    _check(tmp_path, f"--model_name_or_path={phimoe}", world=1)
    with pytest.raises(ConfigError, match="routing_replay: true, but family 'phimoe' declares routing_replay=False"):
        _check(tmp_path, f"--model_name_or_path={phimoe}", "--routing_replay=true", world=1)


def test_image_prompts_are_refused_before_start(tmp_path):
    from halo_core.errors import ConfigError

    (tmp_path / "images.jsonl").write_text(json.dumps({"prompt": [{"role": "user", "content": "What is this?"}], "images": ["a.png"]}) + "\n")
    config = tmp_path / "run.yaml"
    config.write_text(f"model_name_or_path: {TINY}\nrandom_init: true\ndataset:\n  - path: images.jsonl\nreward_funcs: [exact_answer]\n")
    from halo_core.methods.grpo import HaloGRPOConfig
    from halo_core.trainers.run_checks import check_run
    from halo_core.trainers.run_config import load_run_config, parse_overrides

    with pytest.raises(ConfigError, match="row 1 has images; Halo's grpo generates from text prompts only"):
        check_run(load_run_config("grpo", HaloGRPOConfig, config, parse_overrides([])), 1)


def test_a_group_spanning_ranks_is_accepted_at_the_launchs_world_size(tmp_path):
    """Two ranks of two rows hold one group of four: refused at one process, a valid run at two."""
    _check(tmp_path, "--num_generations=4", "--per_device_train_batch_size=2")


def test_the_cli_refuses_with_one_line_and_exit_2(tmp_path):
    config = write_run(tmp_path, "prompts", "reward_funcs: [no_such_reward]\n")
    done = subprocess.run([sys.executable, "-m", "halo_cli", "launch", "grpo", str(config), "--nproc", "2", "--dry-run"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and "reward_funcs: 'no_such_reward' is unknown" in done.stderr and "Traceback" not in done.stderr


def test_a_failing_reward_is_reported_with_its_name(run_file, tmp_path):
    config = write_run(tmp_path, "prompts", "reward_funcs: [grpo_rewards.broken]\n")
    command = [sys.executable, "-m", "halo_cli", "launch", "grpo", str(config), "--", f"--output_dir={tmp_path / 'out'}", *COMMON, *GRPO,
               "--per_device_train_batch_size=2"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(TESTS)})
    assert done.returncode != 0
    assert re.search(r"reward function 'grpo_rewards.broken' raised ZeroDivisionError: no reward today", done.stdout + done.stderr)


def test_the_loop_raises_a_learnable_reward(run_file, tmp_path):
    """A reward a random-init model can learn in steps (the share of even token ids): its mean rises, so the
    loop's sign and plumbing (engine, rewards, advantages, loss, replay) point the policy up the reward."""
    import datasets
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from halo_core.methods.grpo import HaloGRPOConfig, HaloGRPOTrainer

    sys.path.insert(0, str(TESTS))
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY), dtype=torch.float32)
    args = HaloGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=16, max_steps=20, logging_steps=5, save_strategy="no",
                          bf16=False, report_to="none", use_cpu=True, num_generations=8, max_completion_length=8, learning_rate=3e-3,
                          reward_funcs=["grpo_rewards.even_tokens"], seed=5)
    data = datasets.load_dataset("json", data_files=str(run_file.parent / "prompts.jsonl"), split="train")
    trainer = HaloGRPOTrainer(model=model, args=args, train_dataset=data, processing_class=AutoTokenizer.from_pretrained(TINY))
    trainer.train()
    rewards = [e["reward"] for e in trainer.state.log_history if "reward" in e]
    assert len(rewards) == 4 and rewards == sorted(rewards) and rewards[-1] > rewards[0] + 0.04, rewards
