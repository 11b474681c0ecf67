"""``plan_layout``: every rule of a parallel layout that needs only configs, checked in one place.

The launcher calls it before any process starts (with the model's config read from disk),
and ``parallelize`` calls it again on each rank before touching a module; ``parallelize``
then checks only what needs the real modules, through the same rule methods of the plan
(``check_experts``, ``check_expert_width``) fed with numbers read off the modules.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from halo_core.hf_config import text_config
from halo_core.errors import HaloError, LayoutError
from halo_core.parallel.config import OWN_NAMES, RUN_KEYS, ParallelConfig, ParallelDims, divisors, ep_degrees

#: Config fields that hold a MoE model's expert count and its experts' intermediate width.
EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
EXPERT_WIDTH_FIELDS = ("moe_intermediate_size", "intermediate_size")
#: ``torch._grouped_mm`` refuses operands whose strides are not multiples of 16 bytes.
GROUPED_MM_ALIGNMENT = 16


@dataclass(frozen=True)
class LayoutPlan:
    config: ParallelConfig
    dims: ParallelDims
    model_type: str | None
    #: The claiming family's registry record; ``None`` on the plain FSDP2 route.
    record: Any = None
    #: The token dispatcher class when ``ep > 1``.
    dispatcher_class: Any = None

    @property
    def splits(self) -> dict[str, int]:
        """The splits asked for with a degree above one."""
        return {s: getattr(self.dims, s) for s in ("ep", "etp", "tp", "cp") if getattr(self.dims, s) > 1}

    def check_experts(self, where: str, num_experts: int, works=None, names=OWN_NAMES) -> None:
        """``ep`` must divide the experts; name the degrees that would work on this world (and pass ``works(ep)``,
        every other rule, where given), calling ``ep`` ``names["ep"]``."""
        if num_experts % self.dims.ep:
            valid = [ep for ep in ep_degrees(num_experts, self.dims.dp, self.dims.etp) if works is None or works(ep)]
            ep = names["ep"]
            raise LayoutError(f"{where} has {num_experts} experts, which {ep}={self.dims.ep} does not divide; choose {ep} among {valid}", ("ep",))

    def check_expert_width(self, where: str, width: int, itemsize: int, grouped_mm: bool, works=None) -> None:
        """``etp`` must divide the experts' intermediate width, and under ``grouped_mm`` each slice must keep
        its rows 16-byte aligned; the fix names the ``etp`` that pass ``works(etp)`` (every other rule) where given."""
        etp = self.dims.etp
        if etp == 1:
            return
        if width % etp:
            fix = (f"choose etp among the divisors of {width}: {divisors(width)}" if works is None else
                   f"choose etp among {[d for d in divisors(width) if works(d)]} (the divisors of {width} that pass every rule on this world)")
            raise LayoutError(f"{where}: intermediate size {width} is not divisible by expert_tensor_parallel_size etp={etp}; {fix}", ("etp",))
        if grouped_mm and (width // etp * itemsize) % GROUPED_MM_ALIGNMENT:
            valid = [d for d in divisors(width) if (width // d * itemsize) % GROUPED_MM_ALIGNMENT == 0 and (works is None or works(d))]
            raise LayoutError(
                f"{where}: expert_tensor_parallel_size etp={etp} leaves slices of {width // etp} columns "
                f"({width // etp * itemsize} bytes at {itemsize} bytes an element), but grouped_mm needs rows of a multiple of "
                f"{GROUPED_MM_ALIGNMENT} bytes; choose etp among {valid}, or experts_implementation: eager", ("etp",)
            )


def uses_grouped_mm(experts_implementation: str | None) -> bool:
    """Whether experts run ``grouped_mm`` (transformers' default where none is named)."""
    return (experts_implementation or "grouped_mm") == "grouped_mm"


def first_field(model_config, fields: tuple[str, ...]) -> int | None:
    """The first of ``fields`` the (text) config sets to a non-zero value, else one of its sub-configs does
    (DBRX counts its experts in ``ffn_config``)."""
    text = text_config(model_config)
    found = next((getattr(text, f) for f in fields if getattr(text, f, None)), None)
    if found is None:
        subs = [getattr(text, key, None) for key in getattr(text, "sub_configs", {})]
        found = next((getattr(sub, f) for sub in subs if sub is not None for f in fields if getattr(sub, f, None)), None)
    return found


def plan_layout(config: ParallelConfig, model_config, registry, world: int, *, itemsize: int = 2,
                experts_implementation: str | None = None, experts_from_config: bool = True,
                trainable_splits: frozenset[str] | None = None, names=OWN_NAMES, _suggest: bool = True) -> LayoutPlan:
    """Resolve ``config`` on ``world`` ranks for a model of ``model_config`` (``None``: a hub id not read yet)
    and check every rule that needs no module; raise ``LayoutError`` naming the numbers and the fix.

    ``itemsize`` is the training dtype's element size (2 checks the stricter bf16 alignment);
    ``experts_implementation`` the one the run asks for (``None``: the model's default).
    ``experts_from_config=False`` leaves the expert count and width to the caller, which reads
    them off every MoE block (``parallelize``: blocks may differ, and their names make the message).
    ``trainable_splits``: the splits the caller's method trains (``None``: any); a fix suggests no other.
    ``names``: what a message calls a degree it refuses (``RUN_KEYS``: a run's YAML keys); a rule's ``LayoutError``
    carries the refused fields in ``fields`` as well.
    """
    from halo_core.adapt import check_splits
    from halo_core.context import ParallelContext
    from halo_core.parallel.dispatch import get_dispatcher
    from halo_core.parallel.tensor_parallel import check_head_split

    def works(ep: int, etp: int) -> bool:  # the same rules for the degrees a fix would suggest
        if trainable_splits is not None and any(n > 1 and s not in trainable_splits for s, n in (("ep", ep), ("etp", etp))):
            return False
        try:
            plan_layout(dataclasses.replace(config, ep=ep, etp=etp), model_config, registry, world, itemsize=itemsize,
                        experts_implementation=experts_implementation, experts_from_config=experts_from_config, _suggest=False)
        except HaloError:  # any refusal: a layout rule, the family's splits, the dispatcher
            return False
        return True

    dims = config.resolve(world, works if _suggest else None, names)
    if config.fsdp_unit_layers > 1 and not config.fsdp:
        raise LayoutError(
            f"fsdp_unit_layers={config.fsdp_unit_layers} groups FSDP units, but shard_parameters is false (no FSDP); remove one of the two",
            ("fsdp_unit_layers", "fsdp"),
        )
    model_type = getattr(model_config, "model_type", None)
    record = registry.family_record(model_type) if model_type else None
    plan = LayoutPlan(config, dims, model_type, record)
    wanted = plan.splits
    if wanted and model_type and record is None:
        asked = ", ".join(f"{s}={n}" for s, n in sorted(wanted.items()))
        ones = ", ".join(f"{s}=1" for s in sorted(wanted))
        fields = ", ".join(RUN_KEYS[s] for s in sorted(wanted))
        raise LayoutError(
            f"no installed family plugin claims model type {model_type!r}, so it trains with data parallelism (FSDP2) "
            f"only, not {asked}; set {ones} (in a run's YAML: {fields}) or install a plugin for {model_type!r}", tuple(sorted(wanted))
        )
    if record is not None:
        check_splits(registry, record, ParallelContext(family=record.family, model_type=model_type, model_config=model_config, dp=dims.dp, **wanted),
                     names)
    if dims.ep > 1:
        plan = dataclasses.replace(plan, dispatcher_class=get_dispatcher(config.ep_dispatcher))
    if model_config is not None:
        check_head_split(model_config, dims.tp, dims.cp, config.cp_attention)
    if model_config is not None and experts_from_config:
        experts = first_field(model_config, EXPERT_COUNT_FIELDS)
        if experts and dims.ep > 1:
            plan.check_experts("the model", experts, (lambda ep: works(ep, dims.etp)) if _suggest else None, names)
        width = first_field(model_config, EXPERT_WIDTH_FIELDS)
        if width:
            implementation = experts_implementation or getattr(model_config, "_experts_implementation", None)
            plan.check_expert_width("the experts", width, itemsize, uses_grouped_mm(implementation), (lambda etp: works(dims.ep, etp)) if _suggest else None)
    return plan
