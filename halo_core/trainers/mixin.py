"""``DistributedTrainerMixin``: what a stock TRL/transformers trainer needs to run a Halo layout.

Mixed in ahead of the trainer (``class HaloSFTTrainer(DistributedTrainerMixin, SFTTrainer)``).
Each override delegates to one small part in ``halo_core.trainers.parts``; the rest
(data collation, loss, logging, scheduling, callbacks) is the stock trainer's.
"""

from __future__ import annotations

import os

from halo_core.integrations import transformers as _transformers_seams  # noqa: F401  (checks the Trainer methods overridden here)
from halo_core.kernels.liger import keep_experts_interface
from halo_core.parallel.config import ParallelConfig
from halo_core.parallel.fsdp import reshard_all
from halo_core.parallel.grads import global_grad_norm, sync_gradients
from halo_core.parallel.loading import load_into
from halo_core.trainers.parts import checkpoint, console, evaluation, model_card, global_batch, moe_aux, moe_bias, moe_load, nan_filter, nonfinite
from halo_core.parallel.layout_state import laid_out, layout_of
from halo_core.trainers.parts.context import split_for_shared_sample
from halo_core.trainers.parts.pool import pool_rows
from halo_core.trainers.parts.optimizer import build_adamw_bf16, clip_gradients, wants_adamw_bf16
from halo_core.trainers.parts.throughput import ThroughputMeter
from halo_core.trainers import recipe


def sharing(model) -> int:
    """How many ranks hold parts of (CP) or all of (TP) the same samples."""
    dims = layout_of(model).dims
    return dims.cp * dims.tp


