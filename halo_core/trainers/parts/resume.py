"""``resume_from_checkpoint`` checked and resolved before any process starts.

A wrong path would otherwise fail in every rank after the model is built. ``true`` means
what ``Trainer.train`` makes of it (the latest ``checkpoint-N`` in ``output_dir``); it is
resolved here, once, so every rank resumes from the same folder, and written back as a
path so that the workers' ``TrainingArguments`` (a ``str`` field) carry it.
"""

from __future__ import annotations

from pathlib import Path

from halo_core.errors import ConfigError

FIELD = "resume_from_checkpoint"
#: What a checkpoint folder must hold for Halo to resume from it (the weights as load_into reads them).
WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
#: What a LoRA run's checkpoint holds instead (its base is rebuilt as the run began).
ADAPTER_WEIGHTS = ("adapter_model.safetensors",)
STATE = "trainer_state.json"


def check_resume(run) -> None:
    """Refuse a ``resume_from_checkpoint`` that cannot be resumed from; replace ``true`` by the folder it means."""
    # Imported here: the CLI imports this module for every command, and these bring in torch.
    from transformers.trainer_utils import get_last_checkpoint

    from halo_core.trainers.parts import checkpoint, integrity

    value = run.trainer.get(FIELD)
    if value is None or value is False:
        run.trainer.pop(FIELD, None)
        return
    if value is True:
        output_dir = run.trainer.get("output_dir") or "trainer_output"  # TrainingArguments' default
        latest = get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None
        if latest is None:
            raise ConfigError(
                f"{run.source}: {FIELD}: true resumes from the latest checkpoint-N in output_dir {output_dir!r}, which has none; "
                f"remove {FIELD} to start afresh, or set it to a checkpoint folder"
            )
        value = latest
    folder = Path(value)
    fix = f"set {FIELD} to a checkpoint-N folder a run wrote (or true for the latest in output_dir)"
    if not folder.is_dir():
        raise ConfigError(f"{run.source}: {FIELD} {str(value)!r} does not exist; {fix}")
    missing = [] if (folder / STATE).is_file() else [STATE]
    weights = ADAPTER_WEIGHTS if run.peft.get("use_peft") else WEIGHTS
    if not any((folder / name).is_file() for name in weights):
        missing.append(" or ".join(weights))
    if missing:
        raise ConfigError(f"{run.source}: {FIELD} {str(value)!r} is not a checkpoint (it has no {' and no '.join(missing)}); {fix}")
    if checkpoint.pickled_optimizer(folder):
        raise ConfigError(f"{run.source}: {FIELD}: {checkpoint.PICKLED.format(folder=folder)}")
    for note in integrity.resume_notes(folder, integrity.check_folder(folder, run.source, FIELD)):
        print(note, flush=True)
    run.trainer[FIELD] = str(folder.resolve())
