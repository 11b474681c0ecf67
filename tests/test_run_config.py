"""Every refusal of the run configuration, before any process starts."""

import dataclasses
import re
import shutil
from pathlib import Path

import pytest
from trl import SFTConfig

from conftest import run_halo
from halo_core.errors import ConfigError
from halo_core.parallel.config import OWN_NAMES, RUN_KEYS, ParallelConfig, ParallelDims
from halo_core.parallel.plan import LayoutPlan, plan_layout
from halo_core.registry import discover
from halo_core.trainers.run_config import check_layout, load_run_config, parse_overrides

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "templates" / "configs" / "tiny-qwen3-moe.yaml"


def load(overrides=(), path=TINY):
    return load_run_config("sft", SFTConfig, path, parse_overrides(list(overrides)))


def test_the_embedded_default_resolves_paths_next_to_the_file():
    run = load()
    assert Path(run.halo.model_name_or_path) == ROOT / "templates" / "tiny" / "model"
    assert Path(run.halo.dataset[0].path) == ROOT / "templates" / "tiny" / "data" / "arithmetic.jsonl"
    assert run.halo.expert_parallel_size == 2 and run.trainer["max_steps"] > 0


def test_overrides_win_and_yaml_scalars_are_version_1_2():
    run = load(["--learning_rate=1e-5", "--save_strategy", "no", "--expert-parallel-size=1", "--bf16=false"])
    assert run.trainer["learning_rate"] == 1e-5 and run.trainer["save_strategy"] == "no"
    assert run.halo.expert_parallel_size == 1 and run.trainer["bf16"] is False


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--learnig_rate=0.1"], "unknown key 'learnig_rate'; did you mean 'learning_rate'?"),
        (["--expert_paralel_size=2"], "unknown key 'expert_paralel_size'; did you mean 'expert_parallel_size'?"),
        (["--zzz=1"], "unknown key 'zzz'; see agent-docs/configuration.md"),
        (["--learning_rate=fast"], "learning_rate must be float, got 'fast' (str)"),
        (["--max_steps=2.5"], "max_steps must be int, got 2.5 (float)"),
        (["--expert_parallel_size=two"], "expert_parallel_size must be int, got 'two' (str)"),
        (["--random_init=maybe"], "random_init must be bool, got 'maybe' (str)"),
        (["--shard_parameters=sometimes"], "shard_parameters must be bool, got 'sometimes' (str)"),
        (["--dataset=missing.jsonl"], "dataset[0].path 'missing.jsonl' does not exist"),
        (["--dataset=[{split: train}]"], "dataset[0] needs a 'path'"),
        (["--dataset=[{path: x.jsonl, splt: a}]"], "dataset[0]: unknown key 'splt'; did you mean 'split'?"),
        (["--dataset=[]"], "dataset must be a non-empty list"),
    ],
)
def test_bad_keys_and_values_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(overrides)


