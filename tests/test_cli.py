"""The `halo` command as a user runs it: a fresh interpreter, real entry points, real pip installs."""

import json
import shlex
import subprocess
import sys

import pytest

from conftest import run_halo

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

JSON_KEYS = {"name", "distribution", "version", "model_types", "splits", "status", "error"}


def listing(**env):
    result = run_halo("families", "list", "--json", env=env)
    assert result.returncode == 0, result.stderr
    return {row["name"]: row for row in json.loads(result.stdout)}


def test_version_and_help_on_every_command():
    assert run_halo("--version").stdout.strip().startswith("halo ")
    for command in ([], ["families"], ["families", "list"], ["families", "show"], ["new-family"]):
        result = run_halo(*command, "--help")
        assert result.returncode == 0 and "Usage" in result.stdout, (command, result.stderr)


def test_list_json_shows_the_bundled_families():
    rows = listing()
    for name, model_type in (("qwen3-moe", "qwen3_moe"), ("gpt-oss", "gpt_oss")):
        assert set(rows[name]) == JSON_KEYS
        assert rows[name]["model_types"] == [model_type] and rows[name]["status"] == "ok" and rows[name]["error"] is None
        assert rows[name]["splits"] == ["cp", "ep", "etp", "tp"]


def test_list_table_has_the_matrix_and_the_plain_route_footer_with_whole_names_in_a_narrow_pipe():
    """Captured output is a pipe (a CI log): every name is printed whole, however narrow COLUMNS says it is."""
    result = run_halo("families", "list", env={"COLUMNS": "60"})
    assert result.returncode == 0
    assert "FSDP2 route" in result.stdout and "…" not in result.stdout
    cells = {cell.strip() for line in result.stdout.splitlines() for cell in line.split("│")}
    for name, row in listing().items():
        assert {name, row["distribution"], ", ".join(row["model_types"])} <= cells, name


def test_broken_plugin_is_listed_and_strict_fails(plugin_site):
    plugin_site.add("halo-plugin-broken", "raise ImportError('no such kernel')\n", entry="broken")
    rows = listing()
    assert rows["broken"]["status"] == "broken" and "no such kernel" in rows["broken"]["error"]
    assert rows["qwen3-moe"]["status"] == "ok"
    assert run_halo("families", "list", "--strict").returncode == 1
    assert run_halo("families", "list", "--json", env={"HALO_STRICT_PLUGINS": "1"}).returncode == 1


def test_strict_passes_when_nothing_is_broken():
    assert run_halo("families", "list", "--strict").returncode == 0


def test_duplicate_claim_shows_in_the_listing(plugin_site):
    plugin_site.add_family("halo-plugin-other-qwen", "other-qwen", ("qwen3_moe",))
    rows = listing()
    assert rows["qwen3-moe"]["status"] == "broken"
    assert "also claimed by halo-plugin-other-qwen" in rows["qwen3-moe"]["error"]
    assert rows["gpt-oss"]["status"] == "ok"


def test_disable_env_hides_a_plugin():
    assert "gpt-oss" not in listing(HALO_DISABLE_PLUGINS="gpt-oss")


def test_show_names_the_modules_the_hooks_would_wrap():
    result = run_halo("families", "show", "qwen3-moe", "--json")
    assert result.returncode == 0, result.stderr
    details = json.loads(result.stdout)
    wrapped = details["wrapped"]["qwen3_moe"]
    assert wrapped["wrap_moe_block"] == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert wrapped["wrap_attention"] == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert details["hooks_implemented"] == ["halo_family"]
    text = run_halo("families", "show", "gpt-oss")
    assert text.returncode == 0 and "model.layers.1.mlp" in text.stdout


