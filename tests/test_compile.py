"""Regional compilation (``compile_layers``): the compiled layers train exactly as the eager ones."""

import pytest
import torch
from torch._functorch import config as functorch_config

from halo_core import ParallelConfig, parallelize
from halo_core.errors import LayoutError
from halo_core.testing.compare import assert_close
from halo_core.tiny import tiny_model
from halo_core.trainers.parts.compile import compile_decoder_layers


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


def test_a_model_without_declared_layers_is_refused():
    model = parallelize(tiny_model("qwen3_moe"), ParallelConfig())
    model._no_split_modules = None  # as a custom model that declares no repeated block
    with pytest.raises(LayoutError, match="compile_layers: Qwen3MoeForCausalLM names no decoder layer class"):
        compile_decoder_layers(model)


def _expert_parallel_graphs(rank, world):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = parallelize(tiny_model("qwen3_moe", seed=2), ParallelConfig(ep=world))
    compile_decoder_layers(model)
    ids = torch.randint(0, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(rank))
    model(input_ids=ids, labels=ids).loss.backward()
    breaks = torch._dynamo.utils.counters["graph_break"]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    assert breaks and all("aten._local_scalar_dense" in reason for reason in breaks), dict(breaks)


def test_an_expert_parallel_layer_breaks_its_graph_only_for_the_split_sizes():
    """The dispatch's one host read-back (the all-to-all's split sizes) is the only graph break in a
    compiled EP layer; counting the pairs per expert must not add another (bincount did: a host sync
    and a return to eager Python per layer)."""
    from halo_core.testing.spawn import spawn

    spawn(_expert_parallel_graphs, 2)
