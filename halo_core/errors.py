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
    """A family declaration does not match the model it should adapt."""


class ConfigError(HaloError):
    """A run configuration that cannot work: the message names the key, the value and the fix."""
