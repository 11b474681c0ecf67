"""Embedding models: ``HaloEmbedTrainer(DistributedTrainerMixin, SentenceTransformerTrainer)`` and the ``embed`` method.

The family's model as Halo builds and lays it out, under a stock ``SentenceTransformer`` (``embed_model``: a
``Transformer`` module reading its last hidden state, then ``Pooling``), trained with sentence-transformers' own
trainer, collator and losses. What Halo changes at the seams, each so that every layout equals one process:

- **Layout**: the Hugging Face model is laid out; ``layout_state.wrap`` records the ``SentenceTransformer`` around it, so
  the mixin's gradient sync, clipping and checkpoints go by the laid-out model's names.
- **In-batch negatives** (``MultipleNegativesRankingLoss`` and its cached form) are gathered over every rank
  (``gather_across_devices``, the world group: under EP every rank is data-parallel), so a rank's anchors rank against
  the whole global batch's candidates, as one process's do.
- **Saving** writes the plain Hugging Face checkpoint (``from_pretrained`` loads it) and the sentence-transformers
  files beside it (``SentenceTransformer(path)`` loads it).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

from halo_core.errors import ConfigError
from halo_core.trainers.method import Method
from halo_core.trainers.mixin import DistributedTrainerMixin
from halo_core.trainers.run_config import RunConfig

#: loss -> the columns its rows need, in order (the label column last); ``[x]`` is optional.
LOSSES = {
    "MultipleNegativesRankingLoss": ("anchor", "positive", "[negative]"),
    "CachedMultipleNegativesRankingLoss": ("anchor", "positive", "[negative]"),
    "TripletLoss": ("anchor", "positive", "negative"),
    "CoSENTLoss": ("sentence1", "sentence2", "score"),
    "AnglELoss": ("sentence1", "sentence2", "score"),
    "ContrastiveLoss": ("sentence1", "sentence2", "label"),
}
GATHERED = {"MultipleNegativesRankingLoss", "CachedMultipleNegativesRankingLoss"}


@dataclass
class EmbedConfig(SentenceTransformerTrainingArguments):
    """sentence-transformers' ``SentenceTransformerTrainingArguments`` plus the loss and the pooling."""

    loss: str = field(default="MultipleNegativesRankingLoss", metadata={"help": f"The sentence-transformers loss: {', '.join(LOSSES)}."})
    pooling: str = field(default="mean", metadata={"help": "How token embeddings become one: mean (over real tokens) or lasttoken."})
    matryoshka_dims: list[int] | None = field(default=None, metadata={
        "help": "Wrap the loss in MatryoshkaLoss over these leading dimensions of the embedding (each at most hidden_size)."})
    max_seq_length: int | None = field(default=None, metadata={"help": "Truncate each text to this many tokens; empty: the model's limit."})
    trust_remote_code: bool = field(default=False, metadata={
        "help": "Run a model folder's own modeling code (config.json auto_map, a model type transformers does not know), as TRL's configs take it."})
    mini_batch_size: int = field(default=32, metadata={"help": "CachedMultipleNegativesRankingLoss: rows per forward (GradCache)."})


def build_loss(model, args: EmbedConfig):
    from sentence_transformers.sentence_transformer import losses

    cls = getattr(losses, args.loss)
    if args.loss == "CachedMultipleNegativesRankingLoss":
        loss = cls(model, mini_batch_size=args.mini_batch_size, gather_across_devices=True)
    elif args.loss in GATHERED:
        loss = cls(model, gather_across_devices=True)
    else:
        loss = cls(model)
    if args.matryoshka_dims:
        loss = losses.MatryoshkaLoss(model, loss, matryoshka_dims=list(args.matryoshka_dims))
    return loss


def retrieval_evaluator(pairs, batch_size: int):
    """sentence-transformers' ``InformationRetrievalEvaluator`` over evaluation pairs: each anchor (first column) a
    query whose one relevant document is its own positive (second column), the others' positives the rest of the corpus.
    Every rank encodes the whole set in the same batches (the experts' exchanges stay in step), so every rank computes
    the same metrics, one process's."""
    from sentence_transformers.evaluation import InformationRetrievalEvaluator

    anchor, positive = pairs.column_names[:2]
    queries = {f"q{i}": text for i, text in enumerate(pairs[anchor])}
    corpus = {f"d{i}": text for i, text in enumerate(pairs[positive])}
    relevant = {f"q{i}": {f"d{i}"} for i in range(len(pairs))}
    return InformationRetrievalEvaluator(queries, corpus, relevant, name="retrieval", batch_size=batch_size, show_progress_bar=False,
                                         accuracy_at_k=[1, 5], precision_recall_at_k=[1, 5], mrr_at_k=[10], ndcg_at_k=[10], map_at_k=[10])


