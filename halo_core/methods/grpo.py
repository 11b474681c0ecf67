"""Online GRPO with verifiable rewards: ``HaloGRPOTrainer(DistributedTrainerMixin, trl.GRPOTrainer)``, method ``grpo``.

TRL's trainer runs unchanged (its ``GRPOConfig`` keys, sampler, reward weighting, advantages, losses, metrics)
with three parts swapped in at its seams:

- **Rollouts** come from an engine named by ``rollout_engine`` (``halo.rollout_engines``; ``hf``, the built-in,
  generates in process on the laid-out model) through ``_generate_single_turn``. The engine's per-token
  log-probs feed TRL's own truncated importance-sampling correction (its ``vllm_importance_sampling_*`` keys),
  which TRL gates on ``use_vllm``: the gate is opened, TRL's vLLM client is never built.
- **Routing replay** (``routing_replay``, MoE models): the old-policy pass records every router's top-k choice
  (``RoutingReplay``); the choices travel with the batch as per-row tensors (TRL shuffles and splits the
  generation batch by rows) and the loss pass replays them, with gate weights from the live router.
- **Rewards** are named (``reward_funcs: [exact_answer, ...]``): the ``halo.rewards`` group, TRL's
  ``trl.rewards`` names, or a dotted import path, as TRL's ``grpo`` script takes them.

Every layout equals one process: the engine draws the whole data-parallel batch's tokens (``hf_engine``),
TRL's shuffle draws its permutation over the whole batch, and ``bnpo``'s per-rank token mean is rescaled to the
batch's. A TP group pools its prompts and generates, scores and trains on the pool together. CP is not offered
(generation runs whole sequences).
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import trl.trainer.grpo_trainer
from accelerate.utils import set_seed
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import split_pixel_values_by_grid, split_tensor_dict, unsplit_pixel_values_by_grid

from halo_core.errors import ConfigError
from halo_core.integrations.trl import reference_given
from halo_core.parallel.fsdp import reshard_all
from halo_core.parallel.layout_state import layout_of
from halo_core.rl import execution
from halo_core.rl.driver import RolloutDriver
from halo_core.rl.engines import SamplingParams, engine_factory, known_engines
from halo_core.rl.lookahead import Lookahead
from halo_core.rl.probe import probe_logprobs
from halo_core.rl.environments import check_tools, code_executors, load_environment, load_tools
from halo_core.rl.sandbox import REFUSAL, UNISOLATED, isolation
from halo_core.rl.rewards import load_rewards
from halo_core.rl.routing import RoutingReplay, RoutingReplayError, route_rows, row_routes
from halo_core.trainers.method import Method
from halo_core.trainers.mixin import DistributedTrainerMixin
from halo_core.trainers.run_config import RunConfig

_ROUTES = "halo_routes_"  # batch keys of the recorded routes, one per top-k call of a router's forward


@dataclass
class HaloGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus what picks the rollouts and rewards."""

    reward_funcs: list[str] = field(default_factory=list, metadata={
        "help": "Reward functions by name: the halo.rewards group (exact_answer, close_answer, equation_format, number_format, brevity, code_tests), TRL's trl.rewards "
                "names, or dotted import paths (my_lib.rewards.f). Required."})
    rollout_engine: str = field(default="hf", metadata={"help": "The rollout engine (halo.rollout_engines): hf generates in process on the laid-out model."})
    routing_replay: bool = field(default=True, metadata={
        "help": "MoE models: replay in the loss pass the experts every token was routed to when its old log-probs were taken "
                "(off for a family that declares routing_replay=False: its routers choose experts without torch.topk)."})
    reward_kwargs: dict = field(default_factory=dict, metadata={
        "help": "Arguments of named rewards, bound before training: {reward name: {argument: value}}, e.g. "
                "{llm_judge: {base_url: http://host:8000/v1, model: judge}}."})
    environment: str | None = field(default=None, metadata={
        "help": "A multi-turn environment by name (the halo.environments group: code_contests, mcp) or dotted path: "
                "TRL's environment_factory, its methods the tools the model may call."})
    environment_kwargs: dict = field(default_factory=dict, metadata={
        "help": "Keyword arguments of the environment's factory (TRL calls it with none), e.g. {server: [python, -m, my_pkg.server]} for mcp."})
    tools: list[str] = field(default_factory=list, metadata={
        "help": "Tool functions by name (the halo.tools group) or dotted path: TRL's tools, called between turns."})
    sandbox_unisolated: bool = field(default=False, metadata={
        "help": "Run model-written code (code_tests, the python tool, code_contests) without the sandbox's isolation where "
                "neither bwrap nor unshare works here; logged every time. Off: such a run is refused before start."})
    execution_backend: str = field(default="local", metadata={
        "help": "Where sandboxed code runs and is graded (code_tests, code_contests, the python tool): local, a pool on each "
                "trainer's machine; ray, Ray tasks on the cluster at ray_address."})
    execution_workers: int | None = field(default=None, metadata={
        "help": "execution_backend: local: sandboxed executions at once per process; empty: the CPUs the process may use."})
    ray_address: str | None = field(default=None, metadata={
        "help": "execution_backend: ray: the cluster, as ray.init takes it (auto, ray://head:10001); empty: RAY_ADDRESS, "
                "else a new local Ray instance."})
    tool_timeout_s: float | None = field(default=30.0, metadata={
        "help": "Seconds a tool call (an environment's methods included) may take; past it the model gets an error result."})
    engine_urls: list[str] = field(default_factory=list, metadata={
        "help": "Server engines (rollout_engine: vllm or sglang): the base URLs of the running servers, e.g. [http://gpu1:8000]."})
    max_staleness: int = field(default=0, metadata={
        "help": "Server engines: 0 generates each batch with the current weights; >= 1 generates the next batch while this one "
                "trains, its rollouts at most this many optimizer steps old (the importance-sampling correction covers the lag)."})
    weight_sync: str = field(default="full", metadata={
        "help": "Server engines: full sends every tensor after each step; sparse sends only the elements whose wire-dtype bits "
                "changed, as (index, value) pairs, with a full anchor every weight_sync_anchor_every syncs."})
    weight_sync_anchor_every: int = field(default=10, metadata={"help": "weight_sync: sparse: every Nth sync is full."})
    weight_sync_dtype: str = field(default="auto", metadata={
        "help": "The dtype weights travel (and are diffed) in: auto is bfloat16 when bf16 trains, else the parameters' dtype."})
    weight_sync_backend: str = field(default="auto", metadata={"help": "The weight-update group's backend: auto (nccl on GPU, else gloo), nccl or gloo."})
    engine_timeout_s: float = field(default=600.0, metadata={"help": "Server engines: seconds one request may take before it is retried."})
    engine_retries: int = field(default=3, metadata={"help": "Server engines: retries of a failed completion request (on the next server)."})

    def __post_init__(self):
        super().__post_init__()
        if self.use_vllm and self.vllm_mode == "server" and self.rollout_engine == "hf":
            # A TRL server-mode config: the same server, through Halo's vllm engine (TRL's client is never built).
            self.rollout_engine = "vllm"
            self.engine_urls = self.engine_urls or [self.vllm_server_base_url or f"http://{self.vllm_server_host}:{self.vllm_server_port}"]
            self.use_vllm = False


