"""bench/weight_sync.py on the CPU (``--tiny``): real AdamW steps with a third of the blocks trainable, full,
trainable-only and sparse syncs into a receiver process over gloo; its figures are checked here against each other
and against what a sparse sync must cost, and a receiver that holds one wrong bit must fail the run."""

import contextlib
import importlib
import io
import json
import statistics
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("weight_sync")
    finally:
        sys.path.remove(str(BENCH))


def run(bench, *argv: str) -> str:
    """The bench's ``main`` in this process (its receiver is a process of its own), its printed output."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        bench.main(["--tiny", "--cpu", *argv])
    return printed.getvalue()


@pytest.fixture(scope="module")
def tiny(bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("weight-sync") / "tiny.json"
    stdout = run(bench, "--lr", "1e-5", "--steps", "5", "--anchor-every", "3", "--out", str(out))
    return json.loads(out.read_text()), stdout


def test_trainable_blocks_are_every_third_layer(bench):
    assert bench.trainable_layers(8, 3, 0) == [0, 3, 6]
    assert bench.trainable_layers(8, 3, 2) == [2, 5]
    assert bench.is_trainable("model.layers.3.mlp.experts.gate_up_proj", [0, 3]) and not bench.is_trainable("model.layers.30.x", [0, 3])
    assert not bench.is_trainable("model.embed_tokens.weight", [0, 3])
    with pytest.raises(SystemExit):
        bench.parse_args(["--anchor-every", "1"])


def test_every_sync_is_what_was_counted(tiny):
    result, stdout = tiny
    info, rows = result["model"], result["syncs"]
    assert info["trainable_layers"] == [0] and info["layers"] == 2 and info["master"] == "float32" and info["wire_bytes"] == 2
    assert 0 < info["trainable_elements"] < info["elements"]
    assert len(rows) == 3 * (info["steps"] + 1)
    assert len(result["losses"]) == info["steps"] and all(loss > 0 for loss in result["losses"])
    for sync in range(info["steps"] + 1):
        modes = [r["mode"] for r in rows if r["sync"] == sync]
        assert sorted(modes) == sorted(("full", "trainable", "sparse"))
    assert len({tuple(r["mode"] for r in rows if r["sync"] == s) for s in range(3)}) == 3  # the order rotates
    for row in rows:
        if row["sync"] == 0 or row["mode"] == "full" or row["kind"] == "full" and row["mode"] == "sparse":
            assert row["kind"] == "full"
            assert (row["tensors"], row["elements"], row["bytes"]) == (info["tensors"], info["elements"], 2 * info["elements"])
        elif row["mode"] == "trainable":
            assert row["kind"] == "full"
            assert (row["tensors"], row["elements"], row["bytes"]) == (info["trainable_tensors"], info["trainable_elements"],
                                                                       2 * info["trainable_elements"])
        else:  # a sparse delta: exactly the changed elements, each an int32 index and a bf16 value
            assert row["kind"] == "sparse" and row["elements"] == row["changed_elements"] > 0
            assert row["bytes"] == row["elements"] * (4 + 2)
            assert row["tensors"] == row["changed_tensors"] <= info["trainable_tensors"]
            assert row["changed_fraction_trainable"] == row["elements"] / info["trainable_elements"] < 1
        assert row["seconds"] > 0 and row["receiver_seconds"] > 0
    sparse_kinds = [r["kind"] for r in rows if r["mode"] == "sparse"]
    assert sparse_kinds == ["full", "sparse", "sparse", "full", "sparse", "sparse"]  # anchor_every 3: syncs 0 and 3
    changed = {r["sync"]: r["changed_elements"] for r in rows if r["sync"] > 0}
    assert all(r["changed_elements"] == changed[r["sync"]] for r in rows if r["sync"] > 0)  # one count a step, whatever the mode


def test_receivers_are_bitwise_the_trainers_weights(tiny):
    result, stdout = tiny
    assert set(result["verified"]) == {"full", "trainable", "sparse"}
    assert all(v["bitwise_equal"] and v["tensors"] == result["model"]["tensors"] for v in result["verified"].values())
    assert "receivers bitwise equal" in stdout


def test_summary_is_the_rows_medians(tiny, bench):
    result, stdout = tiny
    s, info, rows = result["summary"], result["model"], result["syncs"]
    deltas = sorted(r["bytes"] for r in rows if r["mode"] == "sparse" and r["kind"] == "sparse")
    delta = statistics.median(deltas)
    assert s["sparse_delta"]["syncs"] == 4 and s["sparse_delta"]["bytes"] == delta
    assert s["sparse_anchor"]["syncs"] == 1 and s["sparse_anchor"]["bytes"] == 2 * info["elements"]
    assert s["full"]["bytes"] == 2 * info["elements"] and s["trainable"]["bytes"] == 2 * info["trainable_elements"]
    assert s["full_over_sparse_delta_bytes"] == pytest.approx(s["full"]["bytes"] / delta)
    assert s["trainable_over_sparse_delta_bytes"] == pytest.approx(s["trainable"]["bytes"] / delta)
    cycle = (2 * info["elements"] + 2 * delta) / 3
    assert s["full_over_sparse_cycle_bytes"] == pytest.approx(s["full"]["bytes"] / cycle)
    assert s["target_met"] == (s["full_over_sparse_delta_bytes"] >= 10)
    assert bench.summarise(rows, info) == s
    assert "full / sparse delta bytes" in stdout


def test_a_receiver_one_bit_off_fails_the_run(bench, tmp_path):
    with pytest.raises(SystemExit, match="the sparse receiver's weights differ from the trainer's bfloat16 weights in 1 tensors"):
        run(bench, "--steps", "1", "--fault", "--out", str(tmp_path / "x.json"))
    assert not (tmp_path / "x.json").exists()


def test_a_report_that_disagrees_with_the_count_fails(bench):
    import torch

    numel, trainable = {"a": 10, "b": 6}, ["a"]
    row = {"sync": 2, "kind": "sparse", "tensors": 1, "elements": 3, "bytes": 18, "changed_tensors": 1, "changed_elements": 3}
    bench.check_report("sparse", row, numel, trainable, torch.bfloat16)
    with pytest.raises(SystemExit, match="counted"):
        bench.check_report("sparse", {**row, "bytes": 12}, numel, trainable, torch.bfloat16)
    with pytest.raises(SystemExit, match="counted"):
        bench.check_report("trainable", {**row, "kind": "full", "tensors": 2, "elements": 16, "bytes": 32}, numel, trainable, torch.bfloat16)
    bench.check_report("trainable", {**row, "kind": "full", "tensors": 1, "elements": 10, "bytes": 20}, numel, trainable, torch.bfloat16)
