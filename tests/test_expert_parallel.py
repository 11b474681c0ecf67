"""The expert-parallel engine beyond the conformance kit: refusals, replicated DP, dispatch plug-ins, checkpoints."""

import json
import re

import pytest
import torch
import torch.distributed as dist

from halo_core.errors import DuplicateClaimError, LayoutError
from halo_core.parallel.config import ParallelConfig
from halo_core.parallel.dispatch import DispatcherError, get_dispatcher
from halo_core.registry import discover
from halo_core.testing.equivalence import run_layouts, uneven_model
from halo_core.testing.spawn import spawn
from halo_core.tiny import tiny_model

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)


@pytest.mark.parametrize(
    "config, world, needle",
    [
        (ParallelConfig(ep=0), 2, "ParallelConfig.ep=0 must be a positive integer"),
        (ParallelConfig(ep="2"), 2, "ParallelConfig.ep='2' must be a positive integer"),
        (ParallelConfig(tp=3), 4, re.escape("world size 4 is not divisible by cp*tp = 1*3 = 3")),
        (ParallelConfig(ep=3), 4, re.escape("ep*etp = 3*1 = 3 does not divide the data-parallel size 4 (world 4 / (cp 1 * tp 1)); choose ep*etp among [1, 2, 4]")),
        (ParallelConfig(ep=4, cp=2), 4, "does not divide the data-parallel size 2"),
        (ParallelConfig(fsdp="yes"), 2, "ParallelConfig.fsdp='yes' must be true or false"),
        (ParallelConfig(fsdp_unit_layers=0), 2, re.escape("ParallelConfig.fsdp_unit_layers=0 must be a positive integer (decoder layers per FSDP unit)")),
    ],
)
def test_impossible_degrees_are_refused_with_the_numbers(config, world, needle):
    with pytest.raises(LayoutError, match=needle):
        config.resolve(world)


def test_unknown_dispatcher_lists_the_available_ones():
    with pytest.raises(DispatcherError, match=r"ep_dispatcher='deepep' is unknown; available: \['torch'\]"):
        get_dispatcher("deepep")


def test_an_installed_but_broken_dispatcher_says_why(plugin_site):
    plugin_site.add("halo-dispatch-broken", "raise ImportError('needs libnvshmem')\n", entry="fancy", group="halo.dispatchers", attr="Fancy")
    with pytest.raises(DispatcherError, match="ep_dispatcher='fancy' is installed but unavailable here .*libnvshmem.* available: \\['fancy', 'torch'\\]"):
        get_dispatcher("fancy")


RECORDING_DISPATCHER = """
import os
from halo_core.parallel.dispatch import TorchAllToAll

class Recording(TorchAllToAll):
    def dispatch(self, tokens, counts):
        with open(os.environ["HALO_TEST_DISPATCH_LOG"], "a") as log:
            log.write(f"{int(counts.sum())}\\n")
        return super().dispatch(tokens, counts)
"""


def test_a_third_party_dispatcher_is_selected_by_name_and_stays_exact(plugin_site, tmp_path, monkeypatch):
    log = tmp_path / "dispatch.log"
    monkeypatch.setenv("HALO_TEST_DISPATCH_LOG", str(log))
    plugin_site.add("halo-dispatch-recording", RECORDING_DISPATCHER, entry="recording", group="halo.dispatchers", attr="Recording")
    run_layouts("qwen3-moe", "qwen3_moe", 2, [ParallelConfig(ep=2, ep_dispatcher="recording")], seed=3)
    assert log.exists() and len(log.read_text().split()) >= 4  # 2 ranks x 2 MoE layers, forward at least


def test_replicated_data_parallel_without_fsdp_is_exact_too():
    run_layouts("gpt-oss", "gpt_oss", 2, [ParallelConfig(ep=2, fsdp=False)], seed=5)


def test_fsdp_units_of_several_layers_are_exact():
    run_layouts("qwen3-moe", "qwen3_moe", 2, [ParallelConfig(ep=2, fsdp_unit_layers=2)], seed=7)


def _grouped_units(rank, world):
    from halo_core import parallelize
    from halo_core.parallel.fsdp import decoder_layers

    for unit_layers, units in ((1, 3), (2, 2), (3, 1)):
        model = parallelize(tiny_model("qwen3_moe", {"num_hidden_layers": 3}, seed=1), ParallelConfig(ep=world, fsdp_unit_layers=unit_layers))
        states = {id(layer._get_fsdp_state()._fsdp_param_group) for layer in decoder_layers(model)}
        assert len(states) == units, (unit_layers, len(states))


