"""Running again into a run folder: refuse to overwrite it silently, say what a resume picked, and after an interrupt
say how to resume.

transformers 5 starts afresh into an ``output_dir`` that holds checkpoints and overwrites them one by one (and the
final model) with no word; transformers 4 refused a non-empty one unless ``overwrite_output_dir`` was set. Halo
refuses, before start, an ``output_dir`` holding what the run would overwrite: a ``checkpoint-N`` or a saved model
(``config.json``, or a LoRA run's ``adapter_config.json``: a finished run's result, which the new run's final save
would replace). Other files (notes, logs) are left alone and do not count. ``resume_from_checkpoint`` continues the
run instead; ``overwrite_output_dir: true`` (transformers 4's name and meaning) starts afresh over it.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from halo_core.errors import ConfigError

FIELD = "overwrite_output_dir"
RESUME = "resume_from_checkpoint"
#: What a finished run leaves in output_dir (a full model, or a LoRA adapter).
MODEL_FILES = ("config.json", "adapter_config.json")


def output_dir(run) -> str:
    return run.trainer.get("output_dir") or "trainer_output"  # TrainingArguments' default


def latest_checkpoint(folder: str) -> str | None:
    """The latest ``checkpoint-N`` in ``folder`` as transformers finds it (a half-written one is hidden elsewhere)."""
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(folder) if Path(folder).is_dir() else None


def check_output_dir(run) -> None:
    """Refuse a fresh start into an ``output_dir`` that holds checkpoints or a model, unless the run opts in."""
    if run.trainer.get(RESUME) or run.halo.overwrite_output_dir:
        return
    folder = output_dir(run)
    latest = latest_checkpoint(folder)
    ways = (f"resume it with {RESUME}: true (-- --{RESUME}=true), or start afresh over it with {FIELD}: true "
            f"(-- --{FIELD}=true), or choose another output_dir")
    if latest is not None:
        raise ConfigError(f"{run.source}: output_dir {folder!r} holds checkpoints (the latest: {latest}), which a fresh start would "
                          f"overwrite; {ways}")
    model = next((name for name in MODEL_FILES if (Path(folder) / name).is_file()), None)
    if model is not None:
        raise ConfigError(f"{run.source}: output_dir {folder!r} holds a saved model ({model}), which this run's final save would "
                          f"overwrite; choose another output_dir, or overwrite it with {FIELD}: true (-- --{FIELD}=true)")


def resuming_line(run, asked_latest: bool) -> str | None:
    """'resuming from PATH' (after ``check_resume`` resolved it), or ``None`` for a fresh start."""
    folder = run.trainer.get(RESUME)
    if not folder:
        return None
    return f"resuming from {folder}" + (" (the latest checkpoint in output_dir)" if asked_latest else "")


def without_resume(tokens: list[str]) -> list[str]:
    """The command line's overrides less any ``resume_from_checkpoint`` (in either spelling, ``=`` or a second token)."""
    kept, skip = [], False
    for token in tokens:
        if skip:
            skip = False
            continue
        key = token[2:].partition("=")[0].replace("-", "_") if token.startswith("--") else None
        if key == RESUME:
            skip = "=" not in token
            continue
        kept.append(token)
    return kept


def interrupted_line(run, launcher_args: list[str], overrides: list[str], signal_name: str = "SIGINT") -> str:
    """After Ctrl-C: the last complete checkpoint and the command that resumes it (the launcher's own arguments, the
    user's overrides, and ``resume_from_checkpoint`` set to it)."""
    folder = output_dir(run)
    latest = latest_checkpoint(folder) or run.trainer.get(RESUME)  # a resumed run that has not saved yet
    if latest is None:
        return f"interrupted ({signal_name}) before any checkpoint was complete in output_dir {folder}; nothing to resume: run the same command to start afresh"
    command = ["halo", "launch", *launcher_args, "--", *without_resume(overrides), f"--{RESUME}={latest}"]
    return f"interrupted ({signal_name}); the last complete checkpoint is {latest}; resume with: {shlex.join(command)}"