def test_show_unknown_family_exits_2_listing_known_names():
    result = run_halo("families", "show", "nope")
    assert result.returncode == 2
    assert "no family named 'nope'; known families: " in result.stderr
    assert "gpt-oss" in result.stderr and "qwen3-moe" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["9lives", "--model-type", "olmoe"], "family name '9lives' is not valid"),
        (["Bad", "--model-type", "olmoe"], "family name 'Bad' is not valid"),
        (["class", "--model-type", "olmoe"], "family name 'class' is not valid"),
        (["fine", "--model-type", "olmoo"], "model type 'olmoo' is unknown"),
        # The bundled olmoe plugin claims olmoe: a second claimant would break both.
        (["mine", "--model-type", "olmoe"], "model type 'olmoe' is already claimed by the installed plugin 'olmoe' (halo-plugin-olmoe); "
                                            "scaffold another model type, or pass --replace olmoe"),
        (["mine", "--model-type", "olmoe", "--replace", "mixtral"], "model type 'olmoe' is already claimed by the installed plugin 'olmoe'"),
        (["mine", "--model-type", "solar_open", "--replace", "olmoe"], "--replace olmoe: no installed plugin claims model type 'solar_open'"),
    ],
)
def test_new_family_refusals(tmp_path, args, needle):
    result = run_halo("new-family", *args, "--output-dir", str(tmp_path))
    assert result.returncode == 2 and needle in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_new_family_refuses_an_existing_target(tmp_path):
    (tmp_path / "halo-plugin-fine").mkdir()
    result = run_halo("new-family", "fine", "--model-type", "olmoe", "--output-dir", str(tmp_path))
    assert result.returncode == 2 and "already exists" in result.stderr


def test_new_family_with_unknown_model_type_when_allowed(tmp_path):
    result = run_halo("new-family", "custom", "--model-type", "my_custom_moe", "--output-dir", str(tmp_path), "--allow-unknown-model-type")
    assert result.returncode == 0, result.stderr
    source = (tmp_path / "halo-plugin-custom" / "halo_plugin_custom" / "__init__.py").read_text()
    assert "could not build a tiny model" in source and "model_types=('my_custom_moe',)" in source


def test_new_family_replace_writes_a_plugin_to_install_instead_with_this_environments_pip(tmp_path):
    result = run_halo("new-family", "my-olmoe", "--model-type", "olmoe", "--replace", "halo-plugin-olmoe", "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    project = tmp_path / "halo-plugin-my-olmoe"
    pip = f"{sys.executable} -m pip"
    assert f"next: {pip} uninstall -y halo-plugin-olmoe && {pip} install -e {project} && {sys.executable} -m halo_cli families show my-olmoe" in result.stdout
    assert "meant to be installed instead of `halo-plugin-olmoe`" in (project / "README.md").read_text()
    assert "model_types=('olmoe',)" in (project / "halo_plugin_my_olmoe" / "__init__.py").read_text()


def test_scaffold_installs_with_pip_is_listed_and_its_tests_pass(tmp_path, plugin_site):
    # agent-docs/plugin-contract.md's example: a MoE type no bundled plugin claims.
    result = run_halo("new-family", "my-moe", "--model-type", "solar_open", "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    project = tmp_path / "halo-plugin-my-moe"
    assert f"next: {sys.executable} -m pip install -e {project} && {sys.executable} -m halo_cli families show my-moe" in result.stdout
    source = (project / "halo_plugin_my_moe" / "__init__.py").read_text()
    assert "router='gate'" in source and "SolarOpenForCausalLM" in source and "splits=frozenset({'ep'})" in source
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(plugin_site.root), str(project)],
        capture_output=True, text=True,
    )
    assert install.returncode == 0, install.stderr
    rows = listing()
    assert rows["my-moe"]["status"] == "ok" and rows["my-moe"]["distribution"] == "halo-plugin-my-moe"
    assert rows["my-moe"]["model_types"] == ["solar_open"]
    show = subprocess.run(shlex.split(result.stdout.splitlines()[-1].split(" && ")[-1]), capture_output=True, text=True)  # as printed, no PATH needed
    assert show.returncode == 0 and "solar_open" in show.stdout, show.stdout + show.stderr
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(project / "tests")],
        capture_output=True, text=True, cwd=project,
    )
    assert tests.returncode == 0 and "1 passed" in tests.stdout, tests.stdout + tests.stderr


def test_the_cli_imports_no_torch_until_a_command_needs_it():
    """`halo --help` and `halo families list` stay quick: the launcher's modules import torch only inside their checks."""
    probe = "import sys, halo_cli.main; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr
