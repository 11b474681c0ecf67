"""bench/sft_vs_trl.py's variant names: what each option asks for, and typos refused before any row runs."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "sft_variants.py"


@pytest.fixture(scope="module")
def harness():
    spec = importlib.util.spec_from_file_location("sft_variants", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_experiment_switch_travels_as_an_environment_variable(harness):
    spec = harness.parse("halo-ep2+compile+unit8+env.HALO_EP_OVERLAP=1")
    assert spec["environment"] == {"HALO_EP_OVERLAP": "1"}
    assert (spec["ep"], spec["compile"], spec["unit_layers"]) == (2, True, 8)
    assert harness.parse("halo-ep2+compile")["environment"] == {}


@pytest.mark.parametrize("variant", ["halo-ep2+env.HALO_EP_OVERLAP", "halo-ep2+compiled", "halo-ep2+tree.", "halo-ep2+tree.a+tree.b"])
def test_an_unknown_option_is_refused(harness, variant):
    with pytest.raises(SystemExit, match="unknown variant"):
        harness.parse(variant)


def test_a_tree_row_imports_that_checkouts_halo_core(harness, tmp_path):
    """``python -m`` puts the working directory first on the path: a row started elsewhere would import
    the installed halo_core whatever PYTHONPATH says."""
    (tmp_path / "halo_core").mkdir()
    (tmp_path / "halo_core" / "__init__.py").write_text("VERSION = 'the other checkout'\n")
    (tmp_path / "probe.py").write_text("import halo_core\nprint(getattr(halo_core, 'VERSION', 'installed'))\n")
    spec = harness.parse("halo-ep2+compile+tree.other")
    assert (spec["tree"], spec["compile"]) == ("other", True)
    env, cwd = harness.row_process(spec, {"other": tmp_path})
    assert cwd == tmp_path.resolve()
    done = subprocess.run([sys.executable, "-m", "probe"], env=env, cwd=cwd, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "the other checkout"  # halo launch rows: python -m halo_cli
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "probe.py").write_text((tmp_path / "probe.py").read_text())
    done = subprocess.run([sys.executable, str(elsewhere / "probe.py")], env=env, cwd=cwd, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "the other checkout"  # --profile rows: this script by its path, which leads sys.path
    env, cwd = harness.row_process(harness.parse("halo-ep2+compile"), {"other": tmp_path})
    assert cwd is None and env.get("PYTHONPATH", "").split(":")[0] != str(tmp_path.resolve())


def test_a_tree_row_without_its_checkout_or_on_a_trl_row_is_refused(harness):
    with pytest.raises(SystemExit, match="add --tree other=DIR"):
        harness.row_process(harness.parse("halo-ep2+tree.other"), {})
    with pytest.raises(SystemExit, match="Halo options"):
        harness.parse("trl-bf16+tree.other")


def test_overlap_and_cudnn_rows_are_halo_options_and_overlap_needs_replicated(harness):
    spec = harness.parse("halo-ep1+compile+replicated+overlap+cudnn")
    assert (spec["overlap"], spec["cudnn"], spec["replicated"]) == (True, True, True)
    with pytest.raises(SystemExit, match=r"\+overlap \(overlap_optimizer_step\) needs \+replicated"):
        harness.parse("halo-ep1+compile+overlap")
    with pytest.raises(SystemExit, match="are Halo options"):
        harness.parse("trl-bf16+cudnn")


def test_a_halo_rows_wrapped_logs_are_read_whole():
    """Halo's console wraps a log at 120 columns (``parts/console``): the bench reads each log back as one dict."""
    sys.path.insert(0, str(SCRIPT.parent))
    from sft_halo_row import halo_result

    from halo_core.trainers.parts.console import console_text

    log = {"loss": "2.5", "grad_norm": "1.368e-05", "learning_rate": "7.333e-06", "tokens_per_second_per_device": "2475",
           "peak_memory_gib_per_device": "30.1", "mfu": "0.3", "epoch": "0.5", "moe/imbalance": "1.2"}
    text = "\n".join(console_text({**log, "tokens_per_second_per_device": str(1000 * (i + 1))}) for i in range(8))
    assert "\n " in text  # wrapped
    row = halo_result(text, 4096, 1, 1)
    assert row["tokens_per_s"] == 7000 and row["losses"] == [2.5] * 8 and row["peak_gib"] == 30.1
