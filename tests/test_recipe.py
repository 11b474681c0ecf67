"""The worker's model recipe (``trainers/recipe.py``): a launched run's models made in one order, each step once."""

from __future__ import annotations

import pytest

from launch_kit import write_run

LORA = "use_peft: true\nlora_r: 4\nlora_alpha: 8\nlora_dropout: 0.0\nlora_target_modules: all-linear\n"


@pytest.mark.slow  # a run, in process
def test_a_launched_run_loads_lays_out_adds_adapters_builds_its_reference_compiles_then_splits_the_head(tmp_path, monkeypatch):
    """DPO with LoRA and ``compile_layers`` run in process for one step, each step recorded as it runs: the layout
    before the adapters, both models laid out once (the trainer's constructor lays out and compiles nothing more),
    compilation after the adapters and the reference, over both, and the fused head split after the trainer's
    ``__init__``. Compilation is recorded, not run (its numbers are ``test_compile``'s)."""
    from trl import DPOConfig

    import halo_core.lora.inject as inject
    import halo_core.parallel.parallelize as parallelize_module
    import halo_core.trainers.parts.compile as compile_module
    import halo_core.trainers.parts.pool as pool
    import halo_core.trainers.runtime as runtime
    from halo_core.methods.dpo import HaloDPOTrainer
    from halo_core.trainers.run_config import load_run_config, parse_overrides

    steps, names = [], {}

    def recorded(step, function):
        def call(*args, **kwargs):
            result = function(*args, **kwargs)
            steps.append(step)
            return result
        return call

    def name_of(model):
        return names.setdefault(id(model), f"model{len(names)}")

    def parallelize(model, *args, **kwargs):
        steps.append(f"lay out {name_of(model)}")
        return original_parallelize(model, *args, **kwargs)

    def compile_decoder_layers(model, budget=None, *, frozen=None):
        steps.append(f"compile {name_of(model)} with {name_of(frozen)}")
        return 0

    def split_fused_head_over_cp(model, pad_token_id):
        steps.append(f"split {name_of(model)}")

    class Trainer(HaloDPOTrainer):
        def __init__(self, *args, **kwargs):
            steps.append("trainer __init__")
            super().__init__(*args, **kwargs)
            steps.append("trainer __init__ done")

    original_parallelize = parallelize_module.parallelize
    monkeypatch.setattr(parallelize_module, "parallelize", parallelize)
    monkeypatch.setattr(runtime, "build_model", recorded("load", runtime.build_model))
    monkeypatch.setattr(inject, "add_adapters", recorded("adapters", inject.add_adapters))
    monkeypatch.setattr(compile_module, "compile_decoder_layers", compile_decoder_layers)
    monkeypatch.setattr(pool, "split_fused_head_over_cp", split_fused_head_over_cp)

    run_file = write_run(tmp_path, "preference", LORA)
    overrides = [f"--output_dir={tmp_path / 'run'}", "--per_device_train_batch_size=2", "--max_steps=1", "--save_strategy=no",
                 "--bf16=false", "--report_to=none", "--compile_layers=true", "--max_length=32"]
    trainer = runtime.train(load_run_config("dpo", DPOConfig, run_file, parse_overrides(overrides)), Trainer, DPOConfig,
                            reference=lambda args: True)
    assert trainer.state.global_step == 1
    assert steps == ["load", "lay out model0", "adapters", "load", "lay out model1", "compile model0 with model1",
                     "trainer __init__", "trainer __init__ done", "split model0", "split model1"], steps
    assert names[id(trainer.model)] == "model0" and names[id(trainer.ref_model)] == "model1"


def test_a_trainer_built_directly_on_a_model_is_laid_out_compiled_and_split_by_its_constructor(tmp_path, monkeypatch):
    """Tests and bench scripts build a trainer straight on a model (``bench/dpo_vs_trl.py``): the mixin's fallback runs
    the recipe's layout and compile steps on the policy and the reference, and splits the head after TRL's ``__init__``."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig

    import halo_core.parallel.parallelize as parallelize_module
    import halo_core.trainers.parts.compile as compile_module
    import halo_core.trainers.parts.pool as pool
    from halo_core.methods.dpo import HaloDPOTrainer
    from halo_core.parallel.layout_state import is_laid_out
    from halo_core.tiny import tiny_model
    from launch_kit import TINY, uneven_rows

    steps = []
    original_parallelize = parallelize_module.parallelize
    monkeypatch.setattr(parallelize_module, "parallelize", lambda model, *a, **k: steps.append("lay out") or original_parallelize(model, *a, **k))
    monkeypatch.setattr(compile_module, "compile_decoder_layers", lambda model, budget=None, *, frozen=None: steps.append(f"compile, reference {frozen is not None}"))
    monkeypatch.setattr(pool, "split_fused_head_over_cp", lambda model, pad: steps.append("split"))

    policy, reference = tiny_model("qwen3_moe", seed=1), tiny_model("qwen3_moe", seed=1)
    args = DPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, report_to="none", use_cpu=True, max_length=32)
    trainer = HaloDPOTrainer(model=policy, ref_model=reference, args=args, train_dataset=Dataset.from_list(uneven_rows("preference", 4)),
                             processing_class=AutoTokenizer.from_pretrained(TINY), compile_layers=True)
    assert steps == ["lay out", "lay out", "compile, reference True", "split", "split"], steps
    assert is_laid_out(trainer.model) and is_laid_out(trainer.ref_model)
