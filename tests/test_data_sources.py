"""Every kind of dataset source a run may name, and column renames."""

import json

import datasets
import pytest

from halo_core.trainers.arguments import DatasetSource
from halo_core.trainers.parts.data import load_sources

ROWS = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(4)]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "d.parquet"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:1])}).save_to_disk(str(tmp_path / "saved"))
    return tmp_path


@pytest.mark.parametrize("name", ["d.jsonl", "d.json", "d.parquet", "saved"])
def test_each_source_kind_loads_with_renamed_columns(files, name):
    loaded = load_sources([DatasetSource(path=str(files / name), columns={"question": "prompt", "answer": "completion"})])
    assert loaded.column_names == ["prompt", "completion"] and loaded[3]["completion"] == "a3"


def test_a_saved_folder_split_and_concatenation(files):
    both = load_sources([DatasetSource(path=str(files / "saved"), split="test"), DatasetSource(path=str(files / "d.jsonl"))])
    assert len(both) == 5 and both[0]["question"] == "q0"
