"""What the launcher equivalence tests share: data whose rows differ in length (every batch is padded,
every CP x TP pool re-padded), `halo launch METHOD` in a subprocess, and what a run leaves behind.

float32 throughout (``--bf16=false``): TRL's default on a machine with bf16 would train in bf16.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "templates" / "tiny" / "model"
STEPS = 3
GLOBAL_BATCH = 4
COMMON = [f"--max_steps={STEPS}", "--lr_scheduler_type=constant", "--warmup_steps=0", "--logging_steps=1", "--save_strategy=steps",
          f"--save_steps={STEPS}", "--router_aux_loss_coef=0.0", "--seed=5", "--max_grad_norm=1.0", "--bf16=false", "--report_to=none"]
#: ``COMMON`` for the sequence-classification methods (reward, classify): their configs have no router
#: auxiliary loss, which transformers' sequence-classification heads do not add.
HEAD_COMMON = [a for a in COMMON if not a.startswith("--router_aux_loss_coef")]
OPTIMIZERS = {"sgd": ["--optim=sgd", "--learning_rate=0.5"], "adamw": ["--optim=adamw_torch", "--learning_rate=3e-3"]}
LENGTHS = [1, 2, 3, 7, 15, 40]

#: What a plain-text run adds to its YAML: TRL's text column, and a ``max_length`` that cuts the longest rows.
TEXT_RUN = "dataset_text_field: text\nmax_length: 48\n"

#: (processes, overrides) of each split alone on two ranks.
TWO_RANKS = {
    "ep2": (2, ["--expert_parallel_size=2"]),
    "tp2": (2, ["--tensor_parallel_size=2"]),
    "cp2": (2, ["--context_parallel_size=2"]),
    "etp2": (2, ["--expert_tensor_parallel_size=2"]),
}


def _numbers(draw: random.Random) -> tuple[int, str]:
    n = draw.choice(LENGTHS)
    return n, " ".join(str(draw.randrange(100)) for _ in range(n))


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _assistant(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def uneven_rows(kind: str, count: int = 64, seed: int = 11) -> list[dict]:
    """Rows in TRL's format for ``kind``: ``completion`` (prompt, completion), ``text`` (plain text, 6 to 40 numbers:
    every token is trained on, the first and the end-of-sequence one included), ``preference`` (prompt, chosen,
    rejected), ``unpaired`` (prompt, completion, label: bool), ``labelled`` (text, label: int of 3), ``prompts``
    (prompt), ``groups`` (prompt, completions, rewards); lengths of 1 to 40 numbers."""
    draw = random.Random(seed)
    rows = []
    for index in range(count):
        n, numbers = _numbers(draw)
        prompt = _user(f"Repeat {n} numbers")
        if kind == "completion":
            rows.append({"prompt": prompt, "completion": _assistant(numbers)})
        elif kind == "text":
            rows.append({"text": " ".join(str(draw.randrange(100)) for _ in range(draw.randint(6, 40)))})
        elif kind == "preference":
            rows.append({"prompt": prompt, "chosen": _assistant(numbers), "rejected": _assistant(_numbers(draw)[1])})
        elif kind == "unpaired":
            rows.append({"prompt": prompt, "completion": _assistant(numbers), "label": draw.random() < 0.5})
        elif kind == "labelled":
            rows.append({"text": numbers, "label": index % 3})
        elif kind == "prompts":  # GRPO: the prompt alone (the test rewards read the completions)
            rows.append({"prompt": _user(f"Repeat {numbers}")})
        elif kind == "groups":  # offline GRPO: four completions of uneven lengths, uneven rewards (ties included)
            completions = [_assistant(_numbers(draw)[1]) for _ in range(4)]
            rows.append({"prompt": prompt, "completions": completions, "rewards": [float(draw.randrange(3)) for _ in range(4)]})
        else:
            raise ValueError(kind)
    return rows


def write_run(folder: Path, kind: str, extra: str = "") -> Path:
    """A run YAML over the tiny model (random init) and uneven rows of ``kind``."""
    (folder / f"{kind}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in uneven_rows(kind)))
    config = folder / "run.yaml"
    config.write_text(f"model_name_or_path: {TINY}\nrandom_init: true\ndataset:\n  - path: {kind}.jsonl\n{extra}")
    return config


def launch_overrides(output_dir: Path, nproc: int, *args: str, batch: int | None = None, common: list[str] = COMMON) -> list[str]:
    """The fields ``launch`` passes after ``--``."""
    return [f"--output_dir={output_dir}", f"--per_device_train_batch_size={batch or GLOBAL_BATCH // nproc}", *common, *args]


def launch(method: str, config: Path, output_dir: Path, nproc: int, *args: str, batch: int | None = None, common: list[str] = COMMON,
           env: dict | None = None) -> Path:
    """``halo launch METHOD`` on ``nproc`` processes; the global batch is ``GLOBAL_BATCH`` in every layout.
    ``common``: ``COMMON``, or ``HEAD_COMMON`` for methods whose config has no ``router_aux_loss_coef``; ``env``: more
    environment variables for the launch."""
    import os

    command = [sys.executable, "-m", "halo_cli", "launch", method, str(config), "--nproc", str(nproc), "--",
               *launch_overrides(output_dir, nproc, *args, batch=batch, common=common)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=output_dir.parent, timeout=600, env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    console(output_dir).write_text(result.stdout + result.stderr)
    return output_dir


def console(output_dir: Path) -> Path:
    """Where ``launch`` keeps what the run printed (beside its folder), for tests that read the console."""
    return output_dir.parent / f"{output_dir.name}.console.txt"


#: Warnings a run must not print (issue 45): each was either removed at its cause or shown harmless and filtered.
NOISE = ("`gradient_checkpointing` is deprecated", "is_gradient_checkpointing` is deprecated", "gradient_checkpointing_enable` is deprecated",
         "gradient_checkpointing_disable` is deprecated", "keys did not match any targeted module", "Already found a `peft_config`",
         "returned a view tensor", "all_gather is deprecated")


def noise_in(text: str) -> list[str]:
    """The lines of ``text`` that carry one of ``NOISE``."""
    return [line for line in text.splitlines() if any(n in line for n in NOISE)]


def assert_planned(method: str, config: Path, output_dir: Path, nproc: int, args: list[str], common: list[str] = COMMON) -> None:
    """``halo plan``'s parameter, gradient and optimizer bytes of each rank are that rank's real tensors' bytes, which
    a launch run with ``HALO_TENSOR_BYTES`` at ``output_dir.parent / "tensor-bytes"`` wrote after its first step."""
    from halo_cli.plan import figures, model_config
    from halo_core.trainers.method import get_method
    from halo_core.trainers.run_config import load_run_config, parse_overrides

    chosen = get_method(method)
    run = load_run_config(method, chosen.config_class, config, parse_overrides(launch_overrides(output_dir, nproc, *args, common=common)))
    found, _ = model_config(run)
    for rank in range(nproc):
        actual = json.loads((output_dir.parent / "tensor-bytes" / f"rank-{rank}.json").read_text())
        assert actual["parameters"] > 0 and actual["gradients"] > 0, actual  # a step ran with gradients held
        planned = figures(run, nproc, found, gpu_bytes=2**40, ranks=(rank,))["per_gpu"]
        assert {k: planned[k] for k in actual} == actual, f"rank {rank} of {nproc} ({' '.join(args)})"


def logged(output_dir: Path, key: str) -> list[float]:
    state = json.loads((output_dir / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    return [entry[key] for entry in state["log_history"] if "loss" in entry]


def weights(output_dir: Path, auto_class: str = "AutoModelForCausalLM") -> dict[str, torch.Tensor]:
    import transformers

    return getattr(transformers, auto_class).from_pretrained(output_dir, dtype=torch.float32).state_dict()


def saved_tiny_model(folder: Path, seed: int = 0) -> Path:
    """The tiny model saved with random weights (``seed``) and its tokenizer: a folder a server or judge can serve, or
    (seed 1) the distill runs' teacher, another draw than the student's so the divergence is live."""
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY)).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TINY / name, folder)
    return folder


def launch_tool_default(name: str, cwd: Path) -> tuple[Path, dict]:
    """A bundled one-process GRPO default (``templates/configs/NAME``) for one step from another working directory:
    its output folder and the step's logged entry, after checking it ended cleanly, quietly and left its model."""
    from conftest import run_halo

    out = cwd / "run"
    config = Path(__file__).resolve().parents[1] / "templates" / "configs" / name
    result = run_halo("launch", "grpo", str(config), "--nproc", "1", "--", f"--output_dir={out}", "--max_steps=1", "--save_steps=1",
                      cwd=cwd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not noise_in(result.stdout + result.stderr)
    assert (out / "model.safetensors").exists()
    return out, json.loads((out / "checkpoint-1" / "trainer_state.json").read_text())["log_history"][0]


@dataclass(frozen=True)
class MethodRun:
    """How the equivalence matrix launches one method and what it compares (tests/test_equivalence_matrix.py): written
    once here so the matrix and the method's own tests (stock trainer, precomputed reference) share one reference run."""

    kind: str  #: the rows (``uneven_rows``)
    yaml: Callable[[Path], str] = lambda folder: ""  #: more YAML for the run, given its folder (may write files there)
    args: tuple[str, ...] = ()  #: fields after SGD's
    common: tuple[str, ...] = tuple(COMMON)
    auto_class: str = "AutoModelForCausalLM"
    keys: tuple[str, ...] = ("loss",)  #: logged metrics held to one process within 1e-5 (and ``rel``)
    rel: float = 0.0
    tokens: bool = False  #: TRL's ``num_tokens`` logged and equal to one process's
    planned: bool = False  #: ``halo plan``'s bytes per rank equal the run's real ones (``assert_planned``)
    live: tuple[str, float] | None = None  #: (metric, bound): one process's metric exceeds bound somewhere, so it is under test
    quiet: bool = False  #: the run prints none of ``NOISE``
    method: str | None = None  #: the method ``halo launch`` runs, where the row's name is not one (``sft-lora``)
    more: tuple[str, ...] = ()  #: layouts (``LAYOUTS``) beyond each declared split alone on two ranks
    adapter: bool = False  #: a LoRA run: the adapter the run writes is compared (the base stays frozen)


#: Evaluation every step, two rows a rank: the sequence methods' runs carry it, so tests/test_evaluation.py reads their
#: evaluation metrics off the matrix's runs instead of launching the same training again.
EVAL_FIELDS = ("--eval_strategy=steps", "--eval_steps=1", "--per_device_eval_batch_size=2")


def with_eval(kind: str, extra: str = "") -> Callable[[Path], str]:
    """A ``MethodRun.yaml`` that also writes 8 evaluation rows of ``kind`` (seed 3: other rows than training's): with
    two a rank on two ranks they fill every batch, so the stock mean over rows is one process's on every layout."""

    def yaml(folder: Path) -> str:
        (folder / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in uneven_rows(kind, count=8, seed=3)))
        return extra + "eval_dataset:\n  - path: eval.jsonl\n"

    return yaml


