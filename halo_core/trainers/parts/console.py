"""The console's log line, wrapped: transformers prints each log as one dict on one line, which GRPO's and SDPG's
many keys (a mean, std, min and max per reward function and per completion statistic, the MoE load) ran past 1,200
characters. The same dict, values formatted as transformers formats them, is broken between entries into lines of
at most ``WIDTH`` characters. Only the console changes: ``trainer_state.json``'s log history, the JSONL logs and
every tracker get the logs as the trainer made them.
"""

from __future__ import annotations

from transformers.trainer_callback import PrinterCallback, ProgressCallback

#: The longest console line a log prints (one entry longer than this keeps its own line).
WIDTH = 120


def console_text(logs: dict, max_str_len: int | None = None, width: int = WIDTH) -> str:
    """``logs`` as transformers shows it (floats to 4 significant digits, ``total_flos`` left out, strings longer than
    ``max_str_len`` replaced by a note), wrapped between entries at ``width``; continuation lines are indented by one."""
    entries = []
    for key, value in logs.items():
        if key == "total_flos":
            continue
        if isinstance(value, str) and max_str_len is not None and len(value) > max_str_len:
            value = f"[String too long to display, length: {len(value)} > {max_str_len}. Consider increasing `max_str_len` if needed.]"
        elif isinstance(value, float):
            value = f"{value:.4g}"
        entries.append(f"{key!r}: {value!r}")
    lines, line = [], "{"
    for index, entry in enumerate(entries):
        piece = entry + ("}" if index == len(entries) - 1 else ",")
        if len(line) > 1 and len(line) + 1 + len(piece) > width:
            lines.append(line)
            line = " " + piece
        else:
            line = line + ("" if line in ("{", " ") else " ") + piece
    lines.append(line if entries else "{}")
    return "\n".join(lines)


class WrappedProgress(ProgressCallback):
    """transformers' progress bar, its log line wrapped (``console_text``)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None:
            self.training_bar.write(console_text(logs, self.max_str_len))


class WrappedPrinter(PrinterCallback):
    """transformers' printer (``disable_tqdm``), its log line wrapped (``console_text``); like the stock one, it drops
    ``total_flos`` from the logs it is handed."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs.pop("total_flos", None)
        if state.is_local_process_zero:
            print(console_text(logs))


def install(trainer) -> None:
    """Put the wrapped callbacks in place of the stock ones, where they were (the other callbacks' order kept)."""
    callbacks = trainer.callback_handler.callbacks
    for index, callback in enumerate(callbacks):
        if type(callback) is ProgressCallback:
            callbacks[index] = WrappedProgress(max_str_len=callback.max_str_len)
        elif type(callback) is PrinterCallback:
            callbacks[index] = WrappedPrinter()
