"""LoRA on a laid-out model: stock PEFT on dense modules, a grouped LoRA inside the experts' grouped GEMM,
adapters saved in PEFT's own format (``halo_core.lora.peft_format``)."""
