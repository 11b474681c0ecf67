"""Errors a user can act on: each message names what is wrong and how to fix it."""


class HaloError(Exception):
    """Base of every error Halo raises on purpose (the CLI prints these without a traceback)."""


class DuplicateClaimError(HaloError):
    """Two installed plugins claim the same transformers model type."""


class UnknownFamilyError(HaloError):
    """A family name that no installed plugin declares."""


class BrokenPluginError(HaloError):
    """Strict mode found a plugin that failed to load."""


class LayoutError(HaloError):
    """A layout that cannot work: degrees that do not fit, or a family declaration that does not match the model.

    ``fields``: the ``ParallelConfig`` fields whose values it refuses, so a caller can act on them (or name them in its
    own words) without reading the message."""

    def __init__(self, message: str = "", fields: tuple[str, ...] = ()):
        super().__init__(message)
        self.fields = tuple(fields)


class WorldSizeError(LayoutError):
    """Degrees whose product does not fit the number of processes: fixed by other degrees or by another world size."""


class ConfigError(HaloError):
    """A run configuration that cannot work: the message names the key, the value and the fix."""