#: LoRA on the tiny MoE with TRL's keys (``all-linear``: attention, router and every fused expert, as PEFT reads it).
LORA = "use_peft: true\nlora_r: 4\nlora_alpha: 8\nlora_dropout: 0.0\nlora_target_modules: all-linear\n"
#: Layouts beside ``TWO_RANKS`` a row may add (``MethodRun.more``).
LAYOUTS = {**TWO_RANKS, "dp2": (2, []), "ep2-tp2": (4, ["--expert_parallel_size=2", "--tensor_parallel_size=2"])}

#: Every method whose splits the matrix holds to one process. SFT's layouts (compositions, ring attention, AdamW) are
#: tests/test_launch_layouts.py's; GRPO and SDPG compare generated completions too (their own files).
MATRIX = {
    "dpo": MethodRun("preference", yaml=with_eval("preference"), args=EVAL_FIELDS, keys=("loss", "rewards/margins", "logps/chosen", "logps/rejected"), rel=1e-6, tokens=True),
    "kto": MethodRun("unpaired", keys=("loss", "kl", "rewards/margins"), tokens=True, live=("kl", 0.0), quiet=True),
    "smpo": MethodRun("preference", args=("--learning_rate=0.05",), keys=("loss", "rewards/margins", "margin"), rel=1e-6, tokens=True),
    "reward": MethodRun("preference", common=tuple(HEAD_COMMON), auto_class="AutoModelForSequenceClassification",
                        keys=("loss", "accuracy", "margin", "mean_reward"), rel=1e-6, tokens=True, planned=True),
    "classify": MethodRun("labelled", yaml=with_eval("labelled", "num_labels: 3\n"), args=EVAL_FIELDS, common=tuple(HEAD_COMMON),
                          auto_class="AutoModelForSequenceClassification", planned=True),
    "offline-grpo": MethodRun("groups", yaml=lambda folder: "loss_type: bnpo\n", common=tuple(HEAD_COMMON),
                              keys=("loss", "logps/better", "logps/worse", "advantages/abs_mean"), rel=1e-6, live=("loss", 1e-3)),
    "distill": MethodRun("completion", yaml=lambda folder: f"teacher_model_name_or_path: {saved_tiny_model(folder / 'teacher', seed=1)}\nlmbda: 0.0\n"),
    # LoRA under data parallelism alone (FSDP2 over both ranks), each split alone, and dense TP adapters beside
    # EP-sharded expert adapters on four ranks
    "sft-lora": MethodRun("completion", yaml=lambda folder: LORA, method="sft", rel=1e-6, tokens=True, more=("dp2", "ep2-tp2"), adapter=True),
}


