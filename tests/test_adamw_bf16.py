"""AdamWBF16 on the CPU (its PyTorch implementation; the Triton kernel is checked against it on the GPU by bench/)."""

import copy

import pytest
import torch

from halo_core.optim import AdamWBF16
from halo_core.optim.rounding import stochastic_round


def stalling_problem():
    """Weights near 4, where a bf16 ulp is 2**-5: AdamW's steps of about lr=2e-3 are far below half of it."""
    g = torch.Generator().manual_seed(1)
    X = torch.randn(256, 32, generator=g)
    w0 = 4.0 + torch.rand(32, 1, generator=g)
    w_true = w0 + 0.5 * torch.randn(32, 1, generator=g)
    return X, X @ w_true, w0


def train(make_optimizer, dtype, steps=400):
    X, y, w0 = stalling_problem()
    w = torch.nn.Parameter(w0.clone().to(dtype))
    optimizer = make_optimizer([w])
    first = None
    for _ in range(steps):
        optimizer.zero_grad()
        loss = ((X @ w.float() - y) ** 2).mean()
        first = first if first is not None else loss.item()
        loss.backward()
        optimizer.step()
    return first, ((X @ w.float() - y) ** 2).mean().item()


def test_it_tracks_fp32_adamw_where_plain_bf16_stalls():
    _, fp32 = train(lambda p: torch.optim.AdamW(p, lr=2e-3, weight_decay=0), torch.float32)
    start, plain = train(lambda p: torch.optim.AdamW(p, lr=2e-3, weight_decay=0), torch.bfloat16)
    _, rounded = train(lambda p: AdamWBF16(p, lr=2e-3, weight_decay=0), torch.bfloat16)
    _, kahan = train(lambda p: AdamWBF16(p, lr=2e-3, weight_decay=0, kahan=True), torch.bfloat16)
    assert plain > 0.9 * start  # round-to-nearest bf16 loses every update
    assert fp32 < 0.2 * start
    assert rounded == pytest.approx(fp32, rel=0.35)
    assert kahan == pytest.approx(fp32, rel=0.05)


def test_on_fp32_parameters_it_is_adamw():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(64, 16))
    b = torch.nn.Parameter(a.detach().clone())
    reference = torch.optim.AdamW([a], lr=1e-2, weight_decay=0.1)
    ours = AdamWBF16([b], lr=1e-2, weight_decay=0.1)
    for step in range(20):
        grad = torch.randn(64, 16, generator=torch.Generator().manual_seed(step))
        a.grad, b.grad = grad.clone(), grad.clone()
        reference.step()
        ours.step()
    torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)


def test_stochastic_rounding_is_unbiased():
    quarter_ulp_above_one = torch.full((200_000,), 1.0 + 2.0**-9)  # bf16 ulp at 1.0 is 2**-7
    rounded = stochastic_round(quarter_ulp_above_one, key=12345).float()
    assert set(rounded.unique().tolist()) == {1.0, 1.0 + 2.0**-7}
    assert (rounded > 1).float().mean().item() == pytest.approx(0.25, abs=0.005)  # 5 sigma
    values = torch.randn(200_000) * 3
    assert (stochastic_round(values, key=7).float() - values).mean().abs().item() < 2e-4
    negative = stochastic_round(-quarter_ulp_above_one, key=99).float()
    assert (negative < -1).float().mean().item() == pytest.approx(0.25, abs=0.005)


def test_rounding_keeps_infinities_and_is_exact_on_bf16_values():
    x = torch.tensor([float("inf"), -float("inf"), 1.5, -2.0, 0.0])
    assert torch.equal(stochastic_round(x, key=3).float(), x)


def _steps(optimizer, param, first, count):
    for step in range(first, first + count):
        param.grad = torch.randn(param.shape, generator=torch.Generator().manual_seed(step)).to(param.dtype)
        optimizer.step()


def test_replicas_agree_and_a_resumed_run_continues_exactly():
    torch.manual_seed(0)
    start = torch.randn(128, 8).to(torch.bfloat16)
    straight = torch.nn.Parameter(start.clone())
    opt = AdamWBF16([straight], lr=1e-2, seed=5)
    _steps(opt, straight, 0, 20)

    replica = torch.nn.Parameter(start.clone())
    _steps(AdamWBF16([replica], lr=1e-2, seed=5), replica, 0, 20)
    assert torch.equal(replica, straight)

    resumed = torch.nn.Parameter(start.clone())
    first_half = AdamWBF16([resumed], lr=1e-2, seed=5)
    _steps(first_half, resumed, 0, 10)
    saved_state, saved_param = copy.deepcopy(first_half.state_dict()), resumed.detach().clone()
    restarted = torch.nn.Parameter(saved_param)
    second_half = AdamWBF16([restarted], lr=1e-2, seed=5)
    second_half.load_state_dict(saved_state)
    _steps(second_half, restarted, 10, 10)
    assert torch.equal(restarted, straight)

    other_seed = torch.nn.Parameter(start.clone())
    _steps(AdamWBF16([other_seed], lr=1e-2, seed=6), other_seed, 0, 20)
    assert not torch.equal(other_seed, straight)


