"""Finds family plugins through the ``halo.families`` entry-point group and dispatches hooks by model type.

Nothing here lists families by hand. A plugin that fails to import, to register or to
declare itself is recorded as broken with the reason, and every other family keeps
working. Two plugins claiming one model type are both marked broken and that model
type refuses to resolve, naming both distributions: load order never decides.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from types import SimpleNamespace
from typing import Any

import pluggy

from halo_core import defaults, hookspecs
from halo_core.errors import BrokenPluginError, DuplicateClaimError, UnknownFamilyError
from halo_core.family import PLUGIN_API_VERSION, Family, api_version_tuple

ENTRY_POINT_GROUP = "halo.families"
DISABLE_ENV = "HALO_DISABLE_PLUGINS"
STRICT_ENV = "HALO_STRICT_PLUGINS"
_HOOKS = ("supported_splits", "wrap_moe_block", "wrap_attention", "shard_tp")


@dataclass
class PluginRecord:
    """One entry point of the ``halo.families`` group and what became of it."""

    entry_point: str
    distribution: str
    version: str
    family: Family | None = None
    plugin: Any = None
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.family is not None and not self.errors

    @property
    def name(self) -> str:
        return self.family.name if self.family else self.entry_point

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.family.version if self.family else self.version,
            "model_types": list(self.family.model_types) if self.family else [],
            "splits": sorted(self.family.splits) if self.family else [],
            "status": "ok" if self.ok else "broken",
            "error": "; ".join(self.errors) if self.errors else None,
        }


def strict_from_env() -> bool:
    return os.environ.get(STRICT_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def _disabled_from_env() -> set[str]:
    return {n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()}


class Registry:
    """The installed families, keyed by the model types they claim."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.pm.register(defaults, name="halo-core-defaults")
        self.records: list[PluginRecord] = []
        self._claims: dict[str, list[PluginRecord]] = {}
        #: Model types whose plugin is broken by a misspelt hook: they refuse to resolve rather than fall back to the
        #: plain route, which would train the model without the hooks its plugin meant to give it.
        self._broken_claims: dict[str, PluginRecord] = {}

    # -- discovery -------------------------------------------------------------------

    def load(self, eps: list[EntryPoint]) -> None:
        disabled = _disabled_from_env()
        for ep in sorted(eps, key=lambda e: e.name):
            dist = ep.dist.name if ep.dist else "?"
            if {ep.name, dist} & disabled:
                continue
            record = PluginRecord(ep.name, dist, ep.dist.version if ep.dist else "?")
            self.records.append(record)
            self._load_one(ep, record)
        self._mark_duplicate_claims()

    def _load_one(self, ep: EntryPoint, record: PluginRecord) -> None:
        try:
            record.plugin = ep.load()
        except Exception as exc:  # a broken plugin must not break the program
            record.errors.append(f"import failed: {type(exc).__name__}: {exc}")
            return
        try:
            self.pm.register(record.plugin, name=f"{record.distribution}:{ep.name}")
        except Exception as exc:
            record.errors.append(f"invalid hook implementation: {exc}")
            return
        try:
            # A hookimpl whose name no hookspec has (a misspelt `wrap_moe_blok`) registers without complaint, and the
            # core's default would run in its place; pluggy names it here.
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            record.errors.append(f"{exc}: not a Halo hook (known: halo_family, {', '.join(_HOOKS)})")
            self.pm.unregister(record.plugin)
            self._claim_broken(record)
            return
        try:
            family = self._own_caller(record, "halo_family")()
            family = family[0] if family else None
        except Exception as exc:
            record.errors.append(f"halo_family() failed: {type(exc).__name__}: {exc}")
            family = None
        if record.errors:
            self.pm.unregister(record.plugin)
            return
        if not isinstance(family, Family):
            record.errors.append(f"halo_family() returned {type(family).__name__}, expected halo_core.Family")
        else:
            self._check_api_version(family, record)
        if record.errors:
            self.pm.unregister(record.plugin)
            return
        record.family = family
        for model_type in family.model_types:
            self._claims.setdefault(model_type, []).append(record)

    @staticmethod
    def _check_api_version(family: Family, record: PluginRecord) -> None:
        """Same major and a minor up to the core's loads (an older minor with a FutureWarning); anything else is broken."""
        (major, minor), (core_major, core_minor) = api_version_tuple(family.api_version), api_version_tuple(PLUGIN_API_VERSION)
        if major != core_major or minor > core_minor:
            record.errors.append(
                f"written for plugin API {family.api_version}, this halo-core speaks {PLUGIN_API_VERSION} "
                f"(it loads plugins of API {core_major}.0 to {PLUGIN_API_VERSION}): install a {record.distribution} "
                f"release built for plugin API {PLUGIN_API_VERSION}"
            )
        elif minor < core_minor:
            warnings.warn(
                f"{record.distribution} was written for plugin API {family.api_version}; this halo-core speaks "
                f"{PLUGIN_API_VERSION} and still loads it, but support for older minors ends at the next major: "
                f"install a release built for plugin API {PLUGIN_API_VERSION}",
                FutureWarning, stacklevel=2,
            )

    def _claim_broken(self, record: PluginRecord) -> None:
        try:
            family = record.plugin.halo_family()
        except Exception:  # the declaration is read only to name the claimed types; the record is broken anyway
            return
        for model_type in getattr(family, "model_types", ()):
            self._broken_claims[model_type] = record

    def _mark_duplicate_claims(self) -> None:
        for model_type, claimants in self._claims.items():
            if len(claimants) > 1:
                for record in claimants:
                    others = ", ".join(c.distribution for c in claimants if c is not record)
                    record.errors.append(f"model type {model_type!r} is also claimed by {others}")

    def _own_caller(self, record: PluginRecord, hook: str):
        """A hook caller that reaches only this plugin and the core's defaults."""
        others = [p for p in self.pm.get_plugins() if p is not record.plugin and p is not defaults]
        return self.pm.subset_hook_caller(hook, remove_plugins=others)

    # -- lookup ----------------------------------------------------------------------

    def family_record(self, model_type: str) -> PluginRecord | None:
        """The plugin that claims ``model_type``, or ``None`` for the plain FSDP2 route."""
        claimants = self._claims.get(model_type, [])
        if model_type in self._broken_claims:
            record = self._broken_claims[model_type]
            raise BrokenPluginError(f"model type {model_type!r} is claimed by {record.distribution}, which is broken: "
                                    f"{'; '.join(record.errors)}; fix the plugin or disable it with {DISABLE_ENV}={record.name}")
        if len(claimants) > 1:
            names = " and ".join(c.distribution for c in claimants)
            raise DuplicateClaimError(
                f"model type {model_type!r} is claimed by both {names}; uninstall one of them "
                f"or disable one with {DISABLE_ENV}=<name>"
            )
        return claimants[0] if claimants else None

    def by_name(self, name: str) -> PluginRecord:
        for record in self.records:
            if name in {record.name, record.entry_point, record.distribution}:
                return record
        known = ", ".join(sorted(r.name for r in self.records)) or "none installed"
        raise UnknownFamilyError(f"no family named {name!r}; known families: {known}")

    def hooks(self, record: PluginRecord) -> SimpleNamespace:
        """The layout hooks as this family answers them (its own first, then the core's defaults)."""
        return SimpleNamespace(**{h: self._own_caller(record, h) for h in _HOOKS})

    def overridden_hooks(self, record: PluginRecord) -> list[str]:
        """Names of the hooks this plugin implements itself."""
        return [h for h in ("halo_family", *_HOOKS) if any(i.plugin is record.plugin for i in getattr(self.pm.hook, h).get_hookimpls())]

    def supported_splits(self, record: PluginRecord, model_type: str) -> frozenset[str]:
        return frozenset(self.hooks(record).supported_splits(family=record.family, model_type=model_type))

    @property
    def broken(self) -> list[PluginRecord]:
        return [r for r in self.records if not r.ok]


