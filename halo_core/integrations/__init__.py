"""Every private part of transformers, TRL and PEFT that Halo leans on, declared in one place and checked at import.

Halo overrides private trainer methods, reads private attributes, patches two TRL module functions for the length of a
constructor and recognises transformers' experts interface by its private parts. None of that is a stable API: a
release that renames one would otherwise break a run deep in a step, with nothing saying why. Each module here
(one per library) lists its seams as written for the supported versions and checks them when it is imported, so a
changed seam fails at once, in one line naming the installed version and the supported range.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version

from halo_core.errors import HaloError

#: The versions each library was run with (bench/lowest_versions.sh at the lower bound, the suite at the upper):
#: pyproject.toml declares the same ranges (tests/test_integrations.py holds the two together).
SUPPORTED = {
    "transformers": ">=5.23,<5.26",
    "trl": ">=1.16,<1.17",
    "peft": ">=0.21,<0.22",
    "accelerate": ">=1.14,<1.17",
}


class IntegrationError(HaloError, ImportError):
    """A seam is not what Halo was written for: the installed library is outside the tested range, or changed."""


@dataclass(frozen=True)
class Seam:
    """One private part of a library. ``owner``: a dotted module path, or ``module:Class``; ``name``: the attribute.

    ``params``: the parameter names after ``self`` the override or call was written for (a callable's leading
    parameters must be these; further ones must have defaults); ``None`` checks presence only. ``assigned_in``: for an
    instance attribute, the class whose source assigns ``self.<name>`` (there is no attribute on the class to find).
    ``reads``: an attribute Halo sets for the library to read, which ``owner.name``'s source must name.
    """

    owner: str
    name: str
    params: tuple[str, ...] | None = None
    assigned_in: bool = False
    reads: str | None = None

    def problem(self) -> str | None:
        """What differs from what Halo was written for, or ``None``."""
        module, _, cls = self.owner.partition(":")
        try:
            target = import_module(module)
        except ImportError:
            return f"no module {module}"
        if cls:
            target = getattr(target, cls, None)
            if target is None:
                return f"no {module}.{cls}"
        where = f"{self.owner.replace(':', '.')}.{self.name}"
        if self.assigned_in:
            source = _source(target)
            return None if source is None or re.search(rf"self\.{self.name}\b", source) else f"{where} is never assigned"
        found = getattr(target, self.name, None)
        if found is None:
            return f"no {where}"
        if self.reads is not None:
            source = _source(found)
            return None if source is None or self.reads in source else f"{where} no longer reads {self.reads}"
        if self.params is None:
            return None
        params = [p for p in inspect.signature(found).parameters.values() if p.name != "self"]
        names = tuple(p.name for p in params[:len(self.params)])
        extra = [p for p in params[len(self.params):]
                 if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if names != self.params or extra:
            return f"{where}({', '.join(p.name for p in params)}) where Halo was written for ({', '.join(self.params)})"
        return None


def _source(obj) -> str | None:
    """``obj``'s source, ``None`` where none ships (a bytecode-only install: nothing to check against)."""
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return None


def installed(library: str) -> str:
    try:
        return version(library)
    except PackageNotFoundError:
        return "not installed"


def check(library: str, seams: tuple[Seam, ...]) -> None:
    """Raise ``IntegrationError`` (one line) at the first seam of ``library`` that is not as written for."""
    for seam in seams:
        problem = seam.problem()
        if problem is not None:
            raise IntegrationError(
                f"{library} {installed(library)} is not what Halo was written for ({problem}); "
                f"install {library}{SUPPORTED[library]}, the range Halo supports")
