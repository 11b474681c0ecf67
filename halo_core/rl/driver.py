"""The GRPO trainer's side of a rollout engine: weights in after each step, seeds, the next batch ahead, failures.

An engine that is the model (``shares_weights``, the ``hf`` engine) needs none of it and is called directly.
For a server engine:

- **weights**: before a rollout is asked for with newer weights than the servers hold, every rank gathers the
  full state (EP shards joined) and rank 0 streams it (``ServerEngine.update_weights``); at start-up, and after
  the last step, so the servers end on the trained policy;
- **seeds**: one per completion, from the run's seed, the generation's count and the completion's place in the
  whole data-parallel batch, so a layout's completions are one process's;
- **asynchrony** (``max_staleness`` >= 1): once a batch's rollouts are in, the next generation batch's prompts
  are sent; they come back while this batch trains and are used when their prompts come up, if at most
  ``max_staleness`` optimizer steps old (otherwise generated again);
- **failures**: the engine retries within bounds; a rollout that still fails stops every rank together after a
  checkpoint of the last completed step, resumable once the servers are back.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from halo_core.parallel.fsdp import reshard_all
from halo_core.parallel.layout_state import layout_of
from halo_core.rl.engines import SamplingParams
from halo_core.rl.lookahead import Lookahead, Prefetched
from halo_core.rl.server_engine import EngineError


class RolloutDriver:
    def __init__(self, trainer, engine):
        self.trainer, self.engine = trainer, engine
        self.synced_step = None
        self.generations = 0  # generation batches asked for (seeds)
        self.pending: Prefetched | None = None
        self.lookahead: Lookahead | None = None
        self.current_batch = None  # the generation batch being generated (found in the lookahead)
        self.first_turn = False
        self.turn = 0

    @property
    def server(self) -> bool:
        return not getattr(self.engine, "shares_weights", False)

    # -- weights ---------------------------------------------------------------------------

    def sync(self, force: bool = False) -> None:
        trainer = self.trainer
        if not self.server or (not force and self.synced_step == trainer.state.global_step):
            return
        from halo_core.parallel.state_dict import gather_full

        model = trainer.model
        # Frozen parameters are sent once, at start-up (buffers always: some change without gradients, e.g. a router's
        # correction bias). One tensor gathered at a time as the sender streams them: rank 0 never holds the model twice.
        frozen = set() if self.synced_step is None else {n for n, p in model.named_parameters() if not p.requires_grad}
        named = ((name, gather_full(model, [(name, tensor)]).get(name)) for name, tensor in model.state_dict().items() if name not in frozen)
        self._guard(lambda: self.engine.update_weights(named))
        self.synced_step = trainer.state.global_step
        report = getattr(self.engine, "last_sync", None)
        if report is not None and _rank() == 0:
            metrics = trainer._metrics["train"]
            metrics[f"sync/{report.kind}_bytes"].append(float(report.bytes))
            metrics["sync/seconds"].append(report.seconds)
            metrics["sync/elements"].append(float(report.elements))

    # -- seeds -----------------------------------------------------------------------------

    def seeds(self, rows: int, generation: int, turn: int = 0) -> list[int] | None:
        """A generation's first turn: seeds by place in the whole batch (every rank asks, together). Later turns of a
        multi-turn rollout (as many as this rank's own conversations need): by rank and row, without a collective."""
        if not self.server:
            return None
        group = layout_of(self.trainer.model).group("dp") if dist.is_initialized() else None
        start = 0
        if group is not None and dist.get_world_size(group) > 1:
            if turn:
                start = dist.get_rank(group) << 16
            else:
                counts = [None] * dist.get_world_size(group)
                dist.all_gather_object(counts, rows, group=group)
                start = sum(counts[: dist.get_rank(group)])
        base = hash((self.trainer.args.seed, generation, turn)) % (2**30)
        return [(base + start + i) % (2**31 - 1) for i in range(rows)]

    # -- rollouts --------------------------------------------------------------------------

    def rollout(self, prompt_ids: list[list[int]], params: SamplingParams):
        first, self.first_turn = self.first_turn, False
        self.turn = 0 if first else self.turn + 1
        # Whether a prefetched rollout is usable is each rank's own finding: every rank still runs the same collectives
        # (sync, the first turn's seeds, the failure flag) in the same order.
        taken = self._take(prompt_ids) if first and self.pending is not None else None
        self.sync()
        seeds = self.seeds(len(prompt_ids) * params.num_generations, self.generations - (0 if first else 1), self.turn)
        if first:
            rollout = self._guard(lambda: taken if taken is not None else self._generate(prompt_ids, params, seeds))
            self.generations += 1
            self._prefetch(params)
        else:  # a later turn's calls are as many as this rank's own conversations need: no collective there
            rollout = self._generate(prompt_ids, params, seeds)
        reshard_all(self.trainer.model)  # forwards without a backward leave FSDP2's root unit gathered
        return rollout

    def _generate(self, prompt_ids, params, seeds):
        if seeds is None:
            return self.engine.generate(prompt_ids, params)
        return self.engine.generate(prompt_ids, params, seeds=seeds)

    def _take(self, prompt_ids):
        pending, self.pending = self.pending, None
        stale = self.trainer.state.global_step - pending.version
        if pending.prompts != prompt_ids or stale > self.trainer.args.max_staleness:
            pending.future.cancel()
            try:
                pending.future.result()  # let it finish before the weights change under it
            except BaseException:
                pass
            return None
        try:
            rollout = pending.future.result()
        except EngineError:
            return None  # asked again now, with its retries
        self.trainer._metrics["train"]["async/staleness"].append(float(stale))
        return rollout

    def _prefetch(self, params: SamplingParams) -> None:
        trainer = self.trainer
        if not self.server or trainer.args.max_staleness < 1 or self.lookahead is None or self.current_batch is None:
            return
        upcoming = self.lookahead.after(self.current_batch, trainer.args.steps_per_generation * trainer.num_iterations)
        if upcoming is None:
            return
        rows, _ = trainer._pool_over_tp(upcoming)
        prompt_ids, _, _ = trainer._tokenize_prompts([row["prompt"] for row in rows])
        seeds = self.seeds(len(prompt_ids) * params.num_generations, self.generations)
        self.pending = Prefetched(prompt_ids, self.engine.submit(prompt_ids, params, seeds), trainer.state.global_step)

    # -- failures --------------------------------------------------------------------------

    def _guard(self, call):
        """``call()`` on every rank; if it fails on any, every rank saves a checkpoint and stops with the reason."""
        failure, result = None, None
        try:
            result = call()
        except EngineError as exc:
            failure = exc
        if dist.is_initialized():
            flag = torch.tensor([1 if failure else 0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=_cpu_group())
            failed = bool(flag.item())
        else:
            failed = failure is not None
        if not failed:
            return result
        trainer = self.trainer
        reason = str(failure) if failure else "another rank's rollout failed"
        if trainer.state.global_step == 0:  # nothing trained yet: nothing to save
            raise EngineError(reason)
        trainer._save_checkpoint(trainer.model, trial=None)
        where = f"{trainer.args.output_dir}/checkpoint-{trainer.state.global_step}"
        raise EngineError(f"{reason}; the run stopped with its last completed step saved in {where}: start the servers again "
                          f"and resume with resume_from_checkpoint: true")

    def close(self) -> None:
        if self.pending is not None:
            self.pending.future.cancel()
        self.engine.close()


_CPU_GROUP = None


def _cpu_group():
    """A gloo group over the world for small flags (the default group may be NCCL, which needs CUDA tensors)."""
    global _CPU_GROUP
    if _CPU_GROUP is None:
        _CPU_GROUP = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD
    return _CPU_GROUP


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0
