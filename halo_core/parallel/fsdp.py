"""FSDP2 over what the other splits leave: the data-parallel ranks.

Experts are sharded over the ranks that hold the same expert block (``ep_replica`` and
``cp``). Where one rank alone holds its block (EP over every data-parallel rank) they stay
plain tensors outside FSDP: a one-rank unit would only copy them in and out of its buffers
three times a step and hold a second copy while it runs. Everything else is sharded over
all data-parallel ranks (not over ``tp``: TP ranks hold the same data, and DTensor TP
shards become the inner dimension of a 2-D layout), one FSDP unit per decoder layer (the
model's own ``_no_split_modules``; ``fsdp_unit_layers`` groups consecutive ones), one each for the
input embeddings (gathered for forward only: a lookup's backward needs no weight) and the
output head unless they share their weight, and the root (the final
norm and what else is left). The expert units divide their reduced
gradients by the data-parallel size rather than their own group's size, because each
expert block's gradient already sums its EP group's tokens (see ``grads``).
"""

from __future__ import annotations

import re
import types
import warnings

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

from halo_core.parallel.config import ParallelDims
from halo_core.parallel.mesh import DATA_DIMS, flat_name


def data_parallel_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The 1-D mesh of every rank that holds a different part of the batch (data- and context-parallel);
    TP ranks hold the same part and keep their own column/row shards (FSDP2 x TP on a 2-D layout)."""
    return mesh[DATA_DIMS]._flatten(flat_name(DATA_DIMS))


def expert_replica_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The 1-D mesh of the ranks holding the same block of experts."""
    return mesh["ep_replica", "cp"]._flatten("ep_replica_cp")


def _sum_only(module) -> None:
    # Every unit sums (no PREMUL_SUM, which gloo lacks); sync_gradients divides by the data-parallel size.
    module.set_gradient_divide_factor(1.0)
    module.set_force_sum_reduction_for_comms(True)


def _named_decoder_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules of the classes the model names in ``_no_split_modules`` (also once FSDP2 has subclassed them),
    each after the ones inside it: FSDP2 takes a unit's parameters from the modules inside it that are units
    already, and fails on one that an outer unit has taken (Qwen3-Omni names its audio encoder and the encoder's
    layers both)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    found: list[tuple[str, nn.Module]] = []

    def visit(prefix: str, module: nn.Module) -> None:
        for child_name, child in module.named_children():
            visit(f"{prefix}.{child_name}" if prefix else child_name, child)
        if prefix and any(cls.__name__ in names for cls in type(module).__mro__):
            found.append((prefix, module))

    visit("", model)
    return found


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's layer units (see ``_named_decoder_layers``), inner ones first, siblings in order."""
    return [module for _, module in _named_decoder_layers(model)]


def _units(model: nn.Module, unit_layers: int) -> list[list[nn.Module]]:
    """Consecutive sibling layers in groups of ``unit_layers`` (a group never spans two stacks)."""
    units: list[list[nn.Module]] = []
    parent = None
    for name, layer in _named_decoder_layers(model):
        here = name.rpartition(".")[0]
        if not units or here != parent or len(units[-1]) == unit_layers:
            units.append([])
        units[-1].append(layer)
        parent = here
    return units


