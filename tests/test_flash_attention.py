"""``attn_implementation: flash_attention_4``: refused before start where it cannot run; the run switches the model to
transformers' function; and Halo's operator-based function, not registered yet (``kernels/flash_attention.py``), checked
on the CPU with a reference kernel registered for the operators' CPU dispatch (layouts, scale, grouped heads, sinks, the
autograd rule, one compiled graph). The CUDA kernels themselves (flash-attn-4) are checked against an fp32 reference on
the GPU by ``bench/attention_kernels.py`` (``agent-docs/benchmarks.md``)."""

import math
import re

import pytest
import torch

from conftest import run_halo
from halo_core.errors import ConfigError
from halo_core.kernels import flash_attention
from halo_core.trainers.run_checks import check_run
from test_run_config import TINY, load


def _expand(q, k, v):
    groups = q.shape[2] // k.shape[2]
    return q.transpose(1, 2).double(), k.repeat_interleave(groups, 2).transpose(1, 2).double(), v.repeat_interleave(groups, 2).transpose(1, 2).double()


def _probabilities(q, k, sink, scale, causal):
    scores = (q @ k.transpose(2, 3)) * scale
    if causal:
        scores = scores.masked_fill(~torch.ones(scores.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    lse = torch.logsumexp(scores, -1)
    if sink is not None:  # the sink joins each row's normaliser, and adds no value
        lse = torch.logaddexp(lse, sink.double()[None, :, None])
    return torch.exp(scores - lse[..., None]), lse


def _cpu_forward(q, k, v, sink, scale, causal):
    """FlashAttention's contract in plain torch: [B, S, H, D] layouts, grouped key/value heads, per-head sinks;
    output and log-sum-exp [B, H, S]."""
    qh, kh, vh = _expand(q, k, v)
    p, lse = _probabilities(qh, kh, sink, scale, causal)
    return (p @ vh).transpose(1, 2).to(q.dtype).contiguous(), lse.float()


def _cpu_backward(dout, q, k, v, out, lse, sink, scale, causal):
    """The same contract's gradients, written out (a kernel runs below autograd): dV = P^T dO, dS = P (dO V^T - D),
    D = rowsum(dO * O), dQ = dS K scale, dK = dS^T Q scale, dsink = -sum over rows of P_sink D; grouped heads summed."""
    qh, kh, vh = _expand(q, k, v)
    p, lse = _probabilities(qh, kh, sink, scale, causal)
    do = dout.transpose(1, 2).double()
    o = p @ vh
    d = (do * o).sum(-1)
    ds = p * (do @ vh.transpose(2, 3) - d[..., None])
    dq, dk, dv = ds @ kh * scale, ds.transpose(2, 3) @ qh * scale, p.transpose(2, 3) @ do
    b, h, s, hd = dk.shape
    kv_heads = k.shape[2]
    dk, dv = (t.view(b, kv_heads, h // kv_heads, s, hd).sum(2) for t in (dk, dv))
    dsink = -(torch.exp(sink.double()[None, :, None] - lse) * d).sum((0, 2)).to(sink.dtype) if sink is not None else q.new_empty(0)
    return dq.transpose(1, 2).to(q.dtype).contiguous(), dk.transpose(1, 2).to(k.dtype).contiguous(), dv.transpose(1, 2).to(v.dtype).contiguous(), dsink


torch.library.register_kernel("halo::flash_attention_4", "cpu", _cpu_forward)
torch.library.register_kernel("halo::flash_attention_4_backward", "cpu", _cpu_backward)


class Attention(torch.nn.Module):
    def __init__(self, heads, kv_heads, head_dim):
        super().__init__()
        self.is_causal, self.num_key_value_groups, self.scaling = True, heads // kv_heads, head_dim**-0.5


def _inputs(heads=4, kv_heads=2, seq=12, head_dim=16, sinks=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, h, seq, head_dim, generator=g, dtype=torch.float64).requires_grad_() for h in (heads, kv_heads, kv_heads))
    sink = torch.nn.Parameter(math.log(seq) + torch.randn(heads, generator=g, dtype=torch.float64)) if sinks else None
    return Attention(heads, kv_heads, head_dim), q, k, v, sink


def _grads(out, *leaves):
    out.backward(torch.ones_like(out) * torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype))
    return [t.grad.clone() for t in leaves if t is not None]


def test_the_operators_declare_the_shapes_the_compiler_traces():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k = torch.empty(2, 16, 8, 64, dtype=torch.bfloat16), torch.empty(2, 16, 2, 64, dtype=torch.bfloat16)
        sink = torch.empty(8, dtype=torch.bfloat16)
        out, lse = torch.ops.halo.flash_attention_4(q, k, k, sink, 0.125, True)
        grads = torch.ops.halo.flash_attention_4_backward(out, q, k, k, out, lse, sink, 0.125, True)
    assert (out.shape, out.dtype, lse.shape, lse.dtype) == (q.shape, q.dtype, (2, 8, 16), torch.float32)
    assert [tuple(g.shape) for g in grads] == [(2, 16, 8, 64), (2, 16, 2, 64), (2, 16, 2, 64), (8,)]


def test_halos_function_equals_transformers_sdpa_with_grouped_heads():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module, q, k, v, _ = _inputs()
    out, _ = flash_attention.attention_forward(module, q, k, v, None, scaling=module.scaling)
    got = _grads(out, q, k, v)
    for t in (q, k, v):
        t.grad = None
    expected_out, _ = sdpa_attention_forward(module, q, k, v, None, scaling=module.scaling, is_causal=True)
    expected = _grads(expected_out, q, k, v)
    torch.testing.assert_close(out, expected_out)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


def test_halos_function_equals_gpt_oss_eager_attention_with_sinks():
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    module, q, k, v, sink = _inputs(sinks=True)
    out, _ = flash_attention.attention_forward(module, q, k, v, None, scaling=module.scaling, s_aux=sink)
    got = _grads(out, q, k, v, sink)
    for t in (q, k, v, sink):
        t.grad = None
    module.sinks = sink
    mask = torch.zeros(1, 1, 12, 12, dtype=torch.float64).masked_fill(~torch.ones(12, 12, dtype=torch.bool).tril(), torch.finfo(torch.float64).min)
    expected_out, _ = eager_attention_forward(module, q, k, v, mask, scaling=module.scaling)
    expected = _grads(expected_out, q, k, v, sink)
    torch.testing.assert_close(out, expected_out)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


def test_a_compiled_layer_keeps_the_operator_in_one_graph():
    """What ``compile_layers`` gains over transformers' own function, whose autograd function dynamo cannot trace."""
    module, q, k, v, sink = _inputs(sinks=True)
    eager, _ = flash_attention.attention_forward(module, q, k, v, None, scaling=module.scaling, s_aux=sink)
    compiled = torch.compile(lambda a, b, c, s: flash_attention.attention_forward(module, a, b, c, None, scaling=module.scaling, s_aux=s)[0],
                             fullgraph=True, backend="aot_eager")
    out = compiled(q, k, v, sink)
    torch.testing.assert_close(out, eager)
    assert _grads(out, q, k, v, sink)[3].abs().sum() > 0


@pytest.mark.parametrize(
    "arguments, packed",
    [
        ({"attention_mask": torch.ones(1, 1, 12, 12, dtype=torch.bool)}, False),  # padding: transformers unpads
        ({"sliding_window": 4}, False),
        ({"dropout": 0.1}, False),
        ({"position_ids": torch.arange(12)[None]}, True),  # documents may be packed: the position ids decide
    ],
    ids=["mask", "sliding-window", "dropout", "packed-documents"],
)
def test_other_cases_go_to_transformers_function_unchanged(monkeypatch, arguments, packed):
    import transformers.integrations.flash_attention as transformers_flash

    calls = []
    monkeypatch.setattr(transformers_flash, "flash_attention_forward", lambda *a, **kw: calls.append((a, kw)) or ("theirs", None))
    monkeypatch.setattr(flash_attention, "_packed_documents", packed)
    module, q, k, v, _ = _inputs()
    mask = arguments.pop("attention_mask", None)
    assert flash_attention.attention_forward(module, q, k, v, mask, scaling=0.25, **arguments)[0] == "theirs"
    (args, kwargs), = calls
    assert args[4] is mask and kwargs["scaling"] == 0.25 and all(kwargs[key] is value for key, value in arguments.items())


def test_position_ids_of_unpacked_rows_take_the_operator(monkeypatch):
    monkeypatch.setattr(flash_attention, "_packed_documents", False)
    module, q, k, v, _ = _inputs()
    out, _ = flash_attention.attention_forward(module, q, k, v, None, scaling=module.scaling, position_ids=torch.arange(12)[None])
    assert out.shape == (1, 12, 4, 16)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--attn_implementation=flash_attention_2"], "attn_implementation: 'flash_attention_2' is not one Halo trains with; choose one of ['sdpa', 'eager', 'flash_attention_4']"),
        (["--attn_implementation=flash_attention_4", "--expert_parallel_size=1", "--context_parallel_size=2"],
         "attn_implementation: flash_attention_4 with context_parallel_size or tensor_parallel_size above 1 is not supported yet"),
        (["--attn_implementation=flash_attention_4", "--bf16=false"], "attn_implementation: flash_attention_4 computes in bf16, and this run trains in float32 (bf16: false)"),
        (["--attn_implementation=flash_attention_4", "--bf16=true"], "attn_implementation: flash_attention_4 cannot run here: it needs a CUDA GPU of compute capability 9.0"),
    ],
)
def test_refused_before_start(overrides, message):
    if "cannot run here" in message and torch.cuda.is_available():
        pytest.skip("the machine has a GPU: what is refused depends on it")
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        check_run(load(overrides))
    assert "\n" not in str(caught.value)


