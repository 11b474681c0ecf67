"""Halo's weights into a vLLM server: a worker extension (``vllm serve ... --worker-extension-cls
halo_core.rl.vllm_worker.HaloWeightReceiver``) that the trainer reaches through vLLM's ``/collective_rpc``.

It runs inside vLLM's worker processes (where ``halo_core`` must be importable; it needs only torch) and joins
the trainer's ``weight_sync`` group as rank ``rank_offset + worker rank``. Received tensors go through the
model's own ``load_weights`` under their Hugging Face names, so vLLM fuses and shards them as when loading a
checkpoint. Sparse deltas need the whole tensor they change: the extension keeps the last received copy of
every tensor on the CPU (only when the trainer asked for sparse syncs) and loads each touched tensor whole.
"""

from __future__ import annotations

import json

import torch

from halo_core.rl import weight_sync


class HaloWeightReceiver:
    """Methods vLLM mixes into its worker; ``self.model_runner`` and ``self.rank`` are the worker's."""

    def halo_init_group(self, payload: str) -> dict:
        body = json.loads(payload)
        rank = int(body["rank_offset"]) + int(getattr(self, "rank", 0))
        self._halo_group = weight_sync.join(body["master_address"], int(body["master_port"]), rank, int(body["world_size"]),
                                            body.get("backend", "nccl"), body["group_name"])
        self._halo_device = "cuda" if body.get("backend", "nccl") == "nccl" else "cpu"
        self._halo_kept: dict[str, torch.Tensor] | None = {} if body.get("sparse") else None
        return {"success": True}

    def halo_update_full(self, payload: str) -> dict:
        named = weight_sync.receive_full(self._halo_group, json.loads(payload), device=self._halo_device)
        if self._halo_kept is not None:
            self._halo_kept.update((name, tensor.to("cpu", copy=True)) for name, tensor in named)
        self.model_runner.model.load_weights(weights=named)
        return {"success": True}

    def halo_update_sparse(self, payload: str) -> dict:
        if self._halo_kept is None:
            raise RuntimeError("a sparse weight update before the group was joined for sparse syncs")
        touched = []
        for name, index, values in weight_sync.receive_sparse(self._halo_group, json.loads(payload), device=self._halo_device):
            kept = self._halo_kept[name]
            weight_sync.apply_sparse(kept, index, values)
            touched.append((name, kept.to(self._halo_device)))
        self.model_runner.model.load_weights(weights=touched)
        return {"success": True}