class HaloGRPOTrainer(DistributedTrainerMixin, GRPOTrainer):
    """TRL's GRPOTrainer on a Halo layout, its rollouts from a rollout engine."""

    halo_shared_batch = True  # a TP group pools its prompts before generating (_generate_and_score_completions)
    halo_compiles_reference = False  # its reference reaches TRL past the mixin (reference_given) and runs eager

    def __init__(self, *args, ref_model=None, **kwargs):
        config = kwargs["args"]
        if config.sandbox_unisolated:
            os.environ[UNISOLATED] = "1"  # read by the sandbox in this process and the ones it starts
        execution.configure(config.execution_backend, config.execution_workers, config.ray_address)
        kwargs.setdefault("reward_funcs", load_rewards(config.reward_funcs, config.reward_kwargs))
        if config.tools:
            kwargs.setdefault("tools", load_tools(config.tools, config.tool_timeout_s))
        if config.environment:
            os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # the environment key is the user's choice of TRL's experimental API
            kwargs.setdefault("environment_factory", load_environment(config.environment, config.tool_timeout_s, config.environment_kwargs))
        with reference_given(trl.trainer.grpo_trainer, ref_model):
            super().__init__(*args, **kwargs)
        self.use_vllm = True  # opens TRL's importance-sampling gate (see the module docstring); generation is ours
        self.vllm_mode = "server"  # not "colocate": TRL's tool loop would read its (absent) vLLM engine's max_model_len
        # TRL seeds each process apart (seed + rank) so that ranks sampling alone do not repeat each other; the engine
        # draws the whole batch at once, and needs every rank's generator where one process's is (rank 0's already is).
        set_seed(config.seed)
        self._halo_replay = _replay_for(self.model) if config.routing_replay else None
        self._halo_scoring = False
        self._halo_recorded = None
        self._halo_replaying = None
        self._halo_replay_on = ExitStack()
        group = layout_of(self.model).group("dp") if dist.is_initialized() else None
        engine = engine_factory(config.rollout_engine)(model=self.model, tokenizer=self._tokenizer, args=config,
                                                       generation_config=self.generation_config, group=group)
        self._halo_rollouts = RolloutDriver(self, engine)
        if self._halo_rollouts.server:
            self._halo_rollouts.sync(force=True)
            probe_logprobs(self)

    # -- rollouts ---------------------------------------------------------------------------

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if images is not None or multimodal_fields:
            raise NotImplementedError("Halo's GRPO takes text prompts; image inputs are not supported yet")
        # TRL's rows repeat each prompt num_generations times already: one completion per row.
        params = SamplingParams(num_generations=1, max_completion_length=self.max_completion_length, temperature=self.temperature,
                                top_p=self.top_p, top_k=self.top_k or 0)
        rollout = self._halo_rollouts.rollout(prompt_ids, params)
        return rollout.completion_ids, rollout.logprobs

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """The trainer's batches through a ``Lookahead``: the asynchronous loop reads the next generation batch early."""
        rollouts = self._halo_rollouts
        if rollouts.server and self.args.max_staleness >= 1:
            if rollouts.lookahead is None or rollouts.lookahead.iterator is not epoch_iterator:
                rollouts.lookahead = Lookahead(epoch_iterator)
            epoch_iterator = rollouts.lookahead
        return super().get_batch_samples(epoch_iterator, num_batches, device)

    def train(self, *args, **kwargs):
        try:
            result = super().train(*args, **kwargs)
            self._halo_rollouts.sync()  # the servers end on the trained policy
            return result
        finally:
            self._halo_rollouts.close()

    def _prepare_inputs(self, generation_batch):
        """TRL's, with the generation batch's shuffle drawn over the whole data-parallel batch (``_shuffle``), so
        every rank's generator stays where one process's is and the next rollout draws the same tokens."""
        if not self.model.training:
            return super()._prepare_inputs(generation_batch)
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            self._halo_rollouts.current_batch = generation_batch
            batch = split_pixel_values_by_grid(self._generate_and_score_completions(generation_batch))
            batches = split_tensor_dict(self._shuffle(batch), self.args.steps_per_generation)
            self._buffered_inputs = [unsplit_pixel_values_by_grid(b) for b in batches]
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _shuffle(self, batch: dict) -> dict:
        rows = len(batch["prompt_ids"])
        counts, start = [rows], 0
        if dist.is_initialized():  # over the ranks holding different rows (a TP group holds one pool)
            group = layout_of(self.model).group("dp")
            counts = [None] * dist.get_world_size(group)
            dist.all_gather_object(counts, rows, group=group)
            start = sum(counts[: dist.get_rank(group)])
        order = torch.randperm(sum(counts))
        mine = order[(order >= start) & (order < start + rows)] - start  # own rows, in the whole batch's order
        return {k: v if v is None or (isinstance(v, torch.Tensor) and v.ndim == 0) else
                (v[mine] if isinstance(v, torch.Tensor) else [v[i] for i in mine.tolist()]) for k, v in batch.items()}

    # -- routing replay -----------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs):
        inputs, tp = self._pool_over_tp(inputs)
        seen = self.state.num_input_tokens_seen
        self._halo_scoring, self._halo_recorded = True, None
        self._halo_rollouts.first_turn = True
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._halo_scoring = False
        if tp > 1:  # TRL counted every TP rank's copy of the pool
            self.state.num_input_tokens_seen = seen + (self.state.num_input_tokens_seen - seen) // tp
            self._metrics["train" if self.model.training else "eval"]["num_tokens"] = [self.state.num_input_tokens_seen]
        if self._halo_replay is not None:
            if self._halo_recorded is None:  # TRL took no old log-probs (one update per batch, no IS): record the routes now
                ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
                mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
                self._halo_scoring = True
                try:
                    with torch.no_grad():
                        self._get_per_token_logps_and_entropies(self.model, ids, mask, output["completion_ids"].size(1),
                                                                batch_size=self._halo_pass_rows())
                finally:
                    self._halo_scoring = False
            for call, rows in enumerate(self._halo_recorded):
                output[f"{_ROUTES}{call}"] = rows
        return output

    def _halo_pass_rows(self) -> int:
        """Rows per forward of the recording pass: the loss pass's, TRL's per-device batch of the mode (an evaluation's
        is ``per_device_eval_batch_size``), so each recorded call fits the call that replays it."""
        return self.args.per_device_train_batch_size if self.model.training else self.args.per_device_eval_batch_size

    def _pool_over_tp(self, rows: list[dict]) -> tuple[list[dict], int]:
        """A TP group's prompt rows joined in rank order, on every rank of the group: TP ranks run one forward together,
        so they generate, score and train on the same rows. TRL's reward gather then holds each pool once per TP rank
        (whole groups repeated: the same advantages) and its ``dapo`` normaliser the tokens as often, over as many
        processes: the quotients stay those of one process."""
        tp = layout_of(self.model).dims.tp
        if tp == 1:
            return rows, 1
        pieces = [None] * tp
        dist.all_gather_object(pieces, rows, group=layout_of(self.model).group("tp"))
        return [row for piece in pieces for row in piece], tp

    def _halo_logps(self, *args, **kwargs):
        """The log-prob pass itself, TRL's (fused LM head); a subclass that needs the loss pass's logits swaps it."""
        return super()._get_per_token_logps_and_entropies(*args, **kwargs)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, **kwargs):
        inner = self._halo_logps
        replay = self._halo_replay
        if replay is None or (self._halo_scoring and model is not self.model):
            return inner(model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, **kwargs)
        if self._halo_scoring:  # the old-policy pass: record
            with replay.record() as routes:
                result = inner(model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, **kwargs)
            reshard_all(self.model)
            self._halo_recorded = route_rows(routes, input_ids.shape[0])
            return result
        # Left on until the step's backward is done: checkpointed layers recompute their routers there.
        self._halo_replay_on.enter_context(replay.replay(row_routes(self._halo_replaying, list(replay.routers))))
        return inner(model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, **kwargs)

    def training_step(self, model, inputs, num_items_in_batch=None):
        try:
            return super().training_step(model, inputs, num_items_in_batch)
        finally:
            self._halo_replay_on.close()

    def prediction_step(self, *args, **kwargs):
        try:  # an evaluation batch has no backward: its replay ends with its loss, before the next batch generates
            return super().prediction_step(*args, **kwargs)
        finally:
            self._halo_replay_on.close()

    def _compute_loss(self, model, inputs):
        self._halo_replay_on.close()
        self._halo_replaying = [inputs[f"{_ROUTES}{call}"] for call in range(sum(k.startswith(_ROUTES) for k in inputs))]
        if model.training:  # a TP group's ranks share one pool: each counts its share
            mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            self._halo_meter.count({"attention_mask": mask / layout_of(self.model).dims.tp})
        loss = super()._compute_loss(model, inputs)
        if self.loss_type == "bnpo":
            # TRL divides by this rank's tokens; the batch's mean divides every rank's sum by the whole batch's.
            tokens = (inputs["completion_mask"] * inputs.get("tool_mask", 1)).sum().to(loss.dtype).clamp(min=1.0)
            total, shares = self.halo_batch_sum(tokens)
            loss = loss * tokens * shares / total
        return loss


