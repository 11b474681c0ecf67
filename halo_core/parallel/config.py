"""Parallel degrees: what the user asks for (``ParallelConfig``) and what it resolves to on a world (``ParallelDims``)."""

from __future__ import annotations

from dataclasses import dataclass

from halo_core.errors import LayoutError, WorldSizeError

SPLIT_NAMES = ("ep", "etp", "tp", "cp")
CP_ATTENTION = ("ulysses", "ring")
#: Each ``ParallelConfig`` field under the key a run's YAML (``HaloArguments``) gives it: the one list of layout fields,
#: which ``HaloArguments.parallel_config``, the launcher's messages and distill's ``teacher_*`` keys read.
RUN_KEYS = {"ep": "expert_parallel_size", "etp": "expert_tensor_parallel_size", "tp": "tensor_parallel_size",
            "cp": "context_parallel_size", "cp_attention": "context_parallel_attention", "ep_dispatcher": "ep_dispatcher",
            "fsdp": "shard_parameters", "fsdp_unit_layers": "fsdp_unit_layers"}
#: The splits under their own names: what a message calls them where the caller (``names=``) does not say otherwise.
OWN_NAMES = {s: s for s in SPLIT_NAMES}


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def ep_degrees(num_experts: int, dp: int, etp: int = 1) -> list[int]:
    """The ``ep`` that work: each rank holds a whole block of experts, and ``ep * etp`` ranks fit the data-parallel size."""
    return [d for d in divisors(num_experts) if dp % (d * etp) == 0]


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees of each split (1 = not split) and the expert token-dispatch back-end.

    Data parallelism is whatever the world has left: ``world = dp * cp * tp``; expert
    parallel groups are carved out of the data-parallel ranks (``dp % (ep * etp) == 0``),
    so EP does not reduce the number of batches processed per step.
    """

    ep: int = 1
    etp: int = 1
    tp: int = 1
    cp: int = 1
    ep_dispatcher: str = "torch"
    #: How a CP group computes attention: ``"ulysses"`` (heads scattered; head counts must divide by cp)
    #: or ``"ring"`` (keys/values passed round the ring; any head count).
    cp_attention: str = "ulysses"
    #: Shard parameters, gradients and optimizer state with FSDP2 over the data-parallel ranks;
    #: ``False`` keeps them replicated and ``sync_gradients`` all-reduces instead.
    fsdp: bool = True
    #: Consecutive decoder layers per FSDP2 unit. Each unit costs its own all-gather, reduce-scatter and
    #: about a millisecond of Python a pass (measured on the H200 machine); more layers a unit trade
    #: that for holding their unsharded parameters at once.
    fsdp_unit_layers: int = 1

    def resolve(self, world_size: int, works=None, names=OWN_NAMES) -> "ParallelDims":
        """Check the degrees against ``world_size``; raise ``LayoutError`` naming the numbers and the fix.

        ``works(ep, etp)``, where given, says whether those degrees pass every other rule (the model's expert count
        and width, the family's splits): the fix then names only those, not every divisor of the data-parallel size.
        ``names``: what a message calls a degree it refuses on its own (``RUN_KEYS`` in a run's words)."""
        for field in (*SPLIT_NAMES, "fsdp_unit_layers"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                meaning = "decoder layers per FSDP unit" if field == "fsdp_unit_layers" else "1 = not split"
                raise LayoutError(f"ParallelConfig.{names.get(field, field)}={value!r} must be a positive integer ({meaning})", (field,))
        if world_size % (self.cp * self.tp):
            raise WorldSizeError(
                f"world size {world_size} is not divisible by cp*tp = {self.cp}*{self.tp} = {self.cp * self.tp}; "
                f"choose cp and tp whose product divides {world_size} (divisors: {divisors(world_size)})", ("cp", "tp")
            )
        dp = world_size // (self.cp * self.tp)
        if dp % (self.ep * self.etp):
            fix = f"choose ep*etp among {divisors(dp)}"
            if works is not None:
                pairs = [(ep, etp) for ep in divisors(dp) for etp in divisors(dp // ep) if works(ep, etp)]
                if pairs:
                    shown = ", ".join(f"ep={ep} etp={etp}" for ep, etp in sorted(pairs, key=lambda p: (p[0] * p[1], p)))
                    fix = f"choose ep*etp among {sorted({ep * etp for ep, etp in pairs})} ({shown} {'pass' if len(pairs) > 1 else 'passes'} every rule for this model)"
            raise WorldSizeError(
                f"ep*etp = {self.ep}*{self.etp} = {self.ep * self.etp} does not divide the data-parallel size {dp} "
                f"(world {world_size} / (cp {self.cp} * tp {self.tp})); {fix}", ("ep", "etp")
            )
        if self.cp_attention not in CP_ATTENTION:
            raise LayoutError(f"ParallelConfig.cp_attention={self.cp_attention!r} is unknown; choose one of {list(CP_ATTENTION)}", ("cp_attention",))
        if not isinstance(self.fsdp, bool):
            raise LayoutError(f"ParallelConfig.fsdp={self.fsdp!r} must be true or false", ("fsdp",))
        return ParallelDims(world=world_size, dp=dp, ep=self.ep, etp=self.etp, tp=self.tp, cp=self.cp)


@dataclass(frozen=True)
class ParallelDims:
    """Validated degrees for one world size."""

    world: int
    dp: int
    ep: int = 1
    etp: int = 1
    tp: int = 1
    cp: int = 1

    @property
    def ep_replicas(self) -> int:
        """How many data-parallel indices hold the same block of experts (times ``cp`` ranks each)."""
        return self.dp // (self.ep * self.etp)

    def coordinates(self, rank: int) -> dict[str, int]:
        """A rank's position on each axis, ``tp`` fastest:
        rank = (((ep_replica * cp + cp_rank) * ep + ep_rank) * etp + etp_rank) * tp + tp_rank.

        EP x ETP groups are consecutive data-parallel indices
        (``dp = (ep_replica * ep + ep_rank) * etp + etp_rank``); the ranks of one CP or TP
        group share a data-parallel index and so one sample.
        """
        tp = rank % self.tp
        etp = (rank // self.tp) % self.etp
        ep = (rank // (self.tp * self.etp)) % self.ep
        cp = (rank // (self.tp * self.etp * self.ep)) % self.cp
        replica = rank // (self.tp * self.etp * self.ep * self.cp)
        return {"dp": (replica * self.ep + ep) * self.etp + etp, "ep": ep, "ep_replica": replica, "etp": etp, "cp": cp, "tp": tp}
