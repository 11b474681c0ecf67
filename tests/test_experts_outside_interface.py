"""Experts outside transformers' experts interface (issue 28): DBRX's, called as the interface is but stacked
``[E * I, H]`` along dim 0 of 2-D weights in a child, and JetMoE's, two ``[E, ...]`` children of a block that
routes its own way. Their kits are the plugins' own tests; here: the sliced loader reads only a rank's rows and
the gather writes transformers' names and shapes back, ``halo launch`` trains DBRX at ep=2 as one process does
and leaves a checkpoint transformers loads, the scaffold reads DBRX with no marked spot, and what cannot work is
refused."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.distributed as dist

from halo_core.errors import LayoutError
from halo_core.registry import discover
from halo_core.testing.compare import assert_close
from halo_core.testing.spawn import spawn
from halo_core.tiny import tiny_family_model, tiny_model
from launch_kit import COMMON, OPTIMIZERS, TINY, launch, logged, uneven_rows

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

#: Each type, and the checkpoint key of one expert weight with its rows per expert (DBRX: ffn_hidden_size).
TYPES = {"dbrx": ("transformer.blocks.0.ffn.experts.mlp.w1", lambda c: c.ffn_config.ffn_hidden_size),
         "jetmoe": ("model.layers.0.mlp.input_linear.weight", lambda c: 1)}


def _sliced_load(rank, world, folder, family, model_type):
    from halo_core import ParallelConfig, from_pretrained, full_state_dict
    from halo_core.parallel.layout_state import layout_of

    reference = tiny_family_model(discover(strict=False).by_name(family).family, model_type, seed=3)
    if rank == 0:
        reference.save_pretrained(folder)
    dist.barrier()
    model = from_pretrained(folder, ParallelConfig(ep=2))
    key, per_expert = TYPES[model_type]
    rows = per_expert(model.config)
    assert layout_of(model).reads[key] == (4 * rows * rank, 4 * rows * (rank + 1))  # 8 experts, ep=2: this rank's 4
    assert model.get_parameter(key).shape[0] == 4 * rows
    ids = torch.randint(0, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(rank))
    model.eval()
    reference.eval()
    assert_close(model(input_ids=ids).logits, reference(input_ids=ids).logits, f"rank {rank}: logits after sliced load")
    state = full_state_dict(model)
    if rank == 0:
        assert state.keys() == reference.state_dict().keys()
        for name, tensor in reference.state_dict().items():
            assert_close(state[name], tensor, f"{name} gathered after sliced load")


@pytest.mark.parametrize("model_type", TYPES)
def test_the_loader_reads_a_ranks_experts_rows_and_the_gather_writes_them_back(tmp_path, model_type):
    spawn(_sliced_load, 2, str(tmp_path), model_type, model_type)


@pytest.fixture(scope="module")
def dbrx_run(tmp_path_factory):
    """A run over a tiny random DBRX with the tiny tokenizer, on uneven rows."""
    import json

    folder = tmp_path_factory.mktemp("dbrx")
    model = folder / "model"
    config = tiny_model("dbrx", {"vocab_size": 320, "pad_token_id": 0, "eos_token_id": 3}).config
    config.save_pretrained(model)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TINY / name, model / name)
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in uneven_rows("completion")))
    run = folder / "run.yaml"
    run.write_text(f"model_name_or_path: {model}\nrandom_init: true\ndataset:\n  - path: rows.jsonl\n")
    return run


def test_halo_launch_trains_dbrx_at_ep2_as_one_process_and_transformers_loads_the_result(dbrx_run):
    from transformers import DbrxForCausalLM

    args = [a for a in COMMON if not a.startswith("--router_aux_loss_coef")] + OPTIMIZERS["sgd"]
    single = launch("sft", dbrx_run, dbrx_run.parent / "single", 1, *args, common=[])
    split = launch("sft", dbrx_run, dbrx_run.parent / "ep2", 2, *args, "--expert_parallel_size=2", common=[])
    assert_close(torch.tensor(logged(split, "loss")), torch.tensor(logged(single, "loss")), "losses at ep=2", rtol=1e-5)
    one, two = (DbrxForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict() for out in (single, split))
    assert one.keys() == two.keys()
    for name, tensor in one.items():
        assert_close(two[name], tensor, f"{name} after SGD steps at ep=2", rtol=1e-4)


def test_lora_on_split_experts_outside_the_interface_is_refused_before_start(dbrx_run):
    from conftest import run_halo

    refused = run_halo("launch", "sft", str(dbrx_run), "--nproc", "2", "--dry-run", "--", "--expert_parallel_size=2",
                       "--use_peft=true", "--lora_target_modules=[Wqkv]", "--lora_target_parameters=[w1]", cwd=dbrx_run.parent)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "experts.mlp.w1 is an expert weight outside transformers' experts interface" in refused.stderr
    assert "Traceback" not in refused.stderr and len(refused.stderr.strip().splitlines()) == 1


def test_the_lora_refusal_names_expert_weights_outside_the_interface_and_not_attention_or_the_router():
    """Only the weights a split layout holds in slices: attention and the router still take stock PEFT's adapters."""
    from halo_core.lora.inject import LoraError, experts_outside_interface, refuse_split_experts

    model = tiny_model("dbrx", device="meta")
    outside = experts_outside_interface(model)
    assert "transformer.blocks.0.ffn.experts.mlp.w1" in outside and not any(".router." in n or ".attn." in n for n in outside)
    refuse_split_experts(["transformer.blocks.0.norm_attn_norm.attn.Wqkv.weight"], outside)  # attention: adapted as usual
    with pytest.raises(LoraError, match="expert_parallel_size: 1"):
        refuse_split_experts(["transformer.blocks.1.ffn.experts.mlp.v1"], outside)