def split_of(layout: str) -> str:
    """The split a ``TWO_RANKS`` layout runs alone (``ep2`` -> ``ep``)."""
    return layout.rstrip("0123456789")


def launched(row: str) -> str:
    """The method a ``MATRIX`` row launches."""
    return MATRIX[row].method or row


def method_layouts(row: str) -> dict[str, tuple[int, list[str]]]:
    """The two-rank layouts of every split the row's method declares (``Method.splits``), then the row's ``more``."""
    from halo_core.trainers.method import get_method

    splits = get_method(launched(row)).splits
    return {**{name: layout for name, layout in TWO_RANKS.items() if split_of(name) in splits}, **{name: LAYOUTS[name] for name in MATRIX[row].more}}


class MethodRuns:
    """Per method, its run file, one-process SGD reference and two-rank layout runs, each made on first use and kept for
    the session: a test that needs the same run reads it instead of launching it again."""

    def __init__(self, tmp_path_factory) -> None:
        self._factory, self._configs, self._singles, self._layouts = tmp_path_factory, {}, {}, {}

    def config(self, method: str) -> Path:
        if method not in self._configs:
            folder, spec = self._factory.mktemp(method), MATRIX[method]
            self._configs[method] = write_run(folder, spec.kind, spec.yaml(folder))
        return self._configs[method]

    def launch(self, method: str, output_dir: Path, nproc: int, *args: str, env: dict | None = None) -> Path:
        """``halo launch`` of the method's run file under SGD, its fields, then ``args``."""
        spec = MATRIX[method]
        return launch(launched(method), self.config(method), output_dir, nproc, *OPTIMIZERS["sgd"], *spec.args, *args, common=list(spec.common), env=env)

    def single(self, method: str) -> Path:
        if method not in self._singles:
            self._singles[method] = self.launch(method, self.config(method).parent / "single", 1)
        return self._singles[method]

    def layout(self, method: str, name: str) -> Path:
        """The run at ``LAYOUTS[name]``; a row that is ``MethodRun.planned`` also writes each rank's tensor bytes beside it
        (``assert_planned``'s folder)."""
        if (method, name) not in self._layouts:
            from halo_core.trainers.parts.tensor_bytes import ENV

            out = self._factory.mktemp(f"{method}-{name}") / "run"
            env = {ENV: str(out.parent / "tensor-bytes")} if MATRIX[method].planned else None
            self._layouts[method, name] = self.launch(method, out, LAYOUTS[name][0], *LAYOUTS[name][1], env=env)
        return self._layouts[method, name]


