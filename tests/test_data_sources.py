"""Every kind of dataset source a run may name; TRL's mixture keys in TRL's meaning, Halo's weights and streaming
(their layout equivalence is test_data_mixture's launched runs)."""

import json
from pathlib import Path

import datasets
import pytest

from halo_core.errors import ConfigError
from halo_core.trainers.arguments import DatasetSource
from halo_core.trainers.parts.data import load_sources
from halo_core.trainers.run_config import load_run_config
from trl import SFTConfig

ROWS = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(4)]
RENAME = {"question": "prompt", "answer": "completion"}


@pytest.fixture
def files(tmp_path):
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "d.parquet"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:1])}).save_to_disk(str(tmp_path / "saved"))
    many = [{"text": f"big{i}", "other": i} for i in range(30)]
    (tmp_path / "big.jsonl").write_text("".join(json.dumps(r) + "\n" for r in many))
    return tmp_path


@pytest.mark.parametrize("name", ["d.jsonl", "d.json", "d.parquet", "saved"])
def test_each_source_kind_loads_with_renamed_columns(files, name):
    loaded = load_sources([DatasetSource(path=str(files / name), rename_columns=RENAME)])
    assert loaded.column_names == ["prompt", "completion"] and loaded[3]["completion"] == "a3"


def test_a_saved_folder_split_and_concatenation(files):
    both = load_sources([DatasetSource(path=str(files / "saved"), split="test"), DatasetSource(path=str(files / "d.jsonl"))])
    assert len(both) == 5 and both[0]["question"] == "q0"


def test_columns_keeps_the_listed_columns_as_trl_does(files):
    kept = load_sources([DatasetSource(path=str(files / "d.jsonl"), columns=["answer"], rename_columns={"answer": "text"})])
    assert kept.column_names == ["text"] and kept[1]["text"] == "a1"


def test_fraction_mixes_as_trls_get_dataset(files):
    from trl.scripts.utils import DatasetConfig, DatasetMixtureConfig, get_dataset

    paths = [str(files / "d.jsonl"), str(files / "big.jsonl")]
    trl = get_dataset(DatasetMixtureConfig(datasets=[DatasetConfig(path="json", data_files=p, columns=[c], fraction=f)
                                                     for p, c, f in zip(paths, ["answer", "text"], [0.25, 0.75])]))["train"]
    ours = load_sources([DatasetSource(path="json", data_files=p, columns=[c], fraction=f) for p, c, f in zip(paths, ["answer", "text"], [0.25, 0.75])])
    assert ours.to_list() == trl.to_list() and len(ours) == 16  # 4 of d (all it has), 12 of big


def test_weights_sample_in_proportion_seeded_as_interleave_datasets(files):
    sources = [DatasetSource(path=str(files / "d.jsonl"), columns=["answer"], rename_columns={"answer": "text"}, weight=1),
               DatasetSource(path=str(files / "big.jsonl"), columns=["text"], weight=3)]
    mixed = load_sources(sources, seed=7).to_list()
    parts = [datasets.Dataset.from_list([{"text": r["answer"]} for r in ROWS]), datasets.Dataset.from_list([{"text": f"big{i}"} for i in range(30)])]
    assert mixed == datasets.interleave_datasets(parts, probabilities=[0.25, 0.75], seed=7).to_list()
    assert mixed == load_sources(sources, seed=7).to_list() and mixed != load_sources(sources, seed=8).to_list()
    # first_exhausted ends with the small source's 4th row; all_exhausted goes on until every big row was read
    assert sum(r["text"].startswith("a") for r in mixed) == 4 and mixed[-1]["text"].startswith("a")
    longer = load_sources(sources, seed=7, stopping_strategy="all_exhausted").to_list()
    assert {f"big{i}" for i in range(30)} <= {r["text"] for r in longer}


def test_a_streamed_source_yields_the_rows_of_the_map_style_one(files):
    sources = [DatasetSource(path=str(files / "d.jsonl"), rename_columns=RENAME, weight=1), DatasetSource(path=str(files / "big.jsonl"), weight=1)]
    streamed = load_sources([DatasetSource(**{**s.__dict__, "streaming": True}) for s in sources], seed=3)
    assert isinstance(streamed, datasets.IterableDataset)
    key = lambda rows: [json.dumps(r, sort_keys=True) for r in rows]  # noqa: E731 (interleaving unions the columns)
    assert key(streamed) == key(load_sources(sources, seed=3).to_iterable_dataset())


def _config(folder, body: str, method: str = "sft", config_class=SFTConfig):
    (folder / "d.jsonl").exists() or (folder / "d.jsonl").write_text(json.dumps({"text": "x"}) + "\n")
    (folder / "run.yaml").write_text(f"model_name_or_path: m\n{body}")
    return load_run_config(method, config_class, folder / "run.yaml")


