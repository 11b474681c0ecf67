"""Halo core: parallel layouts for unmodified Hugging Face models, extended by family plugins.

Importing this package is cheap (no torch): the CLI lists plugins without loading a model.
"""

from halo_core.family import PLUGIN_API_VERSION, SPLITS, Family
from halo_core.hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = ["PLUGIN_API_VERSION", "SPLITS", "Family", "hookimpl", "__version__"]