def _embedding_units(rank, world):
    from torch.distributed.fsdp import FSDPModule

    from halo_core import parallelize

    for tied in (False, True):
        model = parallelize(tiny_model("qwen3_moe", {"tie_word_embeddings": tied}, seed=1), ParallelConfig(ep=world))
        assert isinstance(model.get_input_embeddings(), FSDPModule) is not tied, tied
        if tied:  # in the root unit, with the head that reads them in backward
            continue
        tokens = torch.randint(0, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(rank))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            model(input_ids=tokens, labels=tokens).loss.backward()
        gathers = [e.name for e in profile.events() if e.name.startswith("FSDP::all_gather (") and "embed_tokens" in e.name]
        assert len(gathers) == 1, gathers  # for forward only
        assert model.get_input_embeddings().weight.grad is not None


def test_the_input_embeddings_are_their_own_fsdp_unit_unless_tied_to_the_head():
    """Resharded after forward and not gathered again for backward, whose lookup gradient needs no
    weight; not held gathered beside the head for the whole step (in the root unit they were:
    0.58 GiB of the benchmark model per GPU)."""
    spawn(_embedding_units, 2)


def _head_units(rank, world):
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from halo_core import parallelize

    for tied in (False, True):
        model = parallelize(tiny_model("qwen3_moe", {"tie_word_embeddings": tied}, seed=1), ParallelConfig(ep=world))
        head = model.get_output_embeddings()
        assert isinstance(head, FSDPModule) is not tied, tied
        seen = []

        def watch(module, args, out):  # fires when the decoder layers' backward is done and the embeddings' is yet to run
            out.register_hook(lambda grad: seen.append((isinstance(head.weight, DTensor), head.weight.grad is not None)))

        model.get_input_embeddings().register_forward_hook(watch)
        tokens = torch.randint(0, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(rank))
        model.train()
        model(input_ids=tokens, labels=tokens).loss.backward()
        if not tied:  # resharded, its gradient already reduced: not held with the root until the end of backward
            assert seen == [(True, True)], seen


def test_the_output_head_is_its_own_fsdp_unit_released_after_its_backward():
    """The head's gathered weight and unsharded gradient were held in the root unit until the end of
    backward, the step's memory peak (1.16 GiB of the benchmark model per GPU). Equivalence through
    TRL's fused head, which reads the weight directly, is test_launch's; through the model's own head,
    the conformance kit's."""
    spawn(_head_units, 2)


def test_fsdp_unit_layers_groups_consecutive_layers_into_one_unit():
    spawn(_grouped_units, 2)


def _fsdp_units(rank, world):
    from torch.distributed.tensor import DTensor

    from halo_core import parallelize
    from halo_core.parallel.layout_state import layout_of

    for ep, experts_sharded in ((world, False), (world // 2, True)):
        model = parallelize(tiny_model("qwen3_moe", seed=1), ParallelConfig(ep=ep))
        expert_names = layout_of(model).expert_params
        kinds = {name: isinstance(p, DTensor) for name, p in model.named_parameters()}
        assert expert_names and all(kinds[n] is experts_sharded for n in expert_names), (ep, kinds)
        assert all(is_dtensor for n, is_dtensor in kinds.items() if n not in expert_names), (ep, kinds)


def test_experts_held_by_one_rank_alone_stay_outside_fsdp():
    """EP over every data-parallel rank: a one-rank FSDP unit would only copy the experts in and out; with
    expert replicas (ep < data-parallel size) FSDP2 shards them over the replicas. Equivalence of both
    layouts is the conformance kit's; this pins which one is which."""
    spawn(_fsdp_units, 4)


def _refusals(rank, world):
    registry = discover(strict=False)
    from halo_core import parallelize

    model = tiny_model("qwen3_moe", {"num_experts": 3, "num_experts_per_tok": 1})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(LayoutError, match="model.layers.0.mlp has 3 experts, which ep=2 does not divide; choose ep among \\[1\\]"):
        parallelize(model, ParallelConfig(ep=2), registry)
    with pytest.raises(DispatcherError, match="ep_dispatcher='nccl-magic' is unknown"):
        parallelize(model, ParallelConfig(ep=2, ep_dispatcher="nccl-magic"), registry)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], v) for k, v in before.items())
    assert model.config._experts_implementation == "grouped_mm"

    with pytest.raises(LayoutError, match="no installed family plugin claims model type 'llama'.*set ep=1"):
        parallelize(tiny_model("llama"), ParallelConfig(ep=2), registry)
    with pytest.raises(LayoutError, match="family 'no-ep' .* does not support ep=2"):
        parallelize(tiny_model("solar_open"), ParallelConfig(ep=2), registry)