def test_the_scaffold_reads_stacked_experts_with_no_marked_spot():
    from halo_cli.scaffold import _read_layout

    read = _read_layout("dbrx")
    assert read.marked is None and read.found_moe
    assert read.fields["moe_block"] == ("transformer.blocks.*.ffn",)
    assert (read.fields["router"], read.fields["experts"]) == ("router", "experts")
    assert not read.routing_replay  # DBRX takes its top-k in the block, after the router returned


def test_expert_tensor_parallelism_is_refused_outside_the_interface():
    from halo_core.parallel.expert_parallel import shard_experts

    experts = tiny_model("dbrx").transformer.blocks[0].ffn.experts
    with pytest.raises(LayoutError, match="drop etp"):
        shard_experts(experts, 0, 1, None, etp_size=2)


def test_a_module_neither_at_the_interface_nor_called_as_it_is_refused_naming_the_hook():
    from halo_core.parallel.expert_parallel import shard_experts

    block = tiny_model("jetmoe").model.layers[0].mlp
    with pytest.raises(LayoutError, match="implement wrap_moe_block"):
        shard_experts(block, 0, 2, None)


DENSE_LLAMA4 = """
from halo_core import Family, hookimpl

@hookimpl
def halo_family():
    return Family(name="llama4-dense", model_types=("llama4_text",), version="1.0", api_version=1, splits=frozenset({"ep"}),
                  moe_block="model.layers.*.feed_forward", router="router", experts="experts")
"""


def test_expert_major_experts_are_distributed_by_the_core_with_no_hook(plugin_site, monkeypatch):
    """Llama 4's experts take every token for every expert ("sorted per expert already"): a declaration alone (what
    halo new-family writes) trains them at ep=2 beside a replica and at ep=4 with a starved rank, as one process does;
    the bundled plugin's own hook, which sends only the chosen pairs, is disabled here."""
    from halo_core.parallel.config import ParallelConfig
    from halo_core.testing.equivalence import run_layouts

    monkeypatch.setenv("HALO_DISABLE_PLUGINS", "llama4")
    plugin_site.add("halo-plugin-llama4-dense", DENSE_LLAMA4, entry="llama4-dense")
    run_layouts("llama4-dense", "llama4_text", 4, [ParallelConfig(ep=2), ParallelConfig(ep=4)], seed=7)