def apply_fsdp(model: nn.Module, dims: ParallelDims, mesh: DeviceMesh, expert_modules: list[nn.Module], unit_layers: int = 1,
               expert_params: frozenset[str] = frozenset()) -> frozenset[str]:
    """``expert_params``: the names of the parameters EP shards (the layout's ``expert_params``).

    Returns the names of the parameters left outside FSDP2 (for the layout's ``outside_fsdp``): those of an experts
    module that every expert shares (MuseSpark's ``post_expert_norm``). Each rank's gradient for one of those comes
    from the rows its experts ran, sent from every rank, so it sums over all data-parallel ranks, not over the expert
    replicas the experts' unit reduces over; they stay whole, and ``sync_gradients`` sums them over ``dp``."""
    replicas = expert_replica_mesh(mesh)
    ignored = set()
    shared: set[str] = set()
    expert_tensors = {model.get_parameter(name) for name in expert_params}
    if replicas.size() == 1:  # each rank holds its experts alone: nothing to shard
        ignored = expert_tensors
    else:
        names = {id(p): n for n, p in model.named_parameters()}
        for experts in expert_modules:
            common = [p for p in experts.parameters() if p not in expert_tensors]
            shared |= {names[id(p)] for p in common if id(p) in names}
            fully_shard(experts, mesh=replicas, ignored_params=set(common))
            _sum_only(experts)
    dp_mesh = data_parallel_mesh(mesh)
    for unit in _units(model, unit_layers):
        fully_shard(unit if len(unit) > 1 else unit[0], mesh=dp_mesh, ignored_params=ignored)
        for layer in unit:
            _sum_only(layer)
    embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
    if embeddings is not None and (head is None or head.weight is not embeddings.weight):
        # Its own unit, resharded after forward: in the root it would stay gathered beside the head all step.
        fully_shard(embeddings, mesh=dp_mesh)
        _sum_only(embeddings)
        if _plain_lookup(embeddings):
            embeddings.set_unshard_in_backward(False)
        if head is not None and model.base_model is not model:
            _shard_head(model.base_model, head, dp_mesh)
    fully_shard(model, mesh=dp_mesh, ignored_params=ignored)
    _sum_only(model)
    # FSDP2 warns when a unit returns a view (the root does where a method reads the logits under CP, KTO's pooled
    # batch): the root is never resharded after forward, so backward needs no gathering, and the launcher tests hold
    # those layouts' losses and weights to one process's. Only the root's own class is filtered.
    warnings.filterwarnings("ignore", message=rf"FSDP2-wrapped module \((FSDP)?{re.escape(type(model).__name__.removeprefix('FSDP'))}\) returned a view tensor",
                            category=UserWarning)
    return frozenset(shared)


def _plain_lookup(embeddings: nn.Module) -> bool:
    """Whether the unit's backward reads no parameter (a lookup's gradient needs only the ids), so FSDP2
    need not gather it for backward. Not for subclasses with their own forward or parameters (a norm
    inside, as Inkling2's embeddings have, reads its weight in backward: sharded, it crashes)."""
    params = list(embeddings.parameters())
    return type(embeddings).forward is nn.Embedding.forward and len(params) == 1 and params[0] is embeddings.weight


def _shard_head(backbone: nn.Module, head: nn.Module, dp_mesh: DeviceMesh) -> None:
    """The output head as its own unit, gathered when the backbone's forward returns and resharded, its
    gradient reduce-scattered, as soon as the head's backward is done.

    TRL's fused head reads ``lm_head.weight`` without calling the head's forward, so the head stayed in
    the root unit, gathered with its unsharded gradient until the end of backward (1.16 GiB per GPU on
    the benchmark model, at the step's memory peak). Passing the backbone's last hidden state through
    an FSDP forward method of the head gives FSDP what a forward call would: the all-gather before the
    head is read, and a post-backward hook on its input, whose gradient is ready when the head's is."""
    fully_shard(head, mesh=dp_mesh, reshard_after_forward=False)  # read after the pass-through returns
    _sum_only(head)
    # FSDP2 warns that a unit returning a view "can cause backward to fail or produce wrong gradients": an
    # in-place op on the view would drop the hook that gathers the unit for backward. The pass-through returns
    # a view by construction (autograd hands back the input of FSDP's post-backward Function as one); the
    # model's head and TRL's fused loss read it out of place, and this unit stays gathered through backward
    # (reshard_after_forward=False) so it needs no gathering there. The launcher tests hold the resulting
    # weights to one process's. Only warnings naming the head's class (FSDP2 prefixes it with FSDP once the unit is
    # sharded) are filtered; any other unit's still shows.
    warnings.filterwarnings("ignore", message=rf"FSDP2-wrapped module \((FSDP)?{re.escape(type(head).__name__)}\) returned a view tensor", category=UserWarning)
    head.halo_gather = types.MethodType(_pass_through, head)
    register_fsdp_forward_method(head, "halo_gather")

    def gather_head(module, args, output):
        if isinstance(output, tuple):
            return (head.halo_gather(output[0]), *output[1:])
        output.last_hidden_state = head.halo_gather(output.last_hidden_state)
        return output

    backbone.register_forward_hook(gather_head)


def _pass_through(self, hidden_states):
    return hidden_states


def reshard_all(model: nn.Module) -> None:
    """Put every FSDP2 unit back to its sharded parameters. A forward without backward (TRL scoring the data
    with the policy before training, ``precompute_ref_log_probs``) leaves the root unit gathered, its
    ``named_parameters()`` plain tensors: an optimizer built then would step copies no forward reads."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