def test_refusals_happen_before_any_weight_moves(plugin_site):
    plugin_site.add_family("halo-plugin-no-ep", "no-ep", ("solar_open",), splits=())
    spawn(_refusals, 2)


def test_duplicate_claims_refuse_to_parallelize(plugin_site):
    plugin_site.add_family("halo-plugin-qwen-fork", "qwen-fork", ("qwen3_moe",))
    from halo_core import parallelize

    with pytest.raises(DuplicateClaimError, match="halo-plugin-qwen-fork"):
        parallelize(tiny_model("qwen3_moe", device="meta"), ParallelConfig(), discover(strict=False))


def _round_trip(rank, world, out_dir, seed):
    from transformers import AutoModelForCausalLM

    from halo_core import clip_grad_norm_, full_state_dict, parallelize, sync_gradients
    from halo_core.testing.compare import assert_close
    from halo_core.testing.equivalence import rank_batches

    registry = discover(strict=False)
    record = registry.by_name("qwen3-moe")
    model = uneven_model(record, "qwen3_moe", ep=2, seed=seed)
    reference = uneven_model(record, "qwen3_moe", ep=2, seed=seed)
    batches = rank_batches(world, model.config.vocab_size, seed)
    torch.stack([reference(**b).loss for b in batches]).mean().backward()
    torch.optim.SGD(reference.parameters(), lr=0.5).step()

    model = parallelize(model, ParallelConfig(ep=2), registry)
    model(**batches[rank]).loss.backward()
    sync_gradients(model)
    clip_grad_norm_(model, float("inf"))
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    state = full_state_dict(model)
    if rank == 0:
        model.save_pretrained(out_dir, state_dict=state)
    dist.barrier()
    loaded = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    assert loaded.config._experts_implementation != "halo_ep"
    for name, tensor in reference.state_dict().items():
        assert_close(loaded.state_dict()[name], tensor, f"rank {rank}: {name} after save/load")


def test_parallel_step_then_save_pretrained_loads_as_the_reference(tmp_path):
    spawn(_round_trip, 2, str(tmp_path), 11)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "qwen3_moe" and config["num_local_experts"] == 8


def _sliced_load(rank, world, folder, model_type, overrides):
    from halo_core import ParallelConfig, from_pretrained, full_state_dict
    from halo_core.parallel.layout_state import layout_of
    from halo_core.testing.compare import assert_close

    reference = tiny_model(model_type, overrides, seed=7)
    if rank == 0:
        reference.save_pretrained(folder)
    dist.barrier()
    model = from_pretrained(folder, ParallelConfig(ep=2))
    first, last = 4 * rank, 4 * rank + 4  # 8 experts, ep=2
    for key, rows in layout_of(model).reads.items():
        if ".experts." not in key:
            assert rows is None, key
        elif rows is not None:  # fused checkpoint: sliced on read
            assert rows == (first, last), (key, rows)
        else:  # one tensor per expert: only the local ones are opened
            expert = int(key.split(".experts.")[1].split(".")[0])
            assert first <= expert < last, key
    assert any(".experts." in key for key in layout_of(model).reads)
    ids = torch.randint(0, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(rank))
    assert_close(model(input_ids=ids).logits, reference(input_ids=ids).logits, f"rank {rank}: logits after sliced load")
    state = full_state_dict(model)
    if rank == 0:
        for name, tensor in reference.state_dict().items():
            assert_close(state[name], tensor, f"{name} after sliced load")


@pytest.mark.parametrize(
    "model_type, overrides",
    [("qwen3_moe", {}), ("gpt_oss", {"attn_implementation": "eager"}), ("mixtral", {})],
    ids=["per-expert-tensors", "fused-experts", "renamed-per-expert-tensors"],
)
def test_from_pretrained_reads_only_the_local_experts(tmp_path, model_type, overrides):
    spawn(_sliced_load, 2, str(tmp_path), model_type, overrides)


def test_a_checkpoint_missing_a_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    from halo_core import ParallelConfig, from_pretrained
    from halo_core.parallel.loading import CheckpointError

    tiny_model("qwen3_moe").save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.mlp.experts.3.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="checkpoint lacks model.layers.1.mlp.experts.3.up_proj.weight"):
        from_pretrained(tmp_path, ParallelConfig())
