"""`halo launch sft` end to end on the CPU: layouts give the same training as one process and as stock TRL."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from halo_core.testing.compare import assert_close

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "templates" / "configs" / "tiny-qwen3-moe.yaml"
# Float32 and no aux loss (it is computed per rank's batch, as under DDP). SGD rather than AdamW: Adam's first
# steps turn rounding-level gradient differences on an almost unused expert into learning-rate-sized updates
# (m / sqrt(v) ~ sign(g)), which would test float noise, not the layout.
COMMON = ["--max_steps=4", "--optim=sgd", "--learning_rate=0.5", "--lr_scheduler_type=constant", "--warmup_steps=0", "--logging_steps=1",
          "--save_strategy=no", "--router_aux_loss_coef=0.0", "--seed=3", "--max_grad_norm=1.0"]


def launch(output_dir, *args, nproc=1):
    command = [sys.executable, "-m", "halo_cli", "launch", "sft", str(TINY), "--nproc", str(nproc), "--", f"--output_dir={output_dir}", *args]
    result = subprocess.run(command, capture_output=True, text=True, cwd=output_dir.parent, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def losses(output_dir):
    """Per-step losses from the last checkpoint's or the run's trainer state (transformers rounds them to 4 digits)."""
    states = sorted(Path(output_dir).glob("checkpoint-*/trainer_state.json"))
    state = json.loads(states[-1].read_text()) if states else None
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry] if state else None


def weights(output_dir):
    """The saved model as transformers loads it (fused experts, original names)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(output_dir, dtype=torch.float32).state_dict()


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "run"
    launch(out, *COMMON, "--expert_parallel_size=1", "--per_device_train_batch_size=2", "--save_strategy=steps", "--save_steps=4")
    return out


def test_expert_parallel_run_with_replicated_parameters_matches_the_single_process_run(single_process, tmp_path):
    """``shard_parameters: false`` (gradients all-reduced, no FSDP2). Each split under FSDP2, on rows of uneven
    lengths and to 1e-5, is test_launch_layouts'."""
    out = tmp_path / "ep2"
    launch(out, *COMMON, "--expert_parallel_size=2", "--shard_parameters=false", "--per_device_train_batch_size=1", "--save_strategy=steps",
           "--save_steps=4", nproc=2)
    expected, actual = losses(single_process), losses(out)
    assert len(expected) == 4 and actual == pytest.approx(expected, abs=1e-4)  # 4-digit rounding in the logs
    reference = weights(single_process)
    for name, tensor in weights(out).items():
        assert_close(tensor, reference[name], f"{name} after 4 steps at ep=2")


@pytest.fixture(scope="module")
def single_process_packed(tmp_path_factory):
    out = tmp_path_factory.mktemp("single-packed") / "run"
    launch(out, *COMMON, "--packing=true", "--expert_parallel_size=1", "--per_device_train_batch_size=2", "--save_strategy=steps", "--save_steps=4")
    return out


@pytest.mark.parametrize("attention", ["ulysses", "ring"])
def test_packed_documents_under_context_parallelism_match_the_single_process_run(single_process_packed, tmp_path, attention):
    out = tmp_path / "run"
    launch(out, *COMMON, "--packing=true", "--expert_parallel_size=1", "--context_parallel_size=2", f"--context_parallel_attention={attention}",
           "--per_device_train_batch_size=1", "--save_strategy=steps", "--save_steps=4", nproc=2)
    assert losses(out) == pytest.approx(losses(single_process_packed), abs=1e-4)
    reference = weights(single_process_packed)
    for name, tensor in weights(out).items():
        assert_close(tensor, reference[name], f"{name} after 4 packed steps at cp=2 ({attention})")


def test_single_process_run_matches_stock_trl(single_process, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from halo_core.trainers.parts.data import load_sources
    from halo_core.trainers.run_config import load_run_config, parse_overrides

    run = load_run_config("sft", SFTConfig, TINY, parse_overrides([*COMMON, "--expert_parallel_size=1", "--per_device_train_batch_size=2", f"--output_dir={tmp_path}"]))
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(run.halo.model_name_or_path), dtype=torch.float32)
    trainer = SFTTrainer(
        model=model,
        args=SFTConfig(**{**run.trainer, "use_cpu": True}),
        train_dataset=load_sources(run.halo.dataset),
        eval_dataset=load_sources(run.halo.eval_dataset),  # the default evaluates (every 120 steps: not in these 4)
        processing_class=AutoTokenizer.from_pretrained(run.halo.model_name_or_path),
    )
    trainer.train()
    stock = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert stock == pytest.approx(losses(single_process), abs=1e-4)
    reference = weights(single_process)
    for name, tensor in model.state_dict().items():
        assert_close(tensor, reference[name], f"{name}: stock TRL vs halo --nproc 1")


