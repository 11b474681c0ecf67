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