class HaloEmbedTrainer(DistributedTrainerMixin, SentenceTransformerTrainer):
    """sentence-transformers' trainer on a Halo layout, over a ``SentenceTransformer`` around the laid-out model."""

    def __init__(self, *args, model_name_or_path: str | None = None, **kwargs):
        from halo_core.methods.embed_model import sentence_transformer
        from halo_core.parallel.config import ParallelConfig
        from halo_core.parallel.layout_state import wrap
        from halo_core.trainers.parts.layout import lay_out

        config = kwargs["args"]
        inner = lay_out(kwargs["model"], kwargs.get("parallel_config") or ParallelConfig())
        _quiet_harmless()
        path = model_name_or_path or inner.config.name_or_path
        model = sentence_transformer(inner, path, config.pooling, config.max_seq_length)
        wrap(model, inner)
        kwargs["model"] = model
        kwargs.setdefault("loss", build_loss(model, config))
        if kwargs.get("eval_dataset") is not None and kwargs.get("evaluator") is None:
            kwargs["evaluator"] = retrieval_evaluator(kwargs["eval_dataset"], config.per_device_eval_batch_size)
        super().__init__(*args, **kwargs)

    def training_step(self, model, inputs, num_items_in_batch=None):
        # The mixin's throughput meter reads ``attention_mask``; the collator names one per column (``anchor_attention_mask``).
        masks = [v for k, v in inputs.items() if k.endswith("attention_mask")]
        if masks:
            self._halo_meter.count({"attention_mask": sum(m.sum() for m in masks)})
        return super().training_step(model, inputs, num_items_in_batch)

    def get_optimizer_cls_and_kwargs(self, args, model=None):
        """sentence-transformers' groups (the loss's parameters too), each split by device mesh as transformers splits its
        own: expert and FSDP2 parameters cannot share one fused kernel call."""
        from collections import defaultdict

        from torch.distributed.tensor import DTensor

        optimizer_cls, kwargs = super().get_optimizer_cls_and_kwargs(args, model)
        if "optimizer_dict" in kwargs:
            split = []
            for group in kwargs["optimizer_dict"]:
                by_mesh = defaultdict(list)
                for p in group["params"]:
                    by_mesh[p.device_mesh if isinstance(p, DTensor) else None].append(p)
                split.extend({**group, "params": params} for params in by_mesh.values())
            kwargs["optimizer_dict"] = split
        return optimizer_cls, kwargs

    def save_model(self, output_dir=None, _internal_call=False):
        from halo_core.methods.embed_model import save_modules
        from halo_core.trainers.parts import checkpoint

        folder = output_dir or self.args.output_dir
        super().save_model(output_dir, _internal_call)
        if checkpoint.rank() == 0:
            save_modules(self.model, folder)
        checkpoint.barrier()


def _quiet_harmless() -> None:
    """sentence-transformers' in-batch gather calls ``torch.distributed.nn.all_gather``, which torch 2.13 marks
    deprecated (FutureWarning) but still runs as before, gradients included; only that warning is filtered. (FSDP2's
    view-tensor warning from the root unit is filtered where the root is sharded, ``parallel/fsdp.py``.)"""
    warnings.filterwarnings("ignore", message=r"torch\.distributed\.nn\.functional\.all_gather is deprecated", category=FutureWarning,
                            module=r"sentence_transformers\.")


def run(run: RunConfig) -> None:
    from halo_core.trainers.runtime import train

    train(run, HaloEmbedTrainer, EmbedConfig, model_name_or_path=run.halo.model_name_or_path)


def check(run: RunConfig, args, world: int = 1) -> None:
    """The loss, its columns in every local source, the pooling and the Matryoshka dimensions, before start."""
    from halo_core.trainers.parts.data import first_rows
    from halo_core.trainers.run_config import model_config_of

    where = run.source
    if args.loss not in LOSSES:
        raise ConfigError(f"{where}: loss: {args.loss!r} is not a loss method 'embed' trains with; set loss to one of {', '.join(LOSSES)}")
    if args.pooling not in ("mean", "lasttoken"):
        raise ConfigError(f"{where}: pooling: {args.pooling!r} is not mean or lasttoken; set pooling: mean (or lasttoken)")
    wanted = LOSSES[args.loss]
    needed = [c for c in wanted if not c.startswith("[")]
    for source in run.halo.dataset:
        for index, row in enumerate(first_rows(source) or ()):
            missing = [c for c in needed if c not in row]
            extra = [c for c in row if c not in {w.strip("[]") for w in wanted}]
            if extra and not missing:  # sentence-transformers feeds every column but the label to the loss, in order
                raise ConfigError(
                    f"{where}: dataset {source.path!r} row {index + 1} has {', '.join(repr(c) for c in extra)} beside the columns "
                    f"loss {args.loss} reads ({', '.join(wanted)}); sentence-transformers would feed it to the loss as another "
                    f"text: drop it from the data (or rename it with the source's rename_columns: mapping)")
            if missing:
                raise ConfigError(
                    f"{where}: dataset {source.path!r} row {index + 1} lacks {', '.join(repr(c) for c in missing)} (has "
                    f"{', '.join(repr(c) for c in row)}); loss {args.loss} reads columns ({', '.join(wanted)}): rename them with the "
                    f"source's rename_columns: mapping, or pick a loss for these columns")
    if args.matryoshka_dims:
        config = model_config_of(run)
        hidden = config.get_text_config().hidden_size if config is not None else None
        for dim in args.matryoshka_dims:
            if not isinstance(dim, int) or dim < 1 or (hidden is not None and dim > hidden):
                raise ConfigError(f"{where}: matryoshka_dims: {list(args.matryoshka_dims)} has {dim!r}, not a dimension in "
                                  f"[1, {hidden}] (the model's hidden_size, its embedding's size); drop it or lower it")


# Splits: EP only (proven against one process by tests/test_embed.py). The in-batch negatives are gathered over the
# world group, which is the data-parallel group only while every rank holds different rows (not under CP or TP).
METHOD = Method(name="embed", config_class=EmbedConfig, run=run, trainer=HaloEmbedTrainer, splits=frozenset({"ep"}), check=check,
                formats="by `loss`: `anchor`, `positive`[, `negative`] (default)")

