"""Regional compilation (``compile_layers``): the compiled layers train exactly as the eager ones."""

import pytest
import torch
from torch._functorch import config as functorch_config

from halo_core import ParallelConfig, parallelize
from halo_core.errors import LayoutError
from halo_core.testing.compare import assert_close
from halo_core.tiny import tiny_model
from halo_core.trainers.parts.compile import compile_decoder_layers

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)


@pytest.mark.parametrize("budget", [None, 0.3], ids=["default", "recompute"])
def test_compiled_layers_give_the_eager_loss_and_gradients(budget):
    with functorch_config.patch(activation_memory_budget=1.0):  # the budget is process-wide: restored afterwards
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()  # so the check below sees this test's compilations only
        eager, compiled = (parallelize(tiny_model("qwen3_moe", seed=2), ParallelConfig()) for _ in range(2))
        assert compile_decoder_layers(compiled, budget) == eager.config.num_hidden_layers
        assert functorch_config.activation_memory_budget == (budget or 1.0)
        ids = torch.randint(0, eager.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(5))
        for model in (eager, compiled):
            model(input_ids=ids, labels=ids).loss.backward()
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # the layers really ran compiled
        assert_close(compiled(input_ids=ids, labels=ids).loss, eager(input_ids=ids, labels=ids).loss, "loss")
        for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
            if a.grad is not None and a.grad.abs().sum() > 0:
                assert_close(b.grad, a.grad, f"gradient of {name}")


def test_one_compilation_serves_every_layer_past_dynamos_recompile_limit():
    """A compile per layer made a backend per layer, dynamo recompiled for each, and the layers past its
    recompile limit ran eager without a word (a 16-layer model on the GPU: 13% slower, 2.3 GiB more)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    layers = torch._dynamo.config.recompile_limit + 2
    model = parallelize(tiny_model("qwen3", {"num_hidden_layers": layers}), ParallelConfig()).train()
    assert compile_decoder_layers(model) == layers
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(torch.seed() % 2**31))
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not torch._dynamo.utils.counters["recompiles"], dict(torch._dynamo.utils.counters["recompiles"])


def test_a_model_without_declared_layers_is_refused():
    model = parallelize(tiny_model("qwen3_moe"), ParallelConfig())
    model._no_split_modules = None  # as a custom model that declares no repeated block
    with pytest.raises(LayoutError, match="compile_layers: Qwen3MoeForCausalLM names no decoder layer class"):
        compile_decoder_layers(model)


def _expert_parallel_graphs(rank, world, budget):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eager, compiled = (parallelize(tiny_model("qwen3_moe", seed=2), ParallelConfig(ep=world)) for _ in range(2))
    layers = compile_decoder_layers(compiled, budget)
    generator = torch.Generator().manual_seed(100 + rank)
    for length in (40, 40 + 8 * rank):  # a second shape, different on each rank: a dynamic-shape recompile
        ids = torch.randint(0, eager.config.vocab_size, (2, length), generator=generator)
        losses = [model(input_ids=ids, labels=ids).loss for model in (eager, compiled)]
        losses[0].backward()
        with torch.profiler.profile() as profile:  # which exchanges the compiled step runs, forward and backward
            losses[1].backward()
        assert_close(losses[1], losses[0], "loss")
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        assert_close(b.grad, a.grad, f"gradient of {name}")
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    # Backward sends the gradients (2 all-to-alls a layer) and never re-runs the forward's exchanges.
    calls = {e.key: e.count for e in profile.key_averages() if e.key.startswith("halo::")}
    assert calls == {"halo::send_rows": layers, "halo::return_rows": layers}, calls


@pytest.mark.parametrize("budget", [None, 0.3], ids=["default", "recompute"])
def test_an_expert_parallel_layer_compiles_to_one_graph(budget):
    """The dispatch reads its split sizes back inside custom operators, so a compiled EP layer has no
    graph break (each one cost a return to eager Python in every frame of the stack), trains as the
    eager one, and its backward, even where the activation budget recomputes, repeats no exchange."""
    from halo_core.testing.spawn import spawn

    with functorch_config.patch(activation_memory_budget=1.0):
        spawn(_expert_parallel_graphs, 2, budget)
