"""bench/sft_vs_trl.py's variant names: what each option asks for, and typos refused before any row runs."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "sft_vs_trl.py"


@pytest.fixture(scope="module")
def harness():
    spec = importlib.util.spec_from_file_location("sft_vs_trl", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_experiment_switch_travels_as_an_environment_variable(harness):
    spec = harness.parse("halo-ep2+compile+unit8+env.HALO_EP_OVERLAP=1")
    assert spec["environment"] == {"HALO_EP_OVERLAP": "1"}
    assert (spec["ep"], spec["compile"], spec["unit_layers"]) == (2, True, 8)
    assert harness.parse("halo-ep2+compile")["environment"] == {}


@pytest.mark.parametrize("variant", ["halo-ep2+env.HALO_EP_OVERLAP", "halo-ep2+compiled"])
def test_an_unknown_option_is_refused(harness, variant):
    with pytest.raises(SystemExit, match="unknown variant"):
        harness.parse(variant)