def discover(strict: bool | None = None) -> Registry:
    """Load every installed family plugin. With ``strict`` (or ``HALO_STRICT_PLUGINS=1``) a broken one raises.

    Loaded once per process (a launch asks from about eight places) and per plugin view: the cache is keyed on
    ``HALO_DISABLE_PLUGINS`` and ``sys.path``; ``reset_caches()`` drops it where plugins are installed meanwhile (tests).
    """
    registry = _discover(os.environ.get(DISABLE_ENV, ""), tuple(sys.path))
    if (strict_from_env() if strict is None else strict) and registry.broken:
        reasons = "; ".join(f"{r.name} ({r.distribution}): {'; '.join(r.errors)}" for r in registry.broken)
        raise BrokenPluginError(f"broken family plugins in strict mode: {reasons}")
    return registry


@functools.cache
def _discover(disabled: str, path: tuple[str, ...]) -> Registry:
    """The registry of the installed plugins; the arguments are only the cache's key (``discover`` passes them)."""
    registry = Registry()
    registry.load(list(entry_points(group=ENTRY_POINT_GROUP)))
    return registry


def reset_caches() -> None:
    """Forget the discovered plugins and the loaded methods, so the next lookup scans the entry points again."""
    from halo_core.trainers.method import _load_method

    _discover.cache_clear()
    _load_method.cache_clear()