def test_refused_where_flash_attn_4_is_not_installed(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert flash_attention.unavailable_reason() == "flash-attn-4 is not installed; pip install 'halo-core[fa4]'"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert "needs compute capability 9.0 or newer (Hopper), and this GPU is 8.0" in flash_attention.unavailable_reason()


def test_a_model_without_flash_support_is_refused(monkeypatch):
    from transformers import Qwen3MoeForCausalLM

    monkeypatch.setattr(flash_attention, "unavailable_reason", lambda: None)
    monkeypatch.setattr(Qwen3MoeForCausalLM, "_supports_flash_attn", False)
    with pytest.raises(ConfigError, match=re.escape("attn_implementation: flash_attention_4 is not supported by Qwen3MoeForCausalLM")):
        check_run(load(["--attn_implementation=flash_attention_4", "--bf16=true"]))


@pytest.mark.slow  # a fresh `halo` interpreter loading the stack
def test_sdpa_and_eager_pass_and_the_cli_refuses_in_one_line(tmp_path):
    check_run(load(["--attn_implementation=eager"]))
    check_run(load(["--attn_implementation=sdpa"]))
    result = run_halo("launch", "sft", str(TINY), "--nproc", "2", "--dry-run", "--", f"--output_dir={tmp_path / 'out'}", "--attn_implementation=flash_attn_4")
    assert result.returncode == 2 and "attn_implementation: 'flash_attn_4' is not one Halo trains with" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_the_run_switches_the_model_to_halos_function_under_transformers_name():
    """The key switches the built model and puts Halo's operator-based function in the registry (measured faster than
    transformers' own on an H100), told whether rows pack documents; other names leave the registry alone."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from halo_core.trainers.runtime import use_attention

    before = ALL_ATTENTION_FUNCTIONS["flash_attention_4"]
    switched = []
    model = type("Model", (), {"set_attn_implementation": lambda self, name: switched.append(name)})()
    try:
        use_attention(model, "eager")
        use_attention(model, None)
        assert ALL_ATTENTION_FUNCTIONS["flash_attention_4"] is before
        use_attention(model, "flash_attention_4", packed_documents=False)
        assert ALL_ATTENTION_FUNCTIONS["flash_attention_4"] is flash_attention.attention_forward and not flash_attention._packed_documents
        use_attention(model, "flash_attention_4", packed_documents=True)
        assert flash_attention._packed_documents
        assert switched == ["eager", "flash_attention_4", "flash_attention_4"]
    finally:
        ALL_ATTENTION_FUNCTIONS.register("flash_attention_4", before)


def test_register_puts_halos_function_under_transformers_name():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    before = ALL_ATTENTION_FUNCTIONS["flash_attention_4"]
    try:
        flash_attention.register(packed_documents=False)
        assert ALL_ATTENTION_FUNCTIONS["flash_attention_4"] is flash_attention.attention_forward and not flash_attention._packed_documents
    finally:
        ALL_ATTENTION_FUNCTIONS.register("flash_attention_4", before)
        flash_attention._packed_documents = True


def test_build_model_applies_the_key_to_every_attention_module():
    from types import SimpleNamespace

    from halo_core.parallel.config import ParallelConfig
    from halo_core.trainers.arguments import HaloArguments
    from halo_core.trainers.runtime import build_model
    from test_run_config import ROOT

    halo = HaloArguments(model_name_or_path=str(ROOT / "templates" / "tiny" / "model"), dataset=[], random_init=True, attn_implementation="eager")
    model = build_model(halo, SimpleNamespace(bf16=False, use_cpu=True, seed=0), ParallelConfig())
    implementations = {m.config._attn_implementation for m in model.modules() if type(m).__name__.endswith("Attention")}
    assert implementations == {"eager"}
    assert build_model(HaloArguments(**{**halo.__dict__, "attn_implementation": None}), SimpleNamespace(bf16=False, use_cpu=True, seed=0),
                       ParallelConfig()).config._attn_implementation == "sdpa"
