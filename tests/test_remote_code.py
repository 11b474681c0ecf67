"""Models that ship their own modeling code (``halo_core/remote_code.py``): refused without ``trust_remote_code``,
scaffolded into a plugin from their folder, and trained with the key, EP=2 equal to one process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import run_halo
from launch_kit import COMMON, uneven_rows
from remote_kit import CODE_FILES, MODEL_TYPE, TINY, write_remote_model

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)


@pytest.fixture(scope="module")
def remote_model(tmp_path_factory) -> Path:
    return write_remote_model(tmp_path_factory.mktemp("remote") / "model")


def _run_yaml(folder: Path, model: Path, extra: str = "") -> Path:
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in uneven_rows("completion")))
    config = folder / "run.yaml"
    config.write_text(f"model_name_or_path: {model}\ndataset:\n  - path: rows.jsonl\n{extra}")
    return config


def test_refused_before_start_without_the_key(tmp_path, remote_model):
    result = run_halo("launch", "sft", str(_run_yaml(tmp_path, remote_model)), "--dry-run")
    assert result.returncode == 2
    line = result.stderr.strip().splitlines()[-1]
    assert f"model_name_or_path '{remote_model}' ships its own modeling code" in line and "trust_remote_code: true" in line, result.stderr


@pytest.mark.parametrize("method", ["distill", "classify"])
def test_every_method_and_the_teacher_ask_for_the_key(tmp_path, remote_model, method):
    from halo_core import remote_code
    from halo_core.errors import ConfigError
    from halo_core.trainers.method import get_method
    from halo_core.trainers.run_config import load_run_config

    model, key = (TINY, "teacher_model_name_or_path") if method == "distill" else (remote_model, "model_name_or_path")
    extra = f"teacher_model_name_or_path: {remote_model}\n" if method == "distill" else "num_labels: 3\n"
    config = _run_yaml(tmp_path, model, extra)
    run = load_run_config(method, get_method(method).config_class, config)
    with pytest.raises(ConfigError, match=f"{key} '{remote_model}' ships its own modeling code"):
        remote_code.admit(run)
    trusted = load_run_config(method, get_method(method).config_class, config, {"trust_remote_code": True})
    remote_code.admit(trusted)  # registers the folder's classes: transformers now builds the type
    from transformers import AutoConfig

    assert type(AutoConfig.from_pretrained(remote_model)).__name__ == "HaloRemoteMoeConfig"


def test_a_known_model_type_keeps_transformers_classes(tmp_path):
    """transformers runs a folder's code only for a type it does not know: ``auto_map`` beside a known type needs no key."""
    from halo_core import remote_code

    config = json.loads((TINY / "config.json").read_text())
    assert not remote_code.ships_code({**config, "auto_map": {"AutoConfig": "configuration_x.XConfig"}})
    assert remote_code.ships_code({**config, "model_type": MODEL_TYPE, "auto_map": {"AutoConfig": "configuration_x.XConfig"}})


#: The generated conformance test's limit: about a minute on a loaded 2-core machine; a hung rank fails it here.
CONFORMANCE_TIMEOUT_S = 300


def test_new_family_from_the_folder_ships_and_registers_its_code(tmp_path, remote_model, plugin_site):
    """The model type read from the folder; its code copied into the plugin, which registers it once installed, and
    the generated conformance test passes unedited. transformers gives the remote classes eager experts (it looks for
    ``@use_experts_implementation`` in their own file), whose loop leaves a rank that receives no rows off the
    backward's exchange: the kit's starved rank at ep=4 hung there until the core tied its zeros to the rows."""
    result = run_halo("new-family", "remote-moe", "--model-dir", str(remote_model), "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    project = tmp_path / "halo-plugin-remote-moe"
    package = project / "halo_plugin_remote_moe"
    assert all((package / name).read_text() == (remote_model / name).read_text() for name in CODE_FILES)
    source = (package / "__init__.py").read_text()
    assert f"model_types=({MODEL_TYPE!r},)" in source and "splits=frozenset({'ep'})" in source and "router='gate'" in source
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(plugin_site.root), str(project)],
        capture_output=True, text=True,
    )
    assert install.returncode == 0, install.stderr
    listed = run_halo("families", "list", "--json")
    row = {r["name"]: r for r in json.loads(listed.stdout)}["remote-moe"]
    assert row["status"] == "ok" and row["model_types"] == [MODEL_TYPE], row
    probe = subprocess.run([sys.executable, "-c", "from halo_core.registry import discover; discover(); "
                            "from transformers import AutoConfig; print(type(AutoConfig.for_model('halo_remote_moe')).__module__)"],
                           capture_output=True, text=True)
    assert probe.stdout.strip() == "halo_plugin_remote_moe.configuration_halo_remote_moe", probe.stderr
    kit = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(project / "tests")], cwd=project,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = kit.communicate(timeout=CONFORMANCE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(kit.pid, signal.SIGKILL)  # its ranks too: they share its session
        output, _ = kit.communicate()
        pytest.fail(f"the generated conformance test hung past {CONFORMANCE_TIMEOUT_S} s:\n{output[-3000:]}")
    assert kit.returncode == 0 and "1 passed" in output, output[-3000:]


def test_trains_at_ep2_equal_to_one_process_and_saves_its_code(tmp_path, remote_model, plugin_site):
    plugin_site.add_family("halo-plugin-remote", "remote", (MODEL_TYPE,))
    config = _run_yaml(tmp_path, remote_model, "trust_remote_code: true\nmax_length: 48\n")
    outputs = {}
    for nproc, extra in ((1, []), (2, ["--expert_parallel_size=2"])):
        out = tmp_path / f"out{nproc}"
        command = [sys.executable, "-m", "halo_cli", "launch", "sft", str(config), "--nproc", str(nproc), "--", f"--output_dir={out}",
                   f"--per_device_train_batch_size={4 // nproc}", "--optim=sgd", "--learning_rate=0.5", "--save_strategy=no",
                   *[a for a in COMMON if not a.startswith(("--save_", "--max_steps"))], "--max_steps=2", *extra]
        result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        outputs[nproc] = out
    for name in CODE_FILES:  # save_pretrained copies the model's own code, and auto_map names it
        assert (outputs[2] / name).read_text() == (remote_model / name).read_text()
    assert json.loads((outputs[2] / "config.json").read_text())["auto_map"]["AutoModelForCausalLM"].endswith("HaloRemoteMoeForCausalLM")
    from safetensors.torch import load_file

    one, two = (load_file(outputs[n] / "model.safetensors") for n in (1, 2))
    start = load_file(remote_model / "model.safetensors")
    assert one.keys() == two.keys() == start.keys()
    assert any(not torch.equal(one[k], start[k]) for k in one)  # it trained
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-5, msg=lambda m: f"{key}: {m}")
