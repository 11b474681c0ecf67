"""`halo launch sft` on every split and the combinations the qwen3-moe family declares, with samples of
different lengths (so every batch is padded and every pool of a CP x TP group is re-padded), against one
process on the same global batch: logged losses within 1e-5, post-SGD weights within 1e-4.

float32 throughout (``bf16: false``): TRL's default on a machine with bf16 would train in bf16.
"""

import json
from functools import partial
from pathlib import Path

import pytest

from halo_core.testing.compare import assert_close
from launch_kit import OPTIMIZERS, ROOT, STEPS, launch as launch_method, logged, weights, write_run

launch = partial(launch_method, "sft")

#: (processes, overrides): each split alone on two ranks, and every pair of the four splits on four ranks.
LAYOUTS = {
    "dp2": (2, []),
    "ep2": (2, ["--expert_parallel_size=2"]),
    # every step's checkpoint written in the background while the next steps run (each waits for the one before)
    "ep2-async": (2, ["--expert_parallel_size=2", "--async_save=true", "--save_steps=1"]),
    "tp2": (2, ["--tensor_parallel_size=2"]),
    "cp2": (2, ["--context_parallel_size=2"]),
    "cp2-ring": (2, ["--context_parallel_size=2", "--context_parallel_attention=ring"]),
    "etp2": (2, ["--expert_tensor_parallel_size=2"]),
    "ep2-tp2": (4, ["--expert_parallel_size=2", "--tensor_parallel_size=2"]),
    "ep2-cp2": (4, ["--expert_parallel_size=2", "--context_parallel_size=2"]),
    "cp2-tp2-ring": (4, ["--context_parallel_size=2", "--tensor_parallel_size=2", "--context_parallel_attention=ring"]),
    "ep2-etp2": (4, ["--expert_parallel_size=2", "--expert_tensor_parallel_size=2"]),
    "ep2-etp2-replicated": (4, ["--expert_parallel_size=2", "--expert_tensor_parallel_size=2", "--shard_parameters=false"]),
    "etp2-tp2": (4, ["--expert_tensor_parallel_size=2", "--tensor_parallel_size=2"]),
    "etp2-cp2": (4, ["--expert_tensor_parallel_size=2", "--context_parallel_size=2"]),
}
#: Under AdamW weights are not held tight (Adam turns rounding into update-sized steps), losses are.
ADAMW_LAYOUTS = ["tp2", "ep2-cp2"]


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    """A config over data whose completions run from 1 to 40 numbers, so no two neighbours share a length."""
    return write_run(tmp_path_factory.mktemp("uneven"), "completion")


def losses(output_dir) -> list[float]:
    return logged(output_dir, "loss")


@pytest.fixture(scope="module")
def single(run_file, tmp_path_factory):
    """One process per optimizer, run on first use."""
    done = {}

    def get(optim: str) -> Path:
        if optim not in done:
            done[optim] = launch(run_file, tmp_path_factory.mktemp(f"single-{optim}") / "run", 1, *OPTIMIZERS[optim])
        return done[optim]

    return get


def test_the_data_pads_every_batch(run_file):
    """Guard on the fixture itself: the reference batches mix lengths, so padding is exercised."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ROOT / "templates" / "tiny" / "model")
    rows = [json.loads(line) for line in (run_file.parent / "completion.jsonl").read_text().splitlines()]
    lengths = [len(tokenizer.apply_chat_template(r["prompt"] + r["completion"], return_dict=True)["input_ids"]) for r in rows]
    assert len(set(lengths)) >= 5 and max(lengths) > 3 * min(lengths)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_sgd_layout_logs_the_single_process_losses_and_ends_on_its_weights(single, run_file, tmp_path, name):
    nproc, layout = LAYOUTS[name]
    out = launch(run_file, tmp_path / "run", nproc, *OPTIMIZERS["sgd"], *layout)
    reference = single("sgd")
    expected = losses(reference)
    assert len(expected) == STEPS and losses(out) == pytest.approx(expected, abs=1e-5, rel=0)
    assert logged(out, "num_tokens") == logged(reference, "num_tokens")  # TRL's count, of each rank's own batch
    expected_weights, actual = weights(reference), weights(out)
    assert actual.keys() == expected_weights.keys()
    for key, tensor in actual.items():
        assert_close(tensor, expected_weights[key], f"{key} after {STEPS} SGD steps at {name}", rtol=1e-4)
    assert_written_by_every_rank(out, reference, nproc)


def writers(files: dict, prefix: str) -> set[int]:
    """The ranks the manifest records as writers of the tensors in files whose names start with ``prefix``."""
    return {part[3] for name, entry in files.items() if name.startswith(prefix) for parts in entry.get("tensors", {}).values() for part in parts}


def assert_written_by_every_rank(out: Path, reference: Path, nproc: int) -> None:
    """Every rank wrote part of the final model and of the checkpoint's weights and optimizer state (the manifest
    records each part's writer), into files holding what one process writes: the same tensors, shapes and dtypes."""
    from halo_core.parallel.manifest import header, read

    checkpoint = f"checkpoint-{STEPS}"
    for folder, single, prefixes in ((out, reference, ("model",)), (out / checkpoint, reference / checkpoint, ("model", "optimizer/"))):
        files = read(folder)["files"]
        for prefix in prefixes:
            # plain SGD keeps no state: its optimizer folder holds no tensors on any layout, one process's included
            if not writers(read(single)["files"], prefix):
                assert not writers(files, prefix), f"{folder}: {prefix}* has tensors one process does not write"
                continue
            ranks = writers(files, prefix)
            assert ranks == set(range(nproc)), f"{folder}: {prefix}* written by ranks {sorted(ranks)} of {nproc}"
        for name in files:
            if name.endswith(".safetensors"):
                assert header(folder / name) == header(single / name), name


@pytest.mark.parametrize("name", ADAMW_LAYOUTS)
def test_adamw_layout_logs_the_single_process_losses(single, run_file, tmp_path, name):
    nproc, layout = LAYOUTS[name]
    out = launch(run_file, tmp_path / "run", nproc, *OPTIMIZERS["adamw"], *layout)
    assert losses(out) == pytest.approx(losses(single("adamw")), abs=1e-5, rel=0)
    assert_written_by_every_rank(out, single("adamw"), nproc)  # AdamW keeps state: every rank writes its part
