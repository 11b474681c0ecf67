"""Pages generated from the code stay in sync with it."""

import dataclasses
import re
from pathlib import Path

from halo_core.trainers.arguments import HaloArguments

ROOT = Path(__file__).resolve().parents[1]


def test_configuration_page_lists_exactly_halos_fields():
    page = (ROOT / "agent-docs" / "configuration.md").read_text()
    table = page.split("<!-- halo-fields")[1].split("\n\n")[0]
    documented = re.findall(r"^\| `(\w+)` \|", table, flags=re.M)
    assert documented == [f.name for f in dataclasses.fields(HaloArguments)]


def test_support_matrix_page_matches_the_registry():
    from halo_core.matrix import render
    from halo_core.registry import discover

    committed = (ROOT / "agent-docs" / "models" / "index.md").read_text()
    assert committed == render(discover(strict=False)), "run: halo families matrix --write agent-docs/models/index.md"


def test_lines_of_code_skip_blanks_comments_and_docstrings():
    from halo_core.matrix import lines_of_code

    source = '"""Module doc\\nspanning lines."""\n\n# a comment\nimport os  # trailing\n\n\ndef f():\n    """Doc."""\n    return (1,\n            2)\n'
    assert lines_of_code(source) == 4


def test_a_split_only_some_model_types_have_is_named_per_type():
    from halo_core.matrix import split_marks
    from halo_core.registry import discover

    registry = discover(strict=False)
    # GLM-4.7-Flash's latent attention has no TP plan: its plugin drops tp for that model type only
    assert split_marks(registry, registry.by_name("glm4-moe")) == ["yes", "yes", "`glm4_moe`", "yes"]