@pytest.mark.parametrize(
    "tokens, message",
    [(["max_steps=3"], "override 'max_steps=3' is not of the form --field=value"), (["--max_steps"], "override --max_steps has no value")],
)
def test_malformed_overrides(tokens, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_overrides(tokens)


def test_missing_required_fields_and_files(tmp_path):
    (tmp_path / "a.yaml").write_text("dataset: [x]\n")
    with pytest.raises(ConfigError, match="model_name_or_path is required"):
        load(path=tmp_path / "a.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        load(path=tmp_path / "nope.yaml")
    (tmp_path / "b.yaml").write_text("- a list\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load(path=tmp_path / "b.yaml")
    (tmp_path / "c.yaml").write_text("a: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(path=tmp_path / "c.yaml")


@pytest.mark.parametrize(
    "overrides, world, message",
    [
        ([], 1, "ep*etp = 2*1 = 2 does not divide the data-parallel size 1"),
        (["--expert_parallel_size=3"], 3, "the model has 8 experts, which expert_parallel_size=3 does not divide; choose expert_parallel_size among [1]"),
        (["--expert_parallel_size=1", "--tensor_parallel_size=4"], 4, "num_key_value_heads=2 is not divisible by tensor_parallel_size tp=4"),
        (["--expert_parallel_size=1", "--tensor_parallel_size=2", "--context_parallel_size=2"], 4, "num_key_value_heads=2 is not divisible by tensor_parallel_size tp=2 times context_parallel_size cp=2"),
        (["--expert_parallel_size=1", "--expert_tensor_parallel_size=3"], 3, "the experts: intermediate size 64 is not divisible by expert_tensor_parallel_size etp=3"),
        (["--expert_parallel_size=1", "--context_parallel_size=2", "--context_parallel_attention=spiral"], 2, "ParallelConfig.cp_attention='spiral' is unknown; choose one of ['ulysses', 'ring']"),
        (["--expert_parallel_size=1", "--context_parallel_size=4"], 4, "num_key_value_heads=2 is not divisible by context parallel size cp=4"),
        (["--ep_dispatcher=deepep"], 2, "ep_dispatcher='deepep' is unknown; available: ['torch']"),
        (["--experts_implementation=grouped-mm"], 2, "experts_implementation 'grouped-mm' is unknown; choose one of"),
        (["--experts_implementation=liger_moe"], 2, "experts_implementation 'liger_moe' cannot run here: it needs a CUDA GPU; use grouped_mm"),
        (["--expert_parallel_size=1", "--tensor_parallel_size=3"], 4, "world size 4 is not divisible by cp*tp = 1*3 = 3"),
        (["--fsdp_unit_layers=8", "--shard_parameters=false"], 2, "fsdp_unit_layers=8 groups FSDP units, but shard_parameters is false (no FSDP); remove one of the two"),
        (["--fsdp_unit_layers=0"], 2, "fsdp_unit_layers=0 must be a positive integer (consecutive decoder layers per FSDP unit; 1 = one unit per layer)"),
        (["--activation_memory_budget=0.5"], 2, "activation_memory_budget=0.5 applies to compiled layers only; set compile_layers: true or remove it"),
        (["--compile_layers=true", "--activation_memory_budget=1.5"], 2, "activation_memory_budget must be in (0, 1], got 1.5"),
        (["--expert_parallel_size=1", "--tensor_parallel_size=2", "--compile_layers=true"], 2, "compile_layers does not work with tensor_parallel_size > 1 yet"),
    ],
)
def test_impossible_layouts(overrides, world, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_layout(load(overrides), world)


@pytest.mark.parametrize("field, split", [("context_parallel_size", "cp"), ("tensor_parallel_size", "tp"), ("expert_tensor_parallel_size", "etp")])
def test_a_split_the_method_cannot_feed_is_refused(monkeypatch, field, split):
    import dataclasses

    from halo_core.trainers import method

    narrow = dataclasses.replace(method.get_method("sft"), splits=frozenset({"ep"}))  # a method whose trainer feeds EP only
    monkeypatch.setattr(method, "get_method", lambda name: narrow)
    with pytest.raises(ConfigError, match=re.escape(f"method 'sft' cannot train with {split}=2 yet (it supports ['ep']); set {field} to 1")):
        check_layout(load(["--expert_parallel_size=1", f"--{field}=2"]), 2)


def test_random_init_needs_a_local_config(tmp_path):
    shutil.copy(TINY, tmp_path / "run.yaml")
    with pytest.raises(ConfigError, match="random_init needs a local model folder"):
        check_layout(load(["--model_name_or_path=some/hub-id", f"--dataset={TINY}", f"--eval_dataset={TINY}"], path=tmp_path / "run.yaml"), 2)


@pytest.mark.parametrize("world, overrides", [(3, []), (6, ["--expert_parallel_size=4"])])
def test_the_ep_etp_hint_names_only_degrees_that_pass(world, overrides):
    """The default (8 experts) at --nproc 3 once suggested ep*etp among [1, 3], and ep=3 was then refused (8 experts do
    not split in 3): every degree the fix names now passes every rule on that world."""
    with pytest.raises(ConfigError) as refused:
        check_layout(load(overrides), world)
    pairs = re.findall(r"ep=(\d+) etp=(\d+)", str(refused.value))
    assert pairs and ("3", "1") not in pairs, str(refused.value)
    for ep, etp in pairs:
        check_layout(load([*overrides, f"--expert_parallel_size={ep}", f"--expert_tensor_parallel_size={etp}"]), world)
    assert re.search(r"among \[1\] \(ep=1 etp=1 passes" if world == 3 else r"among \[1, 2\] ", str(refused.value)), str(refused.value)


def test_the_etp_hint_names_only_degrees_that_fit_the_world():
    """etp=3 at --nproc 3 does not divide the experts' width 64; its divisors 2 to 64 do not fit 3 processes either, so
    the fix names etp=1 alone, and following it passes."""
    overrides = ["--expert_parallel_size=1", "--expert_tensor_parallel_size=3"]
    with pytest.raises(ConfigError, match=re.escape("is not divisible by expert_tensor_parallel_size etp=3; choose etp among [1] (")):
        check_layout(load(overrides), 3)
    check_layout(load(["--expert_parallel_size=1", "--expert_tensor_parallel_size=1"]), 3)


@pytest.mark.slow  # a fresh `halo` interpreter loading the stack
def test_cli_refuses_before_starting_anything(tmp_path):
    result = run_halo("launch", "sft", str(TINY), "--nproc", "3", "--", f"--output_dir={tmp_path / 'out'}")
    assert result.returncode == 2 and "expert_parallel_size=3" not in result.stderr
    assert "ep*etp = 2*1 = 2 does not divide the data-parallel size 3" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()
    unknown = run_halo("launch", "dpo-magic", str(TINY))
    assert unknown.returncode == 2 and "unknown method 'dpo-magic'; known methods: " in unknown.stderr and "dpo, " in unknown.stderr and "sft" in unknown.stderr


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--nnodes", "2"], "--nnodes 2 needs --rdzv-endpoint HOST:PORT"),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], "--node-rank 2 must be below --nnodes 2"),
        (["--nproc", "0"], "Invalid value for '--nproc'"),
    ],
)
def test_bad_launcher_flags(flags, message):
    result = run_halo("launch", "sft", str(TINY), *flags, "--dry-run")
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow  # a fresh `halo` interpreter loading the stack
def test_dry_run_prints_config_layout_and_family():
    result = run_halo("launch", "sft", str(TINY), "--nproc", "4", "--dry-run", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert "expert_parallel_size: 2" in result.stdout and "family: qwen3-moe" in result.stdout
    assert "world 4 = dp 4 x cp 1 x tp 1" in result.stdout
    rows = [line for line in result.stdout.splitlines() if re.match(r"^│ \d", line)]
    assert len(rows) == 4 and rows[3].split("│")[1:4] == [" 3    ", " 3  ", " 1  "]


@pytest.mark.slow  # a fresh `halo` interpreter loading the stack
def test_dry_run_shows_every_ranks_coordinates_in_a_composed_layout():
    flags = ["--nproc", "8", "--dry-run", "--", "--tensor_parallel_size=2", "--context_parallel_size=2", "--context_parallel_attention=ring"]
    result = run_halo("launch", "sft", str(TINY), *flags, env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert "world 8 = dp 2 x cp 2 x tp 2; ep 2 x etp 1 within dp" in " ".join(result.stdout.split())  # the title may wrap
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in result.stdout.splitlines() if re.match(r"^│ \d", line)]
    # columns: rank, dp, ep, ep_replica, cp, tp, etp; tp fastest, then ep, then cp
    assert rows[5] == ["5", "0", "0", "0", "1", "1", "0"] and rows[2] == ["2", "1", "1", "0", "0", "0", "0"]


def test_etp_slices_grouped_mm_cannot_take_are_refused_before_start():
    """grouped_mm needs 16-byte rows: 64 columns over etp=16 leave 4, 8 bytes in bf16 (16 in float32)."""
    wide = ["--expert_parallel_size=1", "--expert_tensor_parallel_size=16"]
    with pytest.raises(ConfigError, match=re.escape("leaves slices of 4 columns (8 bytes at 2 bytes an element), but grouped_mm needs rows of a multiple of 16 bytes; choose etp among [1, 2, 4, 8]")):
        check_layout(load([*wide, "--bf16=true"]), 16)
    with pytest.raises(ConfigError, match="at 2 bytes an element"):  # unset: TRL resolves bf16 to true
        check_layout(load([*wide, "--bf16=null"]), 16)
    check_layout(load([*wide, "--bf16=false"]), 16)
    check_layout(load([*wide, "--bf16=true", "--experts_implementation=eager"]), 16)


def _refused(make, names):
    from halo_core.errors import LayoutError

    with pytest.raises(LayoutError) as refused:
        make(names)
    return refused.value


def _tiny_config():
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(ROOT / "templates" / "tiny" / "model")


@pytest.mark.parametrize(
    "make, engine, launcher",
    [
        (lambda names: LayoutPlan(ParallelConfig(ep=3), ParallelDims(world=6, dp=6, ep=3), None).check_experts("block", 8, names=names),
         "block has 8 experts, which ep=3 does not divide; choose ep among [1, 2]", "block has 8 experts, which expert_parallel_size=3 does not divide; choose expert_parallel_size among [1, 2]"),
        (lambda names: ParallelConfig(ep=3).resolve(2, names=names),
         "ep*etp = 3*1 = 3 does not divide the data-parallel size 2", "ep*etp = 3*1 = 3 does not divide the data-parallel size 2 (world 2 / (cp 1 * tp 1)); choose ep*etp among [1, 2] (set in expert_parallel_size"),
        (lambda names: plan_layout(ParallelConfig(cp=4), _tiny_config(), discover(), 4, names=names),
         "num_key_value_heads=2 is not divisible by context parallel size cp=4 (context_parallel_size)", "num_key_value_heads=2 is not divisible by context parallel size cp=4 (context_parallel_size)"),
        (lambda names: ParallelConfig(cp=2, cp_attention="spiral").resolve(2, names=names),
         "ParallelConfig.cp_attention='spiral' is unknown", "ParallelConfig.cp_attention='spiral' is unknown"),
    ],
)
def test_layout_messages_speak_the_runs_field_names(make, engine, launcher):
    """The engine's message names the degrees as ``ParallelConfig`` does; the launcher's (``names=RUN_KEYS``) by the
    run's keys, written so when raised rather than rewritten from the text afterwards."""
    from halo_core.trainers.run_config import _in_run_words

    assert str(_refused(make, OWN_NAMES)).startswith(engine)
    assert _in_run_words(_refused(make, RUN_KEYS)).startswith(launcher)


def test_the_layout_keys_are_written_once():
    """``RUN_KEYS`` is the one list of layout fields: every ``ParallelConfig`` field has one YAML key, each a
    ``HaloArguments`` field that ``parallel_config`` reads into it, and no other layout key exists anywhere."""
    from halo_core.methods.distill import TEACHER_KEYS, HaloDistillConfig
    from halo_core.parallel import plan
    from halo_core.trainers.arguments import HaloArguments

    assert set(RUN_KEYS) == {f.name for f in dataclasses.fields(ParallelConfig)}
    assert len(set(RUN_KEYS.values())) == len(RUN_KEYS)
    arguments = {f.name for f in dataclasses.fields(HaloArguments)}
    assert set(RUN_KEYS.values()) <= arguments
    assert {a for a in arguments if "parallel" in a or "shard" in a or "fsdp" in a or "dispatcher" in a} == set(RUN_KEYS.values())
    marked = {key: (f"v-{field}" if field in ("cp_attention", "ep_dispatcher") else i + 2) for i, (field, key) in enumerate(RUN_KEYS.items())}
    parallel = HaloArguments(model_name_or_path="m", dataset=[], **marked).parallel_config()
    assert {field: getattr(parallel, field) for field in RUN_KEYS} == {field: marked[key] for field, key in RUN_KEYS.items()}
    teacher = {f.name for f in dataclasses.fields(HaloDistillConfig) if f.name.startswith("teacher_") and f.name.endswith("_size")}
    assert teacher == set(TEACHER_KEYS.values()) and all(key == f"teacher_{RUN_KEYS[s]}" for s, key in TEACHER_KEYS.items())
    assert not hasattr(plan, "RUN_FIELDS")


def test_a_refused_degree_carries_its_field_and_names_its_key():
    """The refusal says which ``ParallelConfig`` field it refuses (``fields``) and, given ``names``, writes that
    field's YAML key itself: no regex turns ``ep=3`` into ``expert_parallel_size=3`` afterwards."""
    from halo_core.adapt import check_splits
    from halo_core.context import ParallelContext
    from halo_core.errors import WorldSizeError
    from halo_core.trainers import run_config

    experts = _refused(lambda names: plan_layout(ParallelConfig(ep=3), _tiny_config(), discover(), 3, names=names), RUN_KEYS)
    assert experts.fields == ("ep",) and "which expert_parallel_size=3 does not divide; choose expert_parallel_size among [1]" in str(experts)
    registry = discover(strict=False)
    olmoe = registry.family_record("olmoe")
    context = ParallelContext(family=olmoe.family, model_type="olmoe", model_config=None, tp=2)
    split = _refused(lambda names: check_splits(registry, olmoe, context, names), RUN_KEYS)
    assert split.fields == ("tp",) and "does not support tensor_parallel_size=2 " in str(split) and str(split).endswith("Set tensor_parallel_size=1.")
    world = _refused(lambda names: ParallelConfig(tp=3).resolve(4, names=names), RUN_KEYS)
    assert isinstance(world, WorldSizeError) and world.fields == ("cp", "tp")
    assert not hasattr(run_config, "re") and not hasattr(run_config, "_DEGREE")


def test_a_single_value_where_trl_takes_a_list_is_read_as_that_list():
    """TRL's DPOConfig takes ``loss_type: sigmoid`` (and its parser ``--loss_type sigmoid``) for ["sigmoid"]."""
    from halo_core.trainers.typecheck import coerce

    assert coerce("ipo", list[str]) == ["ipo"] and coerce("ipo", list[str] | None) == ["ipo"]
    assert coerce(["ipo", "sft"], list[str]) == ["ipo", "sft"] and coerce(3, int) == 3 and coerce(None, list[str] | None) is None
