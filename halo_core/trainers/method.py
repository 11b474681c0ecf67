"""Training methods, found by name through the ``halo.methods`` entry-point group."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Callable

from halo_core.errors import ConfigError

ENTRY_POINT_GROUP = "halo.methods"


@dataclass(frozen=True)
class Method:
    name: str
    #: The TRL/transformers config dataclass whose fields the run's YAML may set.
    config_class: type
    run: Callable
    #: Splits the method's trainer can feed (context parallelism needs sequences split per rank).
    splits: frozenset[str] = frozenset({"ep"})
    #: Columns every training row needs (after a source's ``columns`` renames); ``"a|b"`` accepts either.
    columns: tuple[str, ...] = ()
    #: What the matrix says the rows hold where no fixed ``columns`` apply (they vary with a key, say); default TRL's formats.
    formats: str = "TRL's formats"
    #: Refusals of the method's own, before any process starts: ``check(run, args, world)`` raises ``ConfigError``
    #: (``args``: the method's config dataclass as the worker will build it; ``world``: the launch's process count).
    check: Callable | None = None
    #: The trainer class the worker builds (documentation: ``halo methods matrix``).
    trainer: type | None = None
    #: Whether the worker builds the family's backbone under a sequence-classification head (``score``).
    sequence_classification: bool = False
    #: Whether the trainer trains on image rows (an ``images`` column) with the model's processor (TRL's SFTTrainer does);
    #: the launcher refuses image data for the others before start.
    images: bool = False


def known_methods() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def get_method(name: str) -> Method:
    """The method called ``name``, loaded once per process (``halo_core.registry.reset_caches`` forgets it)."""
    method = _load_method(name)
    if method is None:
        raise ConfigError(f"unknown method {name!r}; known methods: {', '.join(known_methods()) or 'none installed'}")
    return method


@functools.cache
def _load_method(name: str) -> Method | None:
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return found[name].load() if name in found else None
