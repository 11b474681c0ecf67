"""`halo launch sft` on every split and the combinations the qwen3-moe family declares, with samples of
different lengths (so every batch is padded and every pool of a CP x TP group is re-padded), against one
process on the same global batch: logged losses within 1e-5, post-SGD weights within 1e-4.

Every split runs on both row kinds at no extra launch: alone on two ranks over prompt/completion rows (loss on the
completion only), paired on four ranks over plain-text rows (loss on every token, the first and the end-of-sequence
one included; ``max_length`` cuts the longest rows). Every layout runs with the router's auxiliary loss on: a TP
group's pool once had it divided by tp (3.3e-4 to 1e-3 off one process from the first step), and under DP, EP and CP
it was each rank's own; it is the global batch's now (``parts/moe_aux.py``).

float32 throughout (``bf16: false``): TRL's default on a machine with bf16 would train in bf16.
"""

import json
from pathlib import Path

import pytest

from halo_core.testing.compare import assert_close
from launch_kit import OPTIMIZERS, ROOT, STEPS, TEXT_RUN, assert_planned, launch as launch_method, logged, weights, write_run

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

#: The router's load-balancing loss on, large enough to show: Halo computes it over the global batch
#: (``parts/moe_aux.py``), so every layout logs one process's losses with it too.
AUX = "--router_aux_loss_coef=0.1"


def launch(config, output_dir, nproc, *args):
    """Each launch also writes every rank's actual tensor bytes after its first step (``parts/tensor_bytes``), and
    ``halo plan``'s figures for the same YAML and fields must equal them, rank by rank."""
    from halo_core.trainers.parts.tensor_bytes import ENV

    out = launch_method("sft", config, output_dir, nproc, *args, AUX, env={ENV: str(output_dir.parent / "tensor-bytes")})
    assert_planned("sft", config, output_dir, nproc, [*args, AUX])
    return out


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
#: The row kind each layout trains on: the pairs of splits on plain text, the rest on prompt/completion rows.
KINDS = {name: "text" if nproc == 4 else "completion" for name, (nproc, _) in LAYOUTS.items()}
#: Under AdamW weights are not held tight (Adam turns rounding into update-sized steps), losses are.
ADAMW_LAYOUTS = ["tp2", "ep2-cp2"]


@pytest.fixture(scope="module")
def run_files(tmp_path_factory):
    """A config per row kind: completions of 1 to 40 numbers (so no two neighbours share a length), and plain
    texts of 6 to 40 numbers cut at 48 tokens."""
    return {"completion": write_run(tmp_path_factory.mktemp("uneven"), "completion"),
            "text": write_run(tmp_path_factory.mktemp("text"), "text", TEXT_RUN)}


@pytest.fixture(scope="module")
def run_file(run_files):
    return run_files["completion"]


def losses(output_dir) -> list[float]:
    return logged(output_dir, "loss")


@pytest.fixture(scope="module")
def single(run_files, tmp_path_factory):
    """One process per optimizer and row kind, run on first use."""
    done = {}

    def get(optim: str, kind: str = "completion") -> Path:
        if (optim, kind) not in done:
            done[optim, kind] = launch(run_files[kind], tmp_path_factory.mktemp(f"single-{optim}-{kind}") / "run", 1, *OPTIMIZERS[optim])
        return done[optim, kind]

    return get


def test_the_data_pads_every_batch(run_files):
    """Guard on the fixtures themselves: the reference batches mix lengths, so padding is exercised, and the longest
    plain texts are cut at ``max_length``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ROOT / "templates" / "tiny" / "model")
    rows = [json.loads(line) for line in (run_files["completion"].parent / "completion.jsonl").read_text().splitlines()]
    lengths = [len(tokenizer.apply_chat_template(r["prompt"] + r["completion"], return_dict=True)["input_ids"]) for r in rows]
    assert len(set(lengths)) >= 5 and max(lengths) > 3 * min(lengths)
    texts = [json.loads(line)["text"] for line in (run_files["text"].parent / "text.jsonl").read_text().splitlines()]
    lengths = [len(tokenizer(t)["input_ids"]) + 1 for t in texts]  # TRL appends the end-of-sequence token
    assert len(set(lengths)) >= 5 and min(lengths) < 24 and sum(n > 48 for n in lengths) >= 4


def test_every_split_runs_on_both_row_kinds():
    """Guard on the layouts: each split, and data parallelism, runs on prompt/completion rows and on plain text."""
    flags = {"ep": "--expert_parallel_size=2", "tp": "--tensor_parallel_size=2", "cp": "--context_parallel_size=2",
             "etp": "--expert_tensor_parallel_size=2"}
    for split in ("dp", *flags):
        names = [name for name, (nproc, layout) in LAYOUTS.items()
                 if (flags[split] in layout if split in flags else nproc > 2 ** sum(flags[s] in layout for s in ("tp", "cp")))]
        kinds = {KINDS[name] for name in names}
        assert kinds == {"completion", "text"}, f"{split} runs on {sorted(kinds)} rows only ({names})"


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_sgd_layout_logs_the_single_process_losses_and_ends_on_its_weights(single, run_files, tmp_path, name):
    nproc, layout = LAYOUTS[name]
    kind = KINDS[name]
    out = launch(run_files[kind], tmp_path / "run", nproc, *OPTIMIZERS["sgd"], *layout)
    reference = single("sgd", kind)
    expected = losses(reference)
    assert len(expected) == STEPS and losses(out) == pytest.approx(expected, abs=1e-5, rel=0)
    assert logged(out, "num_tokens") == logged(reference, "num_tokens")  # TRL's count, of each rank's own batch
    assert logged(out, "aux_loss") == pytest.approx(logged(reference, "aux_loss"), abs=1e-5, rel=0)
    assert_same_moe_load(out, reference)
    expected_weights, actual = weights(reference), weights(out)
    assert actual.keys() == expected_weights.keys()
    for key, tensor in actual.items():
        assert_close(tensor, expected_weights[key], f"{key} after {STEPS} SGD steps at {name}", rtol=1e-4)
    assert_written_by_every_rank(out, reference, nproc)


def assert_same_moe_load(out: Path, reference: Path) -> None:
    """Tokens per expert over the global batch, padding left out: one process's, in the metrics and the counts file."""
    for key in ("moe/load_max", "moe/load_cv", "moe/dead_experts"):
        assert logged(out, key) == pytest.approx(logged(reference, key), abs=1e-6, rel=0), key
    counts = [json.loads(line) for line in (out / "moe_load.jsonl").read_text().splitlines()]
    expected = [json.loads(line) for line in (reference / "moe_load.jsonl").read_text().splitlines()]
    assert counts == expected and len(counts) == STEPS
    # each step's routed pairs: TRL's count of real tokens that step (attention mask) times top_k, per layer
    tokens = logged(reference, "num_tokens")
    steps = [b - a for a, b in zip([0] + tokens, tokens)]
    assert [{sum(layer) for layer in c["counts"]} for c in counts] == [{2 * n} for n in steps]


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
