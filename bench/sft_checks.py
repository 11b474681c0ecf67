"""GPU equivalence checks ``sft_vs_trl.py`` runs before rows that switch on a kernel or compilation.

A speed-up is only worth timing if it computes the same thing on this GPU, so a row with
``+liger-moe`` or ``+compile`` is preceded by a comparison against transformers' own path.
"""

from __future__ import annotations

from pathlib import Path

import torch


def check_compiled_layers(config_path: Path, device: str = "cuda") -> dict:
    """GPU equivalence of ``compile_layers``: a one-layer model of the benchmark config, eager against
    compiled (with the activation budget the fastest row uses), same weights and tokens, bf16."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from halo_core import ParallelConfig, parallelize
    from halo_core.trainers.parts.compile import compile_decoder_layers

    config = AutoConfig.from_pretrained(config_path)
    config.num_hidden_layers = 1
    torch.manual_seed(0)
    with torch.device(device):
        eager = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
        compiled = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    compiled.load_state_dict(eager.state_dict())
    compile_decoder_layers(parallelize(compiled, ParallelConfig()), activation_memory_budget=0.5)
    ids = torch.randint(0, config.vocab_size, (1, 4096 if device == "cuda" else 64), device=device)
    losses = [model(input_ids=ids, labels=ids).loss for model in (eager, compiled)]
    for loss in losses:
        loss.backward()
    error = lambda a, b: float((a.float() - b.float()).norm() / b.float().norm())  # noqa: E731
    grads = {name: error(b.grad, a.grad) for (name, a), b in zip(eager.named_parameters(), compiled.parameters())
             if a.grad is not None and ("layers.0" in name or "lm_head" in name)}
    worst = max(grads, key=grads.get)
    del eager, compiled
    if device == "cuda":
        torch.cuda.empty_cache()
    loss_error = error(losses[1].detach(), losses[0].detach())
    if loss_error > 1e-2:  # bf16 rounding differs by far less; anything near this is a wrong compilation
        raise SystemExit(f"compiled layers disagree with eager ones: loss relative error {loss_error:.3g}")
    return {"compiled_vs_eager": {"loss": loss_error, "worst_gradient": worst, "its_error": grads[worst]}}


def check_kernels(config_path: Path) -> dict:
    """GPU equivalence of the kernels Halo can switch on, against transformers' own path, on this GPU."""
    from transformers import AutoConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    from halo_core.kernels import liger

    liger.register()
    config = AutoConfig.from_pretrained(config_path)
    torch.manual_seed(0)
    experts = Qwen3MoeExperts(config).cuda().to(torch.bfloat16)
    torch.nn.init.normal_(experts.gate_up_proj, std=0.02)
    torch.nn.init.normal_(experts.down_proj, std=0.02)
    tokens = torch.randn(4096, config.hidden_size, device="cuda", dtype=torch.bfloat16)
    index = torch.randn(4096, config.num_experts, device="cuda").topk(config.num_experts_per_tok).indices
    weights = torch.rand(4096, config.num_experts_per_tok, device="cuda", dtype=torch.bfloat16)
    results = {}
    for name in ("grouped_mm", liger.EXPERTS_IMPLEMENTATION):
        experts.config._experts_implementation = name
        x = tokens.clone().requires_grad_()
        out = experts(x, index, weights)
        out.float().square().sum().backward()
        results[name] = (out.detach().float(), x.grad.float(), experts.gate_up_proj.grad.float())
        experts.zero_grad()
    error = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    reference, fused = results["grouped_mm"], results[liger.EXPERTS_IMPLEMENTATION]
    return {"liger_moe_vs_grouped_mm": {"output": error(fused[0], reference[0]), "input_grad": error(fused[1], reference[1]), "gate_up_grad": error(fused[2], reference[2])}}


def check_overlapped_step(config_path: Path, steps: int = 3) -> dict:
    """GPU equivalence of ``overlap_optimizer_step``: a two-layer model of the benchmark config, bf16, no FSDP2 units,
    ``steps`` steps of AdamWBF16 with clipping, the step on the side stream against the step in line. Each step is a
    forward (its logits kept) and seeded gradients, not a backward: CUDA's backward kernels (the embedding's atomics)
    are not bitwise repeatable, the forward and the step are. The same kernels on the same inputs: logits and weights
    must agree bitwise (a forward that did not wait for its layer's step would read half-updated weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from halo_core import ParallelConfig, parallelize
    from halo_core.optim import AdamWBF16
    from halo_core.trainers.parts.optimizer import clip_gradients
    from halo_core.trainers.parts.overlap import OverlappedStep

    config = AutoConfig.from_pretrained(config_path)
    config.num_hidden_layers = 2
    torch.manual_seed(0)
    ids = [torch.randint(0, config.vocab_size, (1, 2048), device="cuda") for _ in range(steps + 1)]
    results = {}
    for overlapped in (False, True):
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
        model = parallelize(model, ParallelConfig(fsdp=False))
        optimizer = AdamWBF16(model.parameters(), lr=1e-3, seed=0)
        if overlapped:
            optimizer.overlap = OverlappedStep(model)
        logits = []
        draw = torch.Generator(device="cuda").manual_seed(1)
        for batch in ids:
            with torch.no_grad():
                logits.append(model(input_ids=batch).logits[0, -8:].clone())
            if len(logits) > steps:
                break
            for param in model.parameters():
                param.grad = torch.randn(param.shape, generator=draw, device="cuda", dtype=param.dtype)
            clip_gradients(model, optimizer, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if overlapped:
            optimizer.overlap.wait()
        results[overlapped] = ({n: p.detach().clone() for n, p in model.named_parameters()}, logits)
        del model, optimizer
    (weights, logits), (weights_overlapped, logits_overlapped) = results[False], results[True]
    differing = [n for n, w in weights.items() if not torch.equal(w, weights_overlapped[n])]
    differing += [f"logits of forward {i}" for i, (a, b) in enumerate(zip(logits, logits_overlapped)) if not torch.equal(a, b)]
    torch.cuda.empty_cache()
    if differing:
        raise SystemExit(f"the overlapped optimizer step differs from the step in line in {len(differing)} tensors, e.g. {differing[0]}")
    return {"overlapped_vs_in_line": {"tensors": len(weights), "forwards": len(logits), "differing": 0, "steps": steps}}


def checks_for(variants: list[str], config_path: Path, profile: str | None) -> dict:
    """The checks the requested rows call for (none for a profile)."""
    checks = check_kernels(config_path) if any("liger-moe" in v for v in variants) and not profile else {}
    if any("compile" in v for v in variants) and not profile:
        checks.update(check_compiled_layers(config_path))
    if any("overlap" in v for v in variants) and not profile:
        checks.update(check_overlapped_step(config_path))
    return checks


def start_measuring(config_path: Path, variants: list[str], profile: str | None) -> tuple[float, dict, dict]:
    """What every harness does before its rows: the bf16 matmul rate (for MFU), the model's config and the
    kernel checks, each printed. On a CPU there is no rate and no check: the run checks the harness only."""
    import json

    import torch

    from sft_report import matmul_rate

    gpu = torch.cuda.is_available()
    rate = matmul_rate() if gpu else float("nan")
    if gpu:
        torch.cuda.empty_cache()
    config = json.loads(Path(config_path).read_text())
    print(f"bf16 matmul rate: {rate / 1e12:.1f} TFLOP/s", flush=True)
    checks = checks_for(variants, config_path, profile) if gpu else {}
    if checks:
        print(f"kernel checks (relative error, bf16): {json.dumps(checks)}", flush=True)
    return rate, config, checks
