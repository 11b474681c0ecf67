"""Self-Distilled Policy Gradient (arXiv 2606.04036): ``HaloSDPGTrainer(HaloGRPOTrainer)``, method ``sdpg``.

``L = L_GRPO + beta(k) * L_OPD``. The teacher is the policy itself under ``no_grad``, shown a privileged context
(``sdpg_context``, e.g. the gold answer) beside the prompt; ``L_OPD`` is a divergence between the student's and
the teacher's next-token distributions at every completion position of the student's own rollouts, counted for
rows whose advantage is positive (``sdpg_positive_only``) and divided by the whole batch's completion tokens (the
normaliser of TRL's ``dapo``), so every layout equals one process. GRPO's loss, its reference KL (``beta``) and
every GRPO key are TRL's, as in ``grpo``.

The divergence needs the student's full-vocabulary logits at the completion positions, which TRL's fused LM head
never forms: while ``beta(k) > 0`` the loss pass runs the model's own LM head instead (``_halo_logps``), the
``[rows, completion, vocab]`` logits kept as stock GRPO without the fused head keeps them. A step whose
``beta(k)`` is 0 runs TRL's fused pass and no teacher forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from trl.trainer.utils import pad

from halo_core.errors import ConfigError
from halo_core.methods import grpo
from halo_core.methods.divergence import generalized_jsd
from halo_core.methods.grpo import HaloGRPOConfig, HaloGRPOTrainer
from halo_core.parallel.fsdp import reshard_all
from halo_core.trainers.method import Method
from halo_core.trainers.run_config import RunConfig

DIVERGENCES = ("reverse", "forward", "unnormalized")
DECAYS = ("constant", "linear", "cosine")
_IDS, _MASK = "halo_teacher_prompt_ids", "halo_teacher_prompt_mask"


@dataclass
class HaloSDPGConfig(HaloGRPOConfig):
    """``HaloGRPOConfig`` plus the self-distillation term."""

    sdpg_context: str = field(default="The correct answer is {answer}.", metadata={
        "help": "The privileged context the teacher view sees, formatted with the row's columns ({answer}); appended to the "
                "prompt's last user turn (a text prompt: to the prompt) after a blank line."})
    sdpg_divergence: str = field(default="reverse", metadata={
        "help": "reverse: KL(student || teacher) over the vocabulary; forward: KL(teacher || student); unnormalized: the "
                "sampled-token estimate r - 1 - log r, r = teacher / student probability of the drawn token."})
    sdpg_beta: float = field(default=1.0, metadata={"help": "The peak weight of the distillation term, beta(k)."})
    sdpg_warmup_steps: float = field(default=0.1, metadata={
        "help": "Steps over which beta(k) rises linearly from 0 to sdpg_beta; below 1: a fraction of max_steps."})
    sdpg_decay: str = field(default="linear", metadata={
        "help": "After the warm-up, beta(k) goes from sdpg_beta to sdpg_beta_final at max_steps: constant, linear or cosine."})
    sdpg_beta_final: float = field(default=0.0, metadata={"help": "beta(k) at the last step (sdpg_decay: linear or cosine)."})
    sdpg_positive_only: bool = field(default=True, metadata={"help": "Distil only on rows with a positive advantage."})


def beta_at(step: int, max_steps: int, peak: float, warmup: float, decay: str, final: float) -> float:
    """``beta(k)`` at optimizer step ``step`` (0-based): a linear warm-up from 0 (transformers' convention: step 0
    weighs 0), then ``decay`` to ``final`` at ``max_steps``."""
    warm = round(warmup * max_steps) if 0 < warmup < 1 else int(warmup)
    if step < warm:
        return peak * step / warm
    if decay == "constant" or max_steps <= warm:
        return peak
    progress = min(1.0, (step - warm) / (max_steps - warm))
    shape = 1 - progress if decay == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
    return final + (peak - final) * shape


def distillation_terms(student_logits: torch.Tensor, teacher_logits: torch.Tensor, completion_ids: torch.Tensor,
                       divergence: str) -> torch.Tensor:
    """``[rows, T, V]`` logits (already divided by the sampling temperature) -> ``[rows, T]`` per-token terms.
    ``unnormalized`` is differentiable through the student's log-probability of the drawn token only."""
    if divergence == "reverse":
        return generalized_jsd(student_logits, teacher_logits.detach(), beta=1.0)
    if divergence == "forward":
        return generalized_jsd(student_logits, teacher_logits.detach(), beta=0.0)
    drawn = completion_ids.unsqueeze(-1)
    student = F.log_softmax(student_logits.float(), dim=-1).gather(-1, drawn).squeeze(-1)
    teacher = F.log_softmax(teacher_logits.detach().float(), dim=-1).gather(-1, drawn).squeeze(-1)
    log_ratio = teacher - student
    return log_ratio.exp() - 1 - log_ratio


