"""What the asynchronous loop needs to generate ahead: the batches after the current one, and which rollouts may be used.

``Lookahead`` wraps the trainer's epoch iterator (``get_batch_samples`` reads it) so that the generation batch
``steps`` items after a given one can be read before the trainer reaches it; the items pulled early are handed
out later in order, so the trainer sees the stream it would have seen. ``Prefetched`` is a rollout in flight:
the prompts it was asked for (it is used only for exactly those) and the optimizer step whose weights the
engine held when it was asked (it is used only while it is at most ``max_staleness`` steps old).
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass
from typing import Iterator


class Lookahead:
    #: Items handed out that stay findable (the current generation batch is among the last few).
    KEEP = 64

    def __init__(self, iterator: Iterator):
        self.iterator, self.items, self.handed = iterator, [], 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.handed == len(self.items):
            self.items.append(next(self.iterator))
        item = self.items[self.handed]
        self.handed += 1
        if self.handed > self.KEEP:
            drop = self.handed - self.KEEP
            del self.items[:drop]
            self.handed -= drop
        return item

    def after(self, item, steps: int):
        """The item ``steps`` after ``item`` (found by identity among those handed out), or ``None`` at the epoch's end."""
        position = next((i for i in range(self.handed - 1, -1, -1) if self.items[i] is item), None)
        if position is None:
            return None
        while len(self.items) <= position + steps:
            try:
                self.items.append(next(self.iterator))
            except StopIteration:
                return None
        return self.items[position + steps]


@dataclass
class Prefetched:
    prompts: list[list[int]]
    future: concurrent.futures.Future
    version: int  # the optimizer step whose weights generated it