def test_optimizer_state_is_half_of_fp32_adamw():
    bf16 = torch.nn.Parameter(torch.randn(1000, 10).to(torch.bfloat16))
    fp32 = torch.nn.Parameter(torch.randn(1000, 10))
    ours, theirs = AdamWBF16([bf16]), torch.optim.AdamW([fp32])
    for p, opt in ((bf16, ours), (fp32, theirs)):
        p.grad = torch.ones_like(p)
        opt.step()

    def state_bytes(opt):
        return sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0)

    assert state_bytes(ours) / bf16.numel() == 4 and state_bytes(theirs) / fp32.numel() == 8


def test_bad_hyper_parameters_are_refused():
    with pytest.raises(ValueError, match="invalid hyper-parameters lr=-1"):
        AdamWBF16([torch.nn.Parameter(torch.zeros(1))], lr=-1)


def test_a_gradient_scale_applies_to_the_next_step_only():
    torch.manual_seed(0)
    start = torch.randn(64, 16)
    scaled, handed = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    by_hand, folded = AdamWBF16([scaled], lr=1e-2, seed=3), AdamWBF16([handed], lr=1e-2, seed=3)
    for step in range(3):
        grad = torch.randn(64, 16, generator=torch.Generator().manual_seed(step))
        scaled.grad = grad * 0.3 if step == 1 else grad.clone()
        handed.grad = grad.clone()
        if step == 1:
            folded.scale_next_gradients(torch.tensor([0.3]))
        by_hand.step()
        folded.step()
        assert torch.equal(handed, scaled), step
    assert torch.equal(handed.grad, grad)  # the gradient itself is left as it was


def test_clipping_through_adamw_bf16_equals_clipping_the_gradients():
    from halo_core import ParallelConfig, parallelize
    from halo_core.parallel.grads import clip_grad_norm_
    from halo_core.tiny import tiny_model
    from halo_core.trainers.parts.optimizer import clip_gradients

    models = [parallelize(tiny_model("qwen3_moe", seed=4), ParallelConfig()) for _ in range(2)]
    generator = torch.Generator().manual_seed(9)
    for a, b in zip(*(m.parameters() for m in models)):
        a.grad = torch.randn(a.shape, generator=generator)
        b.grad = a.grad.clone()
    optimizers = [AdamWBF16(m.parameters(), lr=1e-2, weight_decay=0.1) for m in models]
    expected_norm = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in models[0].parameters()]))
    norm_in_place = clip_grad_norm_(models[0], 0.5)
    norm_folded = clip_gradients(models[1], optimizers[1], 0.5)
    assert norm_folded > 0.5 and torch.allclose(norm_folded, expected_norm, rtol=1e-5)
    assert torch.equal(norm_in_place, norm_folded)
    for optimizer in optimizers:
        optimizer.step()
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters()):
        assert torch.equal(a, b), name


def _owed_division(rank, world):
    from torch.distributed.tensor import DTensor

    from halo_core import ParallelConfig, parallelize, sync_gradients
    from halo_core.parallel.grads import clip_grad_norm_
    from halo_core.testing.compare import assert_close
    from halo_core.tiny import tiny_model
    from halo_core.trainers.parts.optimizer import clip_gradients

    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(rank))
    for max_norm in (0.05, float("inf")):
        divided, owing, folding = (parallelize(tiny_model("qwen3_moe", seed=4), ParallelConfig(ep=world)) for _ in range(3))
        for model in (divided, owing, folding):
            model(input_ids=ids, labels=ids).loss.backward()
        sync_gradients(divided)
        expected = clip_grad_norm_(divided, max_norm)
        owed = sync_gradients(owing, divide=False)
        assert owed == 1 / world
        assert_close(clip_grad_norm_(owing, max_norm, owed=owed), expected, f"norm, max_norm={max_norm}")
        for (name, a), b in zip(divided.named_parameters(), owing.parameters()):
            local = [g.to_local() if isinstance(g, DTensor) else g for g in (b.grad, a.grad)]
            assert_close(*local, f"{name}, max_norm={max_norm}")
        # AdamWBF16 takes the owed factor and the clipping into its step; against a step on the divided, clipped gradients
        stepped = [AdamWBF16(m.parameters(), lr=1e-2, weight_decay=0.1) for m in (divided, folding)]
        assert_close(clip_gradients(folding, stepped[1], max_norm, sync_gradients(folding, divide=False)), expected, "folded norm")
        for optimizer in stepped:
            optimizer.step()
        for (name, a), b in zip(divided.named_parameters(), folding.parameters()):
            assert_close(b.data, a.data, f"{name} after the folded step, max_norm={max_norm}")


@pytest.mark.slow  # two spawned ranks
def test_the_data_parallel_division_can_ride_on_the_clipping():
    """``sync_gradients(divide=False)`` leaves the sums and the owed 1/dp, which the clipping (or AdamWBF16's
    step) applies in its own multiply: the same gradients, norm and step as dividing first, one pass fewer."""
    from halo_core.testing.spawn import spawn

    spawn(_owed_division, 2)