def with_context(prompt, context: str):
    """The teacher view's prompt: ``context`` after the last user turn's text (or after a text prompt)."""
    if isinstance(prompt, str):
        return f"{prompt}\n\n{context}"
    turns = [dict(turn) for turn in prompt]
    last = max((i for i, turn in enumerate(turns) if turn.get("role") == "user"), default=len(turns) - 1)
    content = turns[last]["content"]
    if isinstance(content, list):  # content blocks: one more text block
        turns[last]["content"] = [*content, {"type": "text", "text": f"\n\n{context}"}]
    else:
        turns[last]["content"] = f"{content}\n\n{context}"
    return turns


class HaloSDPGTrainer(HaloGRPOTrainer):
    """Halo's GRPO trainer plus the self-distillation term; the mixin comes with ``HaloGRPOTrainer``."""

    def __init__(self, *args, **kwargs):
        self._halo_rows = None
        self._halo_keep_logits = False
        self._halo_student_logits = None
        super().__init__(*args, **kwargs)

    def _pool_over_tp(self, rows):
        rows, tp = super()._pool_over_tp(rows)
        self._halo_rows = rows  # the rows TRL scores, in its order: the teacher prompts are built from them
        return rows, tp

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        context = self.args.sdpg_context
        prompts = [with_context(row["prompt"], context.format_map(row)) for row in self._halo_rows]
        ids = self._tokenize_prompts(prompts)[0]
        device = output["prompt_ids"].device
        ids = [torch.as_tensor(list(p), device=device) for p in ids]
        output[_IDS] = pad(ids, padding_value=self._tokenizer.pad_token_id, padding_side="left")
        output[_MASK] = pad([torch.ones_like(p) for p in ids], padding_value=0, padding_side="left")
        return output

    def _halo_logps(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
                    compute_aux_loss=False, **kwargs):
        if not self._halo_keep_logits:
            return super()._halo_logps(model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                                       compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **kwargs)
        logits, aux_loss = self._completion_logits(model, input_ids, attention_mask, logits_to_keep, compute_aux_loss)
        self._halo_student_logits = logits
        logps = F.log_softmax(logits, dim=-1)
        per_token = logps.gather(-1, input_ids[:, -logits_to_keep:].unsqueeze(-1)).squeeze(-1)
        entropy = -(logps.exp() * logps).sum(-1) if compute_entropy else None
        return per_token, entropy, aux_loss

    def _completion_logits(self, model, input_ids, attention_mask, logits_to_keep, aux=False):
        """The model's own LM head at the completion positions, float32, over the sampling temperature."""
        extra = {"output_router_logits": True} if aux else {}
        with self.accelerator.autocast():
            out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep + 1, use_cache=False, **extra)
        return out.logits[:, :-1].float() / self.temperature, (out.aux_loss if aux else None)

    def _compute_loss(self, model, inputs):
        args = self.args
        beta = beta_at(self.state.global_step, self.state.max_steps, args.sdpg_beta, args.sdpg_warmup_steps, args.sdpg_decay,
                       args.sdpg_beta_final) if model.training else 0.0
        if beta == 0.0:
            return super()._compute_loss(model, inputs)
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        with torch.no_grad():  # the teacher view: the same policy, the privileged prompt, the student's completion
            teacher, _ = self._completion_logits(model, torch.cat([inputs[_IDS], completion_ids], dim=1),
                                                 torch.cat([inputs[_MASK], completion_mask], dim=1), completion_ids.size(1))
        reshard_all(self.model)
        self._halo_keep_logits = True
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._halo_keep_logits = False
        student, self._halo_student_logits = self._halo_student_logits, None
        terms = distillation_terms(student, teacher, completion_ids, args.sdpg_divergence)
        mask = completion_mask * inputs.get("tool_mask", 1)
        advantages = inputs["advantages"]
        if args.sdpg_positive_only:
            mask = mask * (advantages.unsqueeze(1) if advantages.dim() == 1 else advantages).gt(0)
        # TRL's dapo normaliser: the generation batch's completion tokens, per process and accumulation window.
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        normalizer = normalizer * self.current_gradient_accumulation_steps / args.steps_per_generation
        term = (terms * mask).sum() / normalizer
        counted = self.accelerator.gather(torch.stack([(terms.detach() * mask).sum(), mask.sum(), completion_mask.sum()]).unsqueeze(0)).sum(0)
        metrics = self._metrics["train"]
        metrics["sdpg/beta"].append(beta)
        metrics["sdpg/divergence"].append((counted[0] / counted[1].clamp(min=1)).item())
        metrics["sdpg/distilled_fraction"].append((counted[1] / counted[2].clamp(min=1)).item())
        return loss + beta * term