def test_resume_continues_exactly(tmp_path):
    args = [*COMMON, "--max_steps=6", "--per_device_train_batch_size=1", "--save_strategy=steps", "--save_steps=3"]
    straight = tmp_path / "straight"
    launch(straight, *args, nproc=2)
    interrupted = tmp_path / "interrupted"
    launch(interrupted, *[a for a in args if not a.startswith("--max_steps")], "--max_steps=3", nproc=2)
    launch(interrupted, *args, f"--resume_from_checkpoint={interrupted / 'checkpoint-3'}", nproc=2)
    reference = weights(straight)
    for name, tensor in weights(interrupted).items():
        assert_close(tensor, reference[name], f"{name} after resuming at step 3")
    assert losses(interrupted)[-3:] == pytest.approx(losses(straight)[-3:], abs=1e-4)


def test_the_checkpoint_is_plain_hugging_face(single_process):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for folder in (single_process, single_process / "checkpoint-4"):
        model = AutoModelForCausalLM.from_pretrained(folder)
        assert model.config.model_type == "qwen3_moe" and model.config._experts_implementation != "halo_ep"
        assert AutoTokenizer.from_pretrained(folder).pad_token == "<pad>"
    assert not list(single_process.glob("*tmp*")) and not list(single_process.glob(".*"))


def test_bf16_trains_with_adamw_bf16_and_resumes_exactly(tmp_path):
    args = ["--bf16=true", "--optim=adamw_torch", "--learning_rate=1e-3", "--max_steps=4", "--logging_steps=1", "--seed=3",
            "--per_device_train_batch_size=2", "--save_strategy=steps", "--save_steps=2", "--router_aux_loss_coef=0.0"]
    straight = tmp_path / "straight"
    launch(straight, *args, nproc=2)
    exp_avg = load_file(straight / "checkpoint-4" / "optimizer" / "exp_avg.safetensors")
    assert {t.dtype for t in exp_avg.values()} == {torch.bfloat16}
    interrupted = tmp_path / "interrupted"
    launch(interrupted, *args, "--max_steps=2", nproc=2)
    launch(interrupted, *args, f"--resume_from_checkpoint={interrupted / 'checkpoint-2'}", nproc=2)
    reference = weights(straight)
    for name, tensor in weights(interrupted).items():
        assert torch.equal(tensor, reference[name]), f"{name} differs after resuming a bf16 run"


# AdamW, so that a resume that lost the optimizer state would not continue the run.
ADAMW = [*(a for a in COMMON if not a.startswith(("--optim", "--learning_rate", "--max_steps"))), "--optim=adamw_torch", "--learning_rate=1e-3",
         "--max_steps=6", "--save_strategy=steps", "--save_steps=2", "--save_total_limit=2"]


@pytest.fixture(scope="module")
def adamw_runs(tmp_path_factory):
    """Two uninterrupted AdamW runs of the same training: one process, and two processes at ep=2."""
    root = tmp_path_factory.mktemp("adamw")
    launch(root / "one", *ADAMW, "--expert_parallel_size=1", "--per_device_train_batch_size=2")
    launch(root / "ep2", *ADAMW, "--expert_parallel_size=2", "--per_device_train_batch_size=1", nproc=2)
    return {"one": root / "one", "ep2": root / "ep2"}


def test_save_total_limit_keeps_the_newest_checkpoints(adamw_runs):
    for run in adamw_runs.values():
        assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
        assert not list(run.glob(".*"))


