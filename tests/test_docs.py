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


def test_plugin_contract_page_matches_the_hookspecs_and_dataclasses():
    from halo_core.contract_doc import update_page

    committed = (ROOT / "agent-docs" / "plugin-contract.md").read_text()
    assert committed == update_page(committed), "run: halo families contract --write agent-docs/plugin-contract.md"


def test_every_hookspec_is_annotated():
    import inspect

    from halo_core.contract_doc import hook_specs

    specs = hook_specs()
    assert [s.__name__ for s in specs] == ["halo_family", "supported_splits", "wrap_moe_block", "wrap_attention", "shard_tp"]
    for spec in specs:
        signature = inspect.signature(spec)
        assert signature.return_annotation is not signature.empty, spec.__name__
        assert all(p.annotation is not p.empty for p in signature.parameters.values()), spec.__name__


def test_a_field_without_a_meaning_is_refused():
    from dataclasses import dataclass

    import pytest

    from halo_core.contract_doc import render_fields

    @dataclass
    class Declared:
        #: Documented.
        first: int
        second: int = 0

    with pytest.raises(ValueError, match=r"\['second'\]"):
        render_fields(Declared)


def test_halo_families_contract_rewrites_only_the_marked_sections(tmp_path):
    from conftest import run_halo

    from halo_core.contract_doc import BEGIN, END

    committed = (ROOT / "agent-docs" / "plugin-contract.md").read_text()
    stale = tmp_path / "plugin-contract.md"
    begin, end = BEGIN.format(name="context"), END.format(name="context")
    stale.write_text(committed.split(begin)[0] + begin + "\nstale\n" + end + committed.split(end)[1])
    assert run_halo("families", "contract", "--write", str(stale)).returncode == 0
    assert stale.read_text() == committed
    unmarked = tmp_path / "unmarked.md"
    unmarked.write_text("# no markers\n")
    refused = run_halo("families", "contract", "--write", str(unmarked))
    assert refused.returncode == 2 and "halo-contract:family" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1


def test_the_lora_page_names_every_registered_method():
    """lora.md's opening list of methods is written by hand beside the generated matrix, which gives every method a
    LoRA column: a method added without it would leave the page claiming fewer."""
    from halo_core.trainers.method import known_methods

    named = re.search(r"`halo launch ([a-z|-]+)`", (ROOT / "agent-docs" / "lora.md").read_text())
    assert named and sorted(named[1].split("|")) == known_methods(), named and named[1]


def test_method_matrix_page_matches_the_registered_methods():
    from halo_core.matrix import render_methods

    committed = (ROOT / "agent-docs" / "methods" / "index.md").read_text()
    assert committed == render_methods(), "run: halo methods matrix --write agent-docs/methods/index.md"


def test_every_registered_method_has_its_page():
    from halo_core.trainers.method import known_methods

    assert sorted(p.stem for p in (ROOT / "agent-docs" / "methods").glob("*.md") if p.stem != "index") == known_methods()
