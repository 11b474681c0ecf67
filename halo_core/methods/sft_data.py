"""SFT's refusal of rows in none of TRL's formats, before start: otherwise every rank ends in a long ``KeyError: 'text'``
from TRL's tokenisation (the preference methods refuse through their fixed ``columns``; SFT's depend on a key)."""

from __future__ import annotations

from halo_core.errors import ConfigError

#: Columns TRL's SFTTrainer reads besides ``dataset_text_field`` (``messages``, a prompt-completion pair, tokenised rows).
FORMATS = (("messages",), ("prompt", "completion"), ("input_ids",))


def fits(columns: set[str], text_field: str) -> bool:
    return text_field in columns or any(all(c in columns for c in form) for form in FORMATS)


#: Column names that usually hold a prompt or its answer, in the order tried.
PROMPTS = ("question", "query", "instruction", "input", "q", "problem", "context")
ANSWERS = ("answer", "response", "output", "a", "solution", "target", "chosen")


def rename_hint(columns: list[str], text_field: str) -> str:
    """The ``rename_columns`` a user likely means: a question-like and an answer-like column as prompt and completion,
    a single column as the text; else the form to fill in."""
    from halo_core.trainers.parts.processor import IMAGE_COLUMNS

    prompt = next((c for name in PROMPTS for c in columns if c.lower() == name), None)
    answer = next((c for name in ANSWERS for c in columns if c.lower() == name), None)
    if prompt and answer:
        return f"rename_columns: {{{prompt}: prompt, {answer}: completion}}"
    plain = [c for c in columns if c not in IMAGE_COLUMNS]
    if len(plain) == 1:
        return f"rename_columns: {{{plain[0]}: {text_field}}}"
    return f"rename_columns: {{PROMPT_COLUMN: prompt, COMPLETION_COLUMN: completion}} (or {{TEXT_COLUMN: {text_field}}})"


def check(run, args, world: int = 1) -> None:
    from halo_core.trainers.parts.data import local_columns
    from halo_core.trainers.parts.processor import IMAGE_COLUMNS

    text_field = getattr(args, "dataset_text_field", "text")
    for index, source in enumerate(run.halo.dataset):
        columns = local_columns(source)
        if columns is not None and source.streaming and any(c in columns for c in IMAGE_COLUMNS):
            raise ConfigError(f"{run.source}: dataset[{index}] {source.path!r} has images, which a streamed source does not decode yet; "
                              f"set streaming: false for it")
        if columns is None or fits(columns, text_field):
            continue  # a hub dataset is read by the worker
        found = sorted(columns)
        raise ConfigError(
            f"{run.source}: dataset[{index}] {source.path!r} has columns {found}, which fit none of sft's formats "
            f"('{text_field}' (dataset_text_field), 'messages', or 'prompt' and 'completion'); "
            f"rename them with the source's {rename_hint(found, text_field)}, or set dataset_text_field"
        )


def check_loaded(dataset, text_field: str, where: str = "the training data") -> None:
    """The same verdict in the worker for a source not read before start (a hub dataset, a builder's several files): every
    rank loaded the same rows, so every rank stops together with this one line (``RunStopped``), before TRL's tokenisation."""
    from halo_core.trainers.parts.stopping import RunStopped

    columns = getattr(dataset, "column_names", None)
    if not columns or fits(set(columns), text_field):
        return  # a stream that does not know its columns: TRL reads its first row
    found = sorted(columns)
    raise RunStopped(f"{where} has columns {found}, which fit none of sft's formats ('{text_field}' (dataset_text_field), "
                     f"'messages', or 'prompt' and 'completion'); rename them with the source's {rename_hint(found, text_field)}, "
                     f"or set dataset_text_field")