def test_the_launchers_checkpoint_size_estimate_covers_what_a_save_writes(adamw_runs):
    """``output_room``'s estimate against the checkpoint the run wrote: at least its size, and above it by no more than
    the allowance for small files (a state counted twice, or one missed, would fall outside)."""
    from trl import SFTConfig

    from halo_core.trainers.parts.output_room import SMALL_FILES, checkpoint_bytes
    from halo_core.trainers.run_config import load_run_config, parse_overrides

    run = load_run_config("sft", SFTConfig, TINY, parse_overrides([*ADAMW, "--expert_parallel_size=1", "--per_device_train_batch_size=2"]))
    estimate, parts = checkpoint_bytes(run)
    written = sum(p.stat().st_size for p in (adamw_runs["one"] / "checkpoint-6").rglob("*") if p.is_file())
    assert written <= estimate <= written + SMALL_FILES, (written, parts)


@pytest.mark.parametrize(
    "saved, resumed, nproc",
    [("ep2", ["--expert_parallel_size=1", "--per_device_train_batch_size=2"], 1),
     ("one", ["--expert_parallel_size=1", "--expert_tensor_parallel_size=2", "--per_device_train_batch_size=1"], 2),
     ("one", ["--expert_parallel_size=1", "--tensor_parallel_size=2", "--per_device_train_batch_size=1"], 2),
     ("ep2", ["--expert_parallel_size=1", "--context_parallel_size=2", "--per_device_train_batch_size=1"], 2)],
    ids=["ep2-to-one-process", "one-process-to-etp2", "one-process-to-tp2", "ep2-to-cp2"],
)
def test_resume_on_another_layout_continues_exactly(adamw_runs, tmp_path, saved, resumed, nproc):
    straight = adamw_runs[saved]
    out = tmp_path / "resumed"
    launch(out, *ADAMW, *resumed, f"--resume_from_checkpoint={straight / 'checkpoint-4'}", nproc=nproc)
    assert losses(out)[-2:] == pytest.approx(losses(straight)[-2:], abs=1e-5, rel=0)
    reference = weights(straight)
    for name, tensor in weights(out).items():
        assert_close(tensor, reference[name], f"{name} after resuming {saved}'s step 4 with {resumed} on {nproc} process(es)", rtol=1e-4)