def _replay_for(model) -> RoutingReplay | None:
    """The model's routers, or ``None`` for a model with no MoE blocks (nothing to replay)."""
    try:
        return RoutingReplay.for_model(model)
    except RoutingReplayError:
        return None


def _family_replays(run: RunConfig) -> bool:
    """Whether the run's family can replay its routing; refuses ``routing_replay: true`` written for one that cannot
    (left at the default, replay is off for it, as in stock TRL)."""
    from halo_core.registry import discover
    from halo_core.trainers.run_config import model_config_of

    config = model_config_of(run)
    record = discover().family_record(config.model_type) if config is not None else None
    if record is None or not record.ok or record.family.routing_replay:
        return True
    if run.trainer.get("routing_replay"):
        raise ConfigError(f"{run.source}: routing_replay: true, but family {record.name!r} declares routing_replay=False (its routers "
                          f"choose experts without torch.topk, where replay hooks in); set routing_replay: false")
    return False


def run(run: RunConfig) -> None:
    from halo_core.trainers.runtime import train

    train(run, HaloGRPOTrainer, HaloGRPOConfig, reference=lambda args: args.beta != 0.0)


def check(run: RunConfig, args, world: int = 1) -> None:
    """Rewards and engine by name (the generation batch against num_generations is GRPOConfig's own check, at the
    launch's world size)."""
    if not args.reward_funcs and not args.environment:  # an environment may own the reward (its get_reward)
        raise ConfigError(f"{run.source}: reward_funcs is empty; method 'grpo' needs at least one, e.g. reward_funcs: [exact_answer]")
    load_rewards(args.reward_funcs, args.reward_kwargs)
    check_tools(args)  # environment and tools by name, tool_timeout_s
    try:
        execution.check(args.execution_backend, args.execution_workers, args.ray_address)
    except ConfigError as exc:
        raise ConfigError(f"{run.source}: {exc}") from None
    running = code_executors(args)
    if running and not args.sandbox_unisolated and isolation() is None:
        raise ConfigError(f"{run.source}: {', '.join(running)}: {REFUSAL}")
    if args.rollout_engine not in known_engines():
        engine_factory(args.rollout_engine)  # raises, naming the key and the installed engines
    from halo_core.trainers.parts.data import first_rows

    for source in run.halo.dataset:
        for index, row in enumerate(first_rows(source) or ()):
            if row.get("image") is not None or row.get("images"):
                raise ConfigError(f"{run.source}: dataset {source.path!r} row {index + 1} has images; Halo's grpo generates from text "
                                  f"prompts only for now: drop the image columns, or train this data with stock TRL")
    _check_engine(run, args)
    if (args.tools or args.environment) and args.rollout_engine == "hf" and world > 1:
        # TRL's tool loop calls the engine again only for the rows that called a tool: ranks would enter the hf engine's
        # collectives a different number of times.
        raise ConfigError(f"{run.source}: tools or an environment with rollout_engine: hf train on one process only (--nproc 1); "
                          f"for more, use a server engine (rollout_engine: vllm or sglang)")
    replays = args.routing_replay and _family_replays(run)
    if replays and run.halo.compile_layers:
        # Replay's hooks on each router give the shared compiled layer a guard per layer (bench/grpo_vs_trl.py's run
        # hit dynamo's recompile limit), and whether a compiled router still sees the replaying mode is unproven.
        raise ConfigError(f"{run.source}: compile_layers: true with routing_replay: true is not supported yet; set "
                          f"compile_layers: false, or routing_replay: false")



