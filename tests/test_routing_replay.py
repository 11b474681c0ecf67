"""Routing replay on the tiny MoE: recorded experts chosen again after the weights moved, the gate weights still
live (the router keeps its gradient); without replay the choice differs."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from halo_core.rl.routing import RoutingReplay, RoutingReplayError
from launch_kit import TINY


def _model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY), dtype=torch.float32)


def _chosen(model):
    """What each experts module is handed: (top_k_index, top_k_weights) per layer, captured per forward."""
    seen = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: seen.append((args[1].clone(), args[2])))
             for n, m in model.named_modules() if n.endswith("mlp.experts")]
    return seen, hooks


def test_replay_chooses_the_recorded_experts_with_live_gate_weights():
    model = _model()
    replay = RoutingReplay.for_model(model)
    ids = torch.randint(3, 120, (2, 13))
    seen, hooks = _chosen(model)
    with replay.record() as routes:
        model(input_ids=ids)
    recorded = [index for index, _ in seen]
    with torch.no_grad():  # the policy moves: its routers now choose otherwise
        for name, router in replay.routers.items():
            router.weight.add_(torch.randn_like(router.weight))
    seen.clear()
    model(input_ids=ids)
    assert any(not torch.equal(a, b) for (a, _), b in zip(seen, recorded)), "the perturbation must change the live routing"
    seen.clear()
    with replay.replay(routes):
        loss = model(input_ids=ids, labels=ids).loss
    assert len(seen) == len(recorded)
    for layer, ((index, weights), expected) in enumerate(zip(seen, recorded)):
        assert torch.equal(index, expected), f"layer {layer}: replay chose other experts"
    loss.backward()
    for name, router in replay.routers.items():
        assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0, f"{name} got no gradient"
    for hook in hooks:
        hook.remove()


def test_replayed_gate_weights_are_the_live_router_probabilities_at_the_recorded_experts():
    """Qwen3-MoE's router: softmax, top-k, renormalised (norm_topk_prob); replayed on live scores."""
    model = _model()
    replay = RoutingReplay.for_model(model)
    ids = torch.randint(3, 120, (1, 9))
    with replay.record() as routes:
        model(input_ids=ids)
    name, router = next(iter(replay.routers.items()))
    captured = {}
    router.register_forward_hook(lambda mod, args, out: captured.update(hidden=args[0], out=out))
    with torch.no_grad():
        router.weight.mul_(-1.0)
    with replay.replay(routes):
        model(input_ids=ids)
    probs = torch.softmax(torch.nn.functional.linear(captured["hidden"].reshape(-1, router.hidden_dim), router.weight), dim=-1)
    index = routes[name][0][0]
    expected = probs.gather(-1, index)
    if router.norm_topk_prob:
        expected = expected / expected.sum(-1, keepdim=True)
    _, weights, chosen = captured["out"]
    assert torch.equal(chosen, index)
    torch.testing.assert_close(weights, expected)


def test_replay_without_recorded_routes_is_refused_with_the_router_named():
    replay = RoutingReplay.for_model(_model())
    with pytest.raises(RoutingReplayError, match="no recorded routes for router model.layers.0.mlp.gate"):
        with replay.replay({}):
            pass


def _bundled():
    from halo_core.registry import discover

    return [(record.family, model_type) for record in discover().records if record.ok for model_type in record.family.model_types]


@pytest.mark.slow  # every bundled family, in process: the largest share of the in-process tests
@pytest.mark.parametrize("family, model_type", _bundled(), ids=lambda x: x if isinstance(x, str) else "")
def test_replay_reaches_every_bundled_familys_routers(family, model_type):
    """No per-family code: every installed family's experts receive the recorded choice after its routers moved, and
    its routers still get gradients (a router the replay could not reach would be refused when recording)."""
    from halo_core.layout import find_moe_blocks
    from halo_core.tiny import tiny_family_model

    model = tiny_family_model(family, model_type)
    if not family.routing_replay:  # the declaration is checked by the kit; here: GRPO's replay refuses the family by name
        with pytest.raises(RoutingReplayError, match=f"family {family.name!r} declares routing_replay=False"):
            RoutingReplay.for_model(model)
        return
    replay = RoutingReplay.for_model(model)
    seen = []

    def capture(module, args, kwargs):  # the experts' integer input: the chosen experts, whatever the family calls it
        chosen = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and not a.is_floating_point()]
        # JetMoE's experts take their rows sorted by expert and each expert's count, a list.
        counts = [torch.tensor(a) for a in args if isinstance(a, list) and a and all(isinstance(n, int) for n in a)]
        # Llama 4's experts take every (expert, token) row, scaled by its score: the zero rows are the unchosen experts.
        seen.append(chosen[0].clone() if chosen else counts[0] if counts else args[0].abs().sum(-1) != 0)

    hooks = [getattr(block, family.experts).register_forward_pre_hook(capture, with_kwargs=True) for _, block in find_moe_blocks(model, family)]
    ids = torch.randint(3, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    with replay.record() as routes:
        model(input_ids=ids)
    recorded = list(seen)
    torch.manual_seed(1)
    with torch.no_grad():  # the policy moves, by about its own scale (more would saturate a softmax router)
        for router in replay.routers.values():
            for param in router.parameters():
                param.add_(2 * param.abs().mean().clamp(min=1e-2) * torch.randn_like(param))
    seen.clear()
    model(input_ids=ids)
    assert any(not torch.equal(a, b) for a, b in zip(seen, recorded)), "the perturbation must move the live routing"
    seen.clear()
    with replay.replay(routes):
        model(input_ids=ids, labels=ids).loss.backward()
    for hook in hooks:
        hook.remove()
    assert len(seen) == len(recorded) and all(torch.equal(a, b) for a, b in zip(seen, recorded)), "replay chose other experts"
    for name, router in replay.routers.items():
        assert sum(float(p.grad.abs().sum()) for p in router.parameters() if p.grad is not None) > 0, f"{name} got no gradient"
