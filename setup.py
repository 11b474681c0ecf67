"""The one thing pyproject.toml cannot say: find every package under halo_core/ and halo_cli/, so a new
subpackage ships without an edit here, and every folder of templates/ under halo_cli.templates (the name
pyproject.toml's package-dir gives it). A ``packages.find`` table names packages after their folders, so
it cannot find templates/ under the CLI's name; its folders are data, listed so setuptools ships them."""

from setuptools import find_namespace_packages, find_packages, setup

templates = ["halo_cli.templates", *(f"halo_cli.templates.{name}" for name in find_namespace_packages("templates", exclude=["*__pycache__*"]))]
setup(packages=[*find_packages(include=["halo_core", "halo_core.*", "halo_cli", "halo_cli.*"]), *templates])