def assert_matches_single(method: str, out: Path, single: Path, name: str) -> None:
    """``out`` (a run of ``method``, a ``MATRIX`` row, at layout ``name``) logged one process's metrics and ended on its
    weights: the row's keys within 1e-5, ``num_tokens`` exactly, every post-SGD weight (or adapter weight) within 1e-4
    relative."""
    import pytest

    from halo_core.testing.compare import assert_close

    spec = MATRIX[method]
    assert len(logged(single, "loss")) == STEPS
    if spec.live:
        key, bound = spec.live
        assert max(abs(x) for x in logged(single, key)) > bound, f"{key} is trivially {logged(single, key)}"
    for key in spec.keys:
        assert logged(out, key) == pytest.approx(logged(single, key), abs=1e-5, rel=spec.rel), key
    if spec.tokens:
        assert logged(out, "num_tokens") == logged(single, "num_tokens")
    if spec.quiet:
        assert not noise_in(console(out).read_text())
    if spec.adapter:
        from safetensors.torch import load_file

        expected, got = (load_file(str(folder / "adapter_model.safetensors")) for folder in (single, out))
        assert sorted(got) == sorted(expected)
    else:
        expected, got = weights(single, spec.auto_class), weights(out, spec.auto_class)
    for key, tensor in got.items():
        assert_close(tensor, expected[key], f"{key} after {STEPS} SGD steps at {name}", rtol=1e-4)