def _check_engine(run: RunConfig, args) -> None:
    """The server-engine keys, before any process starts."""
    where = run.source
    if args.use_vllm and args.vllm_mode == "colocate":
        raise ConfigError(f"{where}: use_vllm: true with vllm_mode: colocate is not supported (Halo does not import vLLM); start a "
                          f"vLLM server and set rollout_engine: vllm and engine_urls: [http://HOST:PORT] (agent-docs/rl.md)")
    server = args.rollout_engine in ("vllm", "sglang")
    if server and not args.engine_urls:
        raise ConfigError(f"{where}: rollout_engine: {args.rollout_engine} needs engine_urls, the running servers' base URLs, e.g. "
                          f"engine_urls: [http://localhost:8000]")
    if args.engine_urls and args.rollout_engine == "hf":
        raise ConfigError(f"{where}: engine_urls is set but rollout_engine is hf (which generates in process); set rollout_engine: "
                          f"vllm or sglang, or drop engine_urls")
    for url in args.engine_urls:
        if not str(url).startswith(("http://", "https://")):
            raise ConfigError(f"{where}: engine_urls entry {url!r} is not an http(s) URL; write it as http://HOST:PORT")
    choices = {"weight_sync": ("full", "sparse"), "weight_sync_dtype": ("auto", "bfloat16", "float16", "float32"),
               "weight_sync_backend": ("auto", "nccl", "gloo")}
    for key, allowed in choices.items():
        if getattr(args, key) not in allowed:
            raise ConfigError(f"{where}: {key}: {getattr(args, key)!r} is not one of {', '.join(allowed)}")
    if args.weight_sync == "sparse" and args.rollout_engine == "sglang":
        raise ConfigError(f"{where}: weight_sync: sparse is not supported by SGLang servers (they take whole tensors); use "
                          f"weight_sync: full, or a vLLM server with Halo's worker extension")
    for key, low in (("max_staleness", 0), ("weight_sync_anchor_every", 1), ("engine_retries", 0)):
        if getattr(args, key) < low:
            raise ConfigError(f"{where}: {key}: {getattr(args, key)} must be at least {low}")
    if args.engine_timeout_s <= 0:
        raise ConfigError(f"{where}: engine_timeout_s: {args.engine_timeout_s} must be positive")
    if server and run.peft.get("use_peft"):
        raise ConfigError(f"{where}: use_peft: true with rollout_engine: {args.rollout_engine} is not supported yet (the servers need "
                          f"the merged weights, which Halo does not send); train LoRA with rollout_engine: hf, or full weights on a server")
    if args.max_staleness and not server:
        raise ConfigError(f"{where}: max_staleness: {args.max_staleness} needs a server engine (rollout_engine: vllm or sglang); the "
                          f"{args.rollout_engine} engine generates with the model being trained, so it cannot run ahead: set max_staleness: 0")


METHOD = Method(name="grpo", config_class=HaloGRPOConfig, run=run, trainer=HaloGRPOTrainer, splits=frozenset({"ep", "tp", "etp"}),
                columns=("prompt",), check=check)
