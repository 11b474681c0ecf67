"""Regional compilation: ``torch.compile`` on the forward of each decoder layer.

The decoder layers are the model's repeated blocks, so one compilation serves every layer
(PyTorch's regional-compilation recipe) and start-up stays at one layer's compile. Inductor
fuses the element-wise work between matrix products (norms, RoPE, routing, SwiGLU) and
launches the layer's kernels with far less Python per step. Module hooks (FSDP2's) stay
outside the compiled code. Under expert parallelism the layer stays one graph: the dispatch's
data-dependent all-to-all is a set of custom operators (``parallel/row_exchange``) whose
received row count the trace carries as a data-dependent size
(``capture_dynamic_output_shape_ops``, set here, process-wide).
"""

from __future__ import annotations

import types

import torch
from torch import nn
from torch._functorch import config as functorch_config

from halo_core.errors import LayoutError
from halo_core.parallel import row_exchange
from halo_core.parallel.fsdp import decoder_layers
from halo_core.parallel.layout_state import layout_of

#: Inductor fails tracing the DTensor layers of a TP layout (RecursionError in proxy tracing on the recompile with
#: dynamic shapes, torch 2.13; it looks like pytorch/pytorch#152954).
TP_UNSUPPORTED = "compile_layers does not work with tensor_parallel_size > 1 yet (torch.compile fails on the DTensor layers); set one of them off"


#: Every layer compile's options: inductor's joint-graph pass that keeps the EP exchanges for backward.
_OPTIONS = {"joint_custom_pre_pass": row_exchange.KeepExchangesForBackward()}


def compile_decoder_layers(model: nn.Module, activation_memory_budget: float | None = None, *, frozen: nn.Module | None = None) -> int:
    """Compile each decoder layer's ``forward`` in place (on a laid-out model); return how many layers.

    ``activation_memory_budget`` (0 to 1) sets PyTorch's process-wide budget for what the
    compiled forward saves for backward: selective recomputation, cheapest operations first.
    ``frozen``: a second laid-out model of the same architecture that only runs forward (a
    preference method's reference policy), its layers under the same compilation (its no-grad
    graph is one recompile); eager, its forward was a quarter of a DPO step on the 3B MoE.
    """
    if layout_of(model).dims.tp > 1:
        raise LayoutError(TP_UNSUPPORTED)
    if activation_memory_budget is not None:
        functorch_config.activation_memory_budget = activation_memory_budget
    # The expert dispatch's received row count is data (row_exchange): traced, not a graph break.
    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    layers = decoder_layers(model)
    trained = len(layers)
    if frozen is not None:
        layers = layers + decoder_layers(frozen)
    if not layers:
        raise LayoutError(
            f"compile_layers: {type(model).__name__} names no decoder layer class in _no_split_modules, so Halo cannot "
            f"tell which blocks repeat; set compile_layers: false"
        )
    # One torch.compile per forward function, bound to each layer: torch.compile called once per layer makes a
    # backend each time, and dynamo recompiles on every new backend (BACKEND_MATCH) until its recompile
    # limit (8), past which layers silently run eager (measured: a 16-layer model 13% slower, see benchmarks-history.md).
    compiled: dict = {}
    for layer in layers:
        forward = layer.forward
        function = getattr(forward, "__func__", None)
        if function is None or forward.__self__ is not layer:  # not a method of this layer: compiled on its own
            layer.forward = torch.compile(forward, options=_OPTIONS)
            continue
        if function not in compiled:
            compiled[function] = torch.compile(function, options=_OPTIONS)
        layer.forward = types.MethodType(compiled[function], layer)
    return trained
