"""The seams Halo leans on in transformers, TRL and PEFT are checked at import, and fail in one line (issue 48)."""

import importlib
import re
import sys
import tomllib
from pathlib import Path

import pytest

from halo_core import integrations
from halo_core.integrations import IntegrationError, Seam

ROOT = Path(__file__).resolve().parents[1]


def test_the_installed_libraries_have_every_seam():
    for name in ("transformers", "trl", "peft", "accelerate"):
        module = importlib.import_module(f"halo_core.integrations.{name}")
        assert all(seam.problem() is None for seam in module.SEAMS), name


def test_a_changed_seam_signature_fails_at_import_in_one_line(monkeypatch):
    """A release that renames a parameter of a method the mixin overrides must stop the import, naming the
    installed version and the supported range, not break deep in a step."""
    import transformers

    def _save_checkpoint(self, model, trial_or_metrics):  # what a new release might do
        pass

    monkeypatch.setattr(transformers.Trainer, "_save_checkpoint", _save_checkpoint)
    monkeypatch.delitem(sys.modules, "halo_core.integrations.transformers")
    with pytest.raises(IntegrationError) as info:
        importlib.import_module("halo_core.integrations.transformers")
    message = str(info.value)
    assert "\n" not in message
    assert f"transformers {transformers.__version__} is not what Halo was written for" in message
    assert "transformers.Trainer._save_checkpoint(model, trial_or_metrics) where Halo was written for (model, trial)" in message
    assert f"install transformers{integrations.SUPPORTED['transformers']}" in message
    monkeypatch.undo()
    importlib.import_module("halo_core.integrations.transformers")  # the real one imports again


@pytest.mark.parametrize("seam, problem", [
    (Seam("trl.trainer.dpo_trainer", "hash_modules", ("module",)), "no trl.trainer.dpo_trainer.hash_modules"),
    (Seam("trl:GRPOTrainer", "_buffered_input", assigned_in=True), "trl.GRPOTrainer._buffered_input is never assigned"),
    (Seam("trl:GRPOTrainer", "_compute_loss", ("model",)), None),  # further parameters without defaults are a change
    (Seam("accelerate:Accelerator", "prepare_model", reads="_is_halo_prepared"),
     "accelerate.Accelerator.prepare_model no longer reads _is_halo_prepared"),
])
def test_each_kind_of_seam_names_what_differs(seam, problem):
    found = seam.problem()
    if problem is None:
        assert found == "trl.GRPOTrainer._compute_loss(model, inputs) where Halo was written for (model)"
    else:
        assert found == problem


def test_pyproject_declares_the_supported_ranges():
    """The ranges in the one-line failure are the ones pip enforces."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {m[1]: m[2] for d in deps if (m := re.match(r"([a-z-]+)(.*)", d))}
    for library, supported in integrations.SUPPORTED.items():
        assert declared[library] == supported, library


def test_the_launcher_meets_a_changed_seam_before_any_process_starts(monkeypatch):
    """``halo launch`` looks its method up first (``get_method``), which imports the mixin and so the check: a
    HaloError, which the CLI prints as one line with exit 2."""
    import transformers

    from halo_core.errors import HaloError
    from halo_core.registry import reset_caches
    from halo_core.trainers.method import get_method

    monkeypatch.setattr(transformers.Trainer, "_load_rng_state", lambda self, checkpoint, strict: None)
    for name in ("halo_core.integrations.transformers", "halo_core.trainers.mixin", "halo_core.methods.sft"):
        monkeypatch.delitem(sys.modules, name, raising=False)
        parent, _, child = name.rpartition(".")  # `from parent import child` reads the parent's attribute first
        if parent in sys.modules:
            monkeypatch.delattr(sys.modules[parent], child, raising=False)
    reset_caches()
    try:
        with pytest.raises(HaloError, match=r"Trainer\._load_rng_state\(checkpoint, strict\) where Halo was written for \(checkpoint\)"):
            get_method("sft")
    finally:
        monkeypatch.undo()
        reset_caches()
