"""Halo's own run fields (everything else in a run's YAML belongs to the method's TRL/transformers config)."""

from __future__ import annotations

from dataclasses import dataclass, field

from halo_core.parallel.config import RUN_KEYS, ParallelConfig


@dataclass
class DatasetSource:
    """One source of training data; the keys of TRL's ``DatasetConfig`` (``trl/scripts/utils.py``) in its meaning, plus
    ``rename_columns`` and ``weight`` (``parts/mixture.py`` mixes the sources)."""

    #: A local ``.jsonl``/``.json``/``.parquet`` file, a folder saved by ``datasets``, or a hub id (or a builder such as
    #: ``json`` with ``data_files``).
    path: str
    split: str = "train"
    #: Hub dataset configuration name.
    name: str | None = None
    #: ``datasets.load_dataset``'s ``data_dir`` and ``data_files``, as TRL passes them.
    data_dir: str | None = None
    data_files: str | list[str] | dict[str, str] | None = None
    #: TRL's meaning: the columns to keep (``select_columns``), before ``rename_columns``; empty keeps all.
    columns: list[str] | None = None
    #: Rename columns to what the method expects (``datasets.Dataset.rename_columns``), e.g. ``{question: prompt, answer: completion}``.
    rename_columns: dict[str, str] = field(default_factory=dict)
    #: TRL's meaning: this source's share of the mixture, its first rows kept so that no source is oversampled (all or none).
    fraction: float | None = None
    #: Sample the sources in proportion to their weights, seeded (``datasets.interleave_datasets``; all or none).
    weight: float | None = None
    #: Read the rows as training goes (``datasets``' streaming), for sources larger than memory or disk.
    streaming: bool = False


@dataclass
class HaloArguments:
    """Fields Halo adds to every method's config."""

    model_name_or_path: str
    dataset: list[DatasetSource]
    #: Evaluation data, in the same form as ``dataset`` (``parts/evaluation.py``).
    eval_dataset: list[DatasetSource] = field(default_factory=list)
    #: TRL's ``DatasetMixtureConfig.test_split_size``: a fraction (0 to 1) or a row count of the training sources held
    #: out as the evaluation set, drawn with the run's ``seed``.
    test_split_size: int | float | None = None
    #: TRL's ``ScriptArguments.dataset_test_split``: evaluate on this split of each ``dataset`` source (a hub dataset or
    #: a saved ``DatasetDict`` folder).
    dataset_test_split: str | None = None
    #: Start from the config's random initialisation instead of weights (the folder then needs only config.json).
    random_init: bool = False
    expert_parallel_size: int = 1
    expert_tensor_parallel_size: int = 1
    tensor_parallel_size: int = 1
    context_parallel_size: int = 1
    #: How a CP group computes attention: ``ulysses`` or ``ring``.
    context_parallel_attention: str = "ulysses"
    #: Expert token-dispatch back-end, by name in the ``halo.dispatchers`` entry-point group.
    ep_dispatcher: str = "torch"
    #: FSDP2 over the data-parallel ranks (parameters, gradients and optimizer state sharded); false keeps
    #: them whole on every rank and all-reduces the gradients after backward: more memory, fewer
    #: collectives and less Python a step.
    shard_parameters: bool = True
    #: Consecutive decoder layers per FSDP2 unit (fewer all-gathers and less Python a step, more
    #: unsharded parameters held at once); 1 = one unit per layer.
    fsdp_unit_layers: int = 1
    #: transformers' experts implementation (``grouped_mm``, ``eager``, ...; ``liger_moe`` with the GPU
    #: extra); empty = the model's default. Under EP it computes each rank's block.
    experts_implementation: str | None = None
    #: transformers' attention implementation (``sdpa``, ``eager``; ``flash_attention_4``: FlashAttention-4 on a Hopper
    #: GPU, the ``fa4`` extra, ``halo_core/kernels/flash_attention.py``); empty = the model's default.
    attn_implementation: str | None = None
    #: ``torch.compile`` each decoder layer (regional compilation: one compile serves every layer); fuses the
    #: element-wise work and most of the per-step Python. The first step compiles (tens of seconds).
    compile_layers: bool = False
    #: With ``compile_layers``: the share of the compiled layers' activations kept for backward (PyTorch's
    #: ``activation_memory_budget``); below 1.0 the backward recomputes the cheapest operations first.
    activation_memory_budget: float | None = None
    #: With ``use_peft``: also write the adapter merged into its base, a plain HF checkpoint, to ``OUTPUT_DIR/merged``
    #: (``halo export --merge`` does the same afterwards).
    merge_adapter: bool = False
    #: With ``bf16: true``: keep a bf16 Kahan compensation buffer per parameter (fp32-like accuracy, +2 bytes/param).
    adamw_bf16_kahan: bool = False
    #: With ``bf16: true`` on a GPU and ``shard_parameters: false``: run AdamWBF16's step on a side stream, layer by
    #: layer in forward order, so the next forward overlaps it (same weights, bitwise; ``parts/overlap.py``).
    overlap_optimizer_step: bool = False
    #: PyTorch's scaled-dot-product attention back-ends in the order to try them (``cudnn``, ``flash``, ``efficient``,
    #: ``math``); empty = PyTorch's own order. For ``sdpa`` attention: cuDNN's is often the fastest on Hopper.
    sdpa_backends: list[str] = field(default_factory=list)
    #: Write each ``checkpoint-N`` in the background from a host copy of every rank's part, while training goes on
    #: (as ``torch.distributed.checkpoint.async_save``); the folder appears once complete, and the next save and the
    #: end of training wait for it. Costs host memory for a rank's share of the weights and optimizer state.
    async_save: bool = False
    #: Steps whose loss or gradient norm is non-finite to skip (no update) before the run stops; 0 stops at the first.
    #: Skipping reads a flag back to the host every step (``parts/nonfinite.py``); stopping does not.
    max_nonfinite_skips: int = 0
    #: Start afresh into an ``output_dir`` that holds checkpoints or a model (refused otherwise: it would overwrite
    #: them); transformers 4's name and meaning, a key transformers 5 dropped.
    overwrite_output_dir: bool = False
    #: With sources' ``weight``: when the mixture ends, as ``datasets.interleave_datasets`` names it: ``first_exhausted``
    #: (when any source runs out; no row repeats) or ``all_exhausted`` (a source that runs out starts again until every
    #: source has been read once).
    dataset_stopping_strategy: str = "first_exhausted"
    #: DeepSeek-V3's auxiliary-loss-free balancing: after each optimizer step every expert's routing bias
    #: (``e_score_correction_bias``, top-k choice only) moves by this times sign(mean load - its load) over the global
    #: batch; 0 = off. Only for families whose router reads that bias (``parts/moe_bias.py``).
    moe_bias_update_rate: float = 0.0

    def parallel_config(self) -> ParallelConfig:
        """The layout keys as ``ParallelConfig`` fields, through the one table of both names (``RUN_KEYS``)."""
        return ParallelConfig(**{field: getattr(self, key) for field, key in RUN_KEYS.items()})