def test_trls_mixture_yaml_is_read_unchanged(tmp_path):
    run = _config(tmp_path, "datasets:\n  - path: d.jsonl\n    columns: [text]\n    fraction: 1.0\nmax_steps: 3\nstreaming: false\n")
    assert run.halo.dataset[0].columns == ["text"] and run.halo.dataset[0].fraction == 1.0
    streamed = _config(tmp_path, "datasets:\n  - path: d.jsonl\n  - path: d.jsonl\nstreaming: true\nmax_steps: 3\n")
    assert [s.streaming for s in streamed.halo.dataset] == [True, True]
    builder = _config(tmp_path, "datasets:\n  - {path: json, data_files: d.jsonl}\n")
    assert builder.halo.dataset[0].data_files == str(tmp_path / "d.jsonl")  # read from the YAML's folder, as path is
    hub = _config(tmp_path, "dataset_name: trl-lib/tldr\ndataset_config: default\ndataset_train_split: validation\n")
    assert [(s.path, s.name, s.split, s.streaming) for s in hub.halo.dataset] == [("trl-lib/tldr", "default", "validation", False)]


@pytest.mark.parametrize("body, method, says", [
    ("dataset:\n  - path: d.jsonl\n    columns: {question: prompt}\n", "sft",
     "dataset[0].columns is TRL's list of columns to keep; write the rename map {question: prompt} as rename_columns: {question: prompt}"),
    ("dataset:\n  - {path: d.jsonl, weight: 1}\n  - {path: d.jsonl}\n", "sft", "weight is set on some sources but not on dataset[1]"),
    ("dataset:\n  - {path: d.jsonl, weight: 1, fraction: 0.5}\n", "sft", "set both fraction"),
    ("dataset:\n  - {path: d.jsonl, weight: 1}\ndataset_stopping_strategy: never\n", "sft", "dataset_stopping_strategy='never' must be one of"),
    ("dataset:\n  - {path: d.jsonl, streaming: true}\n", "sft", "needs max_steps"),
    ("dataset:\n  - {path: d.jsonl, streaming: true, fraction: 1}\nmax_steps: 2\n", "sft", "fraction needs each source's length"),
    ("dataset:\n  - {path: d.jsonl, streaming: true}\nmax_steps: 2\n", "dpo", "method 'dpo' does not train on streamed data yet"),
    ("dataset: [d.jsonl]\ndatasets: [d.jsonl]\n", "sft", "both dataset and datasets are set"),
])
def test_a_mixture_halo_cannot_read_is_refused_in_one_line(tmp_path, body, method, says):
    from trl import DPOConfig

    with pytest.raises(ConfigError) as caught:
        _config(tmp_path, body, method, DPOConfig if method == "dpo" else SFTConfig)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_sft_names_the_rename_its_columns_need_and_refuses_streamed_images(tmp_path):
    from types import SimpleNamespace

    from halo_core.methods import sft_data

    colours = str(Path(__file__).resolve().parents[1] / "templates" / "tiny" / "data" / "colours.jsonl")
    (tmp_path / "one.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    (tmp_path / "qa.jsonl").write_text(json.dumps({"Question": "x", "Answer": "y", "id": 1}) + "\n")
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True)
    cases = [(DatasetSource(str(tmp_path / "one.jsonl")), "rename_columns: {body: text}"),
             (DatasetSource("json", data_files=str(tmp_path / "one.jsonl")), "rename_columns: {body: text}"),
             (DatasetSource(str(tmp_path / "qa.jsonl")), "rename_columns: {Question: prompt, Answer: completion}"),
             (DatasetSource(str(tmp_path / "qa.jsonl"), columns=["id", "Answer"]), "rename_columns: {PROMPT_COLUMN: prompt"),
             (DatasetSource(colours, streaming=True), "has images, which a streamed source does not decode yet")]
    for source, says in cases:
        with pytest.raises(ConfigError) as caught:
            sft_data.check(SimpleNamespace(source="run.yaml", halo=SimpleNamespace(dataset=[source])), args)
        assert says in str(caught.value) and "\n" not in str(caught.value)
    sft_data.check(SimpleNamespace(source="run.yaml", halo=SimpleNamespace(dataset=[DatasetSource(colours)])), args)  # conversations fit


def test_the_worker_stops_in_one_line_on_loaded_sft_data_in_no_format(files):
    """A source not read before start (TRL's builder form over several files, a hub dataset) gets the same line in the worker."""
    from halo_core.methods import sft_data
    from halo_core.trainers.parts.stopping import RunStopped

    loaded = load_sources([DatasetSource("json", data_files=[str(files / "d.jsonl")])])
    with pytest.raises(RunStopped) as caught:
        sft_data.check_loaded(loaded, "text")
    assert "columns ['answer', 'question']" in str(caught.value) and "rename_columns: {question: prompt, answer: completion}" in str(caught.value)
    sft_data.check_loaded(load_sources([DatasetSource(str(files / "big.jsonl"))]), "text")