class DistributedTrainerMixin:
    #: Whether the trainer's loss is a function of whole sequences (preference, reward, classification):
    #: a CP x TP group then pools its rows and every rank computes the pool's whole loss (``parts.pool``),
    #: instead of SFT's per-token parts that add up over the group.
    halo_sequence_loss: bool = False
    #: With ``halo_sequence_loss``: blocks of examples the collator stacks along rows (chosen, then rejected: 2).
    halo_row_groups: int = 1
    #: The trainer hands every rank of a CP x TP group the same rows itself (GRPO pools its prompts before it
    #: generates): the loss is computed as it is, with nothing split or pooled.
    halo_shared_batch: bool = False
    #: A reference policy the trainer takes as ``ref_model`` runs under the policy's compiled layers (``compile_layers``);
    #: GRPO hands its reference to TRL past the mixin (``reference_given``), and it runs eager.
    halo_compiles_reference: bool = True

    def __init__(self, *args, parallel_config: ParallelConfig | None = None, adamw_bf16_kahan: bool = False, compile_layers: bool = False,
                 activation_memory_budget: float | None = None, overlap_optimizer_step: bool = False, async_save: bool = False,
                 max_nonfinite_skips: int = 0, moe_bias_update_rate: float = 0.0, **kwargs):
        # A launched run's models come laid out and compiled (trainers/recipe.py); one built here directly is done now.
        owes_split = recipe.for_direct_trainer(kwargs, parallel_config or ParallelConfig(), compile_layers, activation_memory_budget)
        if kwargs.get("args") is not None:
            keep_experts_interface(kwargs["args"])
        self._halo_kahan = adamw_bf16_kahan
        self._halo_overlap = overlap_optimizer_step
        self._halo_meter = ThroughputMeter()
        self._halo_steps = nonfinite.StepGuard(max_nonfinite_skips)  # a non-finite loss or gradient norm stops the run (or skips)
        self._halo_staging = False
        self._halo_async = async_save
        self._halo_jobs = None  # while a checkpoint is assembled: the weights' and optimizer state's jobs
        self._halo_pending = None  # an asynchronous checkpoint still being written (checkpoint.AsyncSave)
        self._halo_owed = 1.0  # what the gradients still owe the data-parallel average (sync_gradients)
        super().__init__(*args, **kwargs)
        console.install(self)  # the console's log line wrapped (GRPO's ran past 1,200 characters); the logs themselves unchanged
        self._halo_nan_filter = self.args.logging_nan_inf_filter  # applied on the device (parts.nan_filter)
        self.args.logging_nan_inf_filter = False
        self._halo_moe = moe_load.install(self._halo_laid_out, layout_of(self.model))  # tokens per expert (parts.moe_load)
        moe_bias.attach(self, moe_bias_update_rate)  # aux-loss-free balancing, when asked
        moe_aux.install(self._halo_laid_out, self._halo_moe)  # the router's aux loss over the global batch
        reshard_all(self._halo_laid_out)  # a trainer's __init__ may have run forwards (precomputed reference log-probs)
        if owes_split:
            recipe.split_head(self)

    @property
    def _halo_laid_out(self):
        """The laid-out model: ``self.model``, or the Hugging Face model a wrapper trains (``layout_state.wrap``)."""
        return laid_out(self.model)

    def _halo_pad_token_id(self) -> int:
        tokenizer = getattr(self.processing_class, "tokenizer", self.processing_class)
        return getattr(tokenizer, "pad_token_id", None) or 0

    def halo_pool(self, inputs: dict) -> tuple[dict, "torch.Tensor"]:
        """The CP x TP group's rows joined (``halo_sequence_loss``), and this rank's rows in them."""
        return pool_rows(inputs, layout_of(self.model), self._halo_pad_token_id(), self.halo_row_groups)

    def halo_batch_sum(self, counts: "torch.Tensor") -> tuple["torch.Tensor", int]:
        """``counts`` over the rows this rank computes on (its CP x TP pool's with ``halo_sequence_loss``) summed over the
        data-parallel ranks, and their number. A loss normalised by the whole batch's count is a rank's share times that
        number: ``sync_gradients`` divides by it."""
        import torch.distributed as dist

        dims = layout_of(self.model).dims
        if dims.dp == 1:
            return counts, 1
        total = counts.detach().clone()
        dist.all_reduce(total, group=layout_of(self.model).group("dp"))
        return total, dims.dp

    # -- optimizer -------------------------------------------------------------------------

    def create_optimizer(self, model=None):
        if self.optimizer is None and wants_adamw_bf16(self.args):
            self.optimizer = build_adamw_bf16(self, self._halo_kahan)
            if self._halo_overlap:
                from halo_core.trainers.parts.overlap import OverlappedStep

                self.optimizer.overlap = OverlappedStep(self._halo_laid_out)
        return super().create_optimizer(model) if self.optimizer is None else self.optimizer

    # -- gradient sync and clipping ------------------------------------------------------

    def training_step(self, model, inputs, num_items_in_batch=None):
        self._halo_meter.count(inputs)
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._halo_steps.see_loss(loss)
        if self.accelerator.sync_gradients:  # last micro-batch of the accumulation window
            # Where the trainer clips next, the division by dp rides on the clipping's own multiply.
            self._halo_owed = sync_gradients(self._halo_laid_out, divide=not self.args.max_grad_norm > 0)
        # Logged as the mean over ranks. compute_loss divided each rank's loss by cp x tp: for a TP rank the
        # quotient is its share of its pool's loss, as at tp=1; a CP rank holds only its chunk's part, so cp times it.
        # A sequence-level loss is the pool's whole loss on every rank of the pool already.
        loss = loss if self.halo_sequence_loss else loss * layout_of(self.model).dims.cp
        # A step skipped for a non-finite loss leaves it out of the logged loss, whatever the user's filter says.
        return nan_filter.filtered(self, loss, self._halo_nan_filter or self._halo_steps.skipping)

    def evaluation_loop(self, *args, **kwargs):
        prefix = kwargs.get("metric_key_prefix", args[4] if len(args) > 4 else "eval")
        with nan_filter.users_flag(self.args, self._halo_nan_filter):
            return evaluation.loop(self, lambda: super(DistributedTrainerMixin, self).evaluation_loop(*args, **kwargs), prefix)

    def _load_best_model(self):
        evaluation.load_best(self)  # Halo's checkpoints: each rank reads its own shards

    # -- context and tensor parallelism ------------------------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        moe_load.begin(self, model, inputs)
        if not model.training and getattr(self, "_halo_eval_tokens", None) is not None and num_items_in_batch is None:
            return evaluation.loss(self, model, inputs, lambda i, n: self._halo_compute_loss(model, i, return_outputs, n), return_outputs)
        return self._halo_compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _halo_compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        shared_by = sharing(self.model)
        if shared_by == 1 or self.halo_shared_batch:
            return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        if self.halo_sequence_loss:
            counted = getattr(self, "_total_train_tokens", None)
            pooled, own = self.halo_pool(inputs)
            result = super().compute_loss(model, pooled, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
            if counted is not None and model.training and "attention_mask" in inputs:
                self._halo_count_own_tokens(counted, inputs["attention_mask"].sum())
            if return_outputs and not model.training:  # evaluation gathers predictions with this rank's own labels
                return result[0], evaluation.own_rows(result[1], own)
            return result
        split = split_for_shared_sample(inputs, layout_of(self.model), self._halo_pad_token_id())
        result = super().compute_loss(model, split, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        # The trainer scaled the loss by the world size for gradients averaged over every rank; Halo averages over
        # data-parallel ranks only (sync_gradients), and the cp x tp ranks of a pool share its samples: undo that factor.
        if return_outputs:
            return result[0] / shared_by, result[1]
        return result / shared_by

    def _halo_count_own_tokens(self, counted: int, own: "torch.Tensor") -> None:
        """TRL counted the pooled rows every rank of the CP x TP group computed on; count each rank's own batch."""
        self._total_train_tokens = counted + self.accelerator.gather_for_metrics(own.to(self.args.device)).sum().item()
        self._metrics["train"]["num_tokens"] = [self._total_train_tokens]

    def _clip_grad_norm(self, model):
        owed, self._halo_owed = self._halo_owed, 1.0
        return clip_gradients(self._halo_laid_out, self.optimizer, self.args.max_grad_norm, owed)

    def _get_grad_norm(self, model, grad_norm=None):
        grad_norm = global_grad_norm(self._halo_laid_out) if grad_norm is None else grad_norm
        self._halo_steps.see_step(self, grad_norm)  # called before every optimizer step, clipping or not
        return grad_norm

    # -- metrics ---------------------------------------------------------------------------

    def log(self, logs, *args, **kwargs):
        moe_aux.per_group_metric(self)
        if "loss" in logs:
            logs.update(self._halo_meter.drain(self.args.device))
            if self._halo_steps.skipped:
                logs["nonfinite_skips"] = self._halo_steps.skipped
            moe_load.log(self, logs)
        return super().log(logs, *args, **kwargs)

    def create_model_card(self, *args, **kwargs):
        super().create_model_card(*args, **kwargs)
        if self.is_world_process_zero():  # TRL writes the card on rank 0 only; it has no hub id for a random or local start
            model_card.rewrite(os.path.join(self.args.output_dir, "README.md"), self._halo_laid_out)

    # -- checkpoints -------------------------------------------------------------------------

    def _halo_wait_for_step(self) -> None:
        """Before the weights or the optimizer state are read outside a forward: the overlapped step is done."""
        overlap = getattr(getattr(self.optimizer, "optimizer", self.optimizer), "overlap", None)
        if overlap is not None:
            overlap.wait()

    def _halo_wait_for_save(self) -> None:
        """Before another save, and at the end of training: an asynchronous checkpoint still being written is in place."""
        pending, self._halo_pending = self._halo_pending, None
        if pending is not None:
            pending.wait()

    def save_model(self, output_dir=None, _internal_call=False):
        self._halo_wait_for_step()
        self._halo_steps.settle(self)  # the last step's flags, read before anything of it is written
        folder = output_dir or self.args.output_dir
        if self._halo_jobs is not None:  # a checkpoint's weights: written with its optimizer state (_save_checkpoint)
            self._halo_jobs += checkpoint.model_jobs(self._halo_laid_out, folder, self.processing_class, snapshot=self._halo_async)
            return
        self._halo_wait_for_save()
        checkpoint.save_model(self._halo_laid_out, folder, self.processing_class)
        if not _internal_call and checkpoint.rank() == 0:  # the run's result (checkpoints call in as internal): say where
            print(f"saved the model to {os.path.abspath(folder)}", flush=True)

    def _get_output_dir(self, trial):
        run_dir = super()._get_output_dir(trial)
        return checkpoint.staged_checkpoint_root(run_dir) if self._halo_staging else run_dir

    def _save_checkpoint(self, model, trial):
        self._halo_wait_for_save()
        nonfinite.check_before_checkpoint(self, self._halo_laid_out, self.optimizer)  # a non-finite checkpoint is never written
        self._halo_staging, self._halo_jobs = True, []
        try:
            with nan_filter.users_flag(self.args, self._halo_nan_filter):
                super()._save_checkpoint(model, trial)
            staged_root = self._get_output_dir(trial)
            jobs = self._halo_jobs
        finally:
            self._halo_staging, self._halo_jobs = False, None
        run_dir = self._get_output_dir(trial)
        name = f"checkpoint-{self.state.global_step}"
        if self.state.best_model_checkpoint == os.path.join(staged_root, name):
            # transformers recorded the best checkpoint where it was assembled: record where it will live, in the
            # checkpoint's own trainer state too (a resumed run forgets a best checkpoint whose folder is gone).
            self.state.best_model_checkpoint = os.path.join(run_dir, name)
            if self.args.should_save:
                self.state.save_to_json(os.path.join(staged_root, name, "trainer_state.json"))
        global_batch.record(self, os.path.join(staged_root, name))  # the global batch a resume keeps (launcher)
        self._halo_pending = checkpoint.write_checkpoint(run_dir, name, jobs, self.args.save_total_limit, self.state.best_model_checkpoint,
                                                         asynchronous=self._halo_async, step=self.state.global_step)

    def _save_optimizer_and_scheduler(self, output_dir):
        self._halo_wait_for_step()
        jobs = checkpoint.optimizer_jobs(self._halo_laid_out, self.optimizer, output_dir, snapshot=self._halo_async)
        if self._halo_jobs is not None:
            self._halo_jobs += jobs
        else:
            checkpoint.write_jobs(jobs, output_dir)
        if self.args.should_save:
            checkpoint.save_scheduler(self.lr_scheduler, output_dir)

    def _load_optimizer_and_scheduler(self, folder):
        if folder is None:
            return
        groups = checkpoint.load_optimizer(self._halo_laid_out, self.optimizer, folder)
        checkpoint.load_scheduler(self.lr_scheduler, folder, groups)
        nonfinite.check_resumed(self._halo_laid_out, self.optimizer, folder)  # weights (read before) and optimizer state

    def _load_rng_state(self, folder):
        # transformers reads it with weights_only=True (plain data only); this names the file if that refuses one.
        with checkpoint.no_code_from(os.path.join(folder or "", "rng_state*.pth")):
            super()._load_rng_state(folder)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        if layout_of(self.model).adapters is not None:
            from halo_core.lora.peft_format import load_adapter

            load_adapter(self._halo_laid_out, resume_from_checkpoint)  # the base is rebuilt as the run began; only adapters trained
        else:
            load_into(self._halo_laid_out, resume_from_checkpoint)