def test_resuming_on_fewer_processes_keeps_the_global_batch(adamw_runs, tmp_path):
    """ep=2's checkpoint resumed in one process with the batch keys unchanged: the launcher raises the accumulation to
    keep the global batch the checkpoint records, and the run continues as the uninterrupted one (without that it
    trains at half the batch)."""
    saved = adamw_runs["ep2"]
    out = tmp_path / "resumed"
    result = launch(out, *ADAMW, "--expert_parallel_size=1", "--per_device_train_batch_size=1", f"--resume_from_checkpoint={saved / 'checkpoint-4'}")
    assert losses(out)[-2:] == pytest.approx(losses(saved)[-2:], abs=1e-5, rel=0)
    line = "resuming checkpoint-4 at global batch 2 (saved so): gradient_accumulation_steps 1 -> 2 for 1 process(es) x per_device_train_batch_size 1"
    assert result.stdout.count(line) == 1, result.stdout[-3000:]
    record = json.loads((saved / "checkpoint-4" / "halo-run.json").read_text())
    assert record == {"global_batch": 2, "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "processes": 2}
    assert json.loads((out / "checkpoint-6" / "halo-run.json").read_text())["gradient_accumulation_steps"] == 2


def dry_run(monkeypatch, capsys, *overrides, nproc=1):
    """``halo launch sft --dry-run`` through the CLI's entry point in this process: (exit code, stdout, stderr)."""
    from halo_cli import main

    monkeypatch.setattr("sys.argv", ["halo", "launch", "sft", str(TINY), "--nproc", str(nproc), "--dry-run", "--", *overrides])
    code = 0
    try:
        main.app()
    except SystemExit as ended:
        code = ended.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_dry_run_shows_the_accumulation_that_keeps_the_global_batch(adamw_runs, tmp_path, monkeypatch, capsys):
    checkpoint = adamw_runs["ep2"] / "checkpoint-4"
    common = [*ADAMW, "--expert_parallel_size=1", f"--output_dir={tmp_path / 'out'}", f"--resume_from_checkpoint={checkpoint}"]
    code, out, err = dry_run(monkeypatch, capsys, *common, "--per_device_train_batch_size=1")
    assert code == 0 and "gradient_accumulation_steps 1 -> 2" in out and "gradient_accumulation_steps: 2\n" in out, out + err
    code, out, err = dry_run(monkeypatch, capsys, *common, "--per_device_train_batch_size=2")  # keys that keep it already
    assert code == 0 and "global batch" not in out and "gradient_accumulation_steps" not in out, out + err


def test_a_global_batch_no_accumulation_keeps_is_refused_before_start(adamw_runs, tmp_path, monkeypatch, capsys):
    checkpoint = adamw_runs["ep2"] / "checkpoint-4"
    code, out, err = dry_run(monkeypatch, capsys, *ADAMW, "--expert_parallel_size=1", "--per_device_train_batch_size=3",
                             f"--output_dir={tmp_path / 'out'}", f"--resume_from_checkpoint={checkpoint}")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, out + err
    assert ("checkpoint-4 trained at global batch 2 (per_device_train_batch_size x gradient_accumulation_steps x processes = 1 x 1 x 2), "
            "and 1 process(es) x per_device_train_batch_size 3 = 3 does not divide it; set per_device_train_batch_size x "
            "gradient_accumulation_steps = 2 (e.g. -- --per_device_train_batch_size=2 --gradient_accumulation_steps=1)") in lines[0], lines[0]


def test_a_checkpoint_without_its_global_batch_resumes_as_before_saying_so(adamw_runs, tmp_path, monkeypatch, capsys):
    old = tmp_path / "checkpoint-4"
    shutil.copytree(adamw_runs["ep2"] / "checkpoint-4", old)
    (old / "halo-run.json").unlink()  # as written before Halo recorded it, and before it wrote a manifest
    (old / "halo-manifest.json").unlink()
    code, out, err = dry_run(monkeypatch, capsys, *ADAMW, "--expert_parallel_size=1", "--per_device_train_batch_size=1",
                             f"--output_dir={tmp_path / 'out'}", f"--resume_from_checkpoint={old}")
    notes = [line for line in out.splitlines() if "global batch" in line]
    assert code == 0 and len(notes) == 1 and "records no global batch (no halo-run.json" in notes[0] and "not checked" in notes[0], out + err
    assert "gradient_accumulation_steps:" not in out  # the printed config: unchanged


def test_resuming_runs_no_code_from_the_checkpoint(adamw_runs, tmp_path):
    from test_checkpoint import plant_pickle

    shared = tmp_path / "checkpoint-4"
    shutil.copytree(adamw_runs["one"] / "checkpoint-4", shared)
    marker = tmp_path / "marker"
    for name in ("rng_state.pth", "training_args.bin", "optimizer.rank0.pt"):
        plant_pickle(shared / name, marker)
    # whoever planted them rewrote the manifest too (else the launcher refuses the changed sizes before start)
    (shared / "halo-manifest.json").unlink()
    command = [sys.executable, "-m", "halo_cli", "launch", "sft", str(TINY), "--", f"--output_dir={tmp_path / 'out'}", *ADAMW,
               "--expert_parallel_size=1", "--per_device_train_batch_size=2", f"--resume_from_checkpoint={shared}"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert result.returncode != 0 and "rng_state" in result.stderr and "Halo refuses it" in result.stderr, result.stderr[-3000:]
    assert not marker.exists()


def test_two_nodes_through_the_rendezvous_flags(tmp_path):
    """Two `halo launch` invocations as two one-process nodes meeting at a c10d rendezvous on localhost."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "nodes"
    args = [*COMMON, "--per_device_train_batch_size=1", "--expert_parallel_size=2", f"--output_dir={out}"]
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "halo_cli", "launch", "sft", str(TINY), "--nproc", "1", "--nnodes", "2", "--node-rank", str(rank),
             "--rdzv-endpoint", f"127.0.0.1:{port}", "--", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    assert (out / "model.safetensors").exists() and weights(out)


def test_compiled_layers_at_ep2_match_the_eager_single_process_run(single_process, tmp_path):
    out = tmp_path / "compiled"
    launch(out, *COMMON, "--expert_parallel_size=2", "--compile_layers=true", "--per_device_train_batch_size=1",
           "--save_strategy=steps", "--save_steps=4", nproc=2)
    assert losses(out) == pytest.approx(losses(single_process), abs=1e-4)
    reference = weights(single_process)
    for name, tensor in weights(out).items():
        assert_close(tensor, reference[name], f"{name} after 4 compiled steps at ep=2")