def run(run: RunConfig) -> None:
    from halo_core.trainers.runtime import train

    train(run, HaloSDPGTrainer, HaloSDPGConfig, reference=lambda args: args.beta != 0.0)


def check(run: RunConfig, args, world: int = 1) -> None:
    """GRPO's checks, the term's keys, and the context's columns on the first rows."""
    where = run.source
    if args.tools or args.environment:
        raise ConfigError(f"{where}: tools or an environment with method 'sdpg' are not supported yet (the teacher view would need "
                          f"each turn's tool results); train multi-turn rollouts with method 'grpo'")
    grpo.check(run, args, world)
    for key, allowed in (("sdpg_divergence", DIVERGENCES), ("sdpg_decay", DECAYS)):
        if getattr(args, key) not in allowed:
            raise ConfigError(f"{where}: {key}: {getattr(args, key)!r} is not one of {', '.join(allowed)}")
    for key in ("sdpg_beta", "sdpg_beta_final", "sdpg_warmup_steps"):
        if getattr(args, key) < 0:
            raise ConfigError(f"{where}: {key}: {getattr(args, key)} must be 0 or above")
    if args.temperature <= 0:
        raise ConfigError(f"{where}: temperature: {args.temperature} must be above 0 (the divergence divides the logits by it)")
    from halo_core.trainers.parts.data import first_rows

    for source in run.halo.dataset:
        for index, row in enumerate(first_rows(source) or ()):
            try:
                args.sdpg_context.format_map(row)
            except KeyError as missing:
                raise ConfigError(f"{where}: sdpg_context {args.sdpg_context!r} reads column {missing.args[0]!r}, which dataset "
                                  f"{source.path!r} row {index + 1} lacks (columns: {', '.join(sorted(row))}); add the column or "
                                  f"change sdpg_context") from None
            except (ValueError, IndexError, AttributeError) as error:
                raise ConfigError(f"{where}: sdpg_context {args.sdpg_context!r} is not a format string over the row's columns "
                                  f"({error}); write the columns as {{answer}}") from None


METHOD = Method(name="sdpg", config_class=HaloSDPGConfig, run=run, trainer=HaloSDPGTrainer, splits=frozenset({"ep", "tp", "etp"}),
                columns=("prompt",), check=check)
