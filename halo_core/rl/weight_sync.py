"""Trained weights into a rollout server: a process group the trainer joins as rank 0, full or sparse-delta syncs.

The wire protocol is SGLang's (``init_weights_update_group``, then per chunk an HTTP request naming the
tensors, answered while rank 0 broadcasts them over the group), so the same sender serves any server that
speaks it; NCCL on GPU, gloo in tests and on CPU. A **sparse** sync sends, per tensor, only the elements whose
bits changed since the last sync, in the wire dtype, as (flat index, value) pairs: lossless, and every
``anchor_every``-th sync is full (the anchor a restarted or drifted server rejoins on). The trainer keeps the
last-sent wire copy of every tensor to diff against (one model copy in the wire dtype, on rank 0).
"""

from __future__ import annotations

import datetime
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import torch
import torch.distributed as dist

#: Bytes of tensors gathered and sent per HTTP request (SGLang and TRL stream ~1 GiB buckets).
CHUNK_BYTES = 1 << 30

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits as integers: a bitwise comparison (``-0.0`` differs from ``0.0``, NaN equals itself)."""
    return tensor.contiguous().view(_BITS[tensor.element_size()])


def make_group(backend: str, store, rank: int, size: int, timeout_s: float = 1800.0):
    """A process group on ``store`` without the default group: the trainer already belongs to its own world."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    raise ValueError(f"weight-sync backend {backend!r}: use nccl (GPU) or gloo")


def join(host: str, port: int, rank: int, size: int, backend: str, group_name: str, timeout_s: float = 1800.0):
    """Rank ``rank`` of the update group whose TCP store rank 0 (the trainer) hosts at ``host:port``."""
    store = dist.TCPStore(host, port, size, is_master=rank == 0, timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
    return make_group(backend, dist.PrefixStore(group_name, store), rank, size, timeout_s)


@dataclass
class SyncReport:
    kind: str  # "full" or "sparse"
    tensors: int = 0
    elements: int = 0  # elements sent (sparse: changed elements)
    bytes: int = 0  # payload bytes broadcast (sparse: indices and values)
    seconds: float = 0.0


def chunks(named: Iterable[tuple[str, torch.Tensor]], limit: int = CHUNK_BYTES) -> Iterator[list[tuple[str, torch.Tensor]]]:
    chunk, size = [], 0
    for name, tensor in named:
        chunk.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= limit:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def beside(post: Callable[[], None], work: Callable[[], None]) -> None:
    """``post()`` on a thread while ``work()`` (the broadcasts) runs here: a server answers a chunk's request only after
    it has received the chunk; the request's failure is raised here."""
    failure: list[BaseException] = []

    def run():
        try:
            post()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    work()
    thread.join()
    if failure:
        raise failure[0]


class WeightSender:
    """Rank 0's end: ``sync`` sends one version of the weights (full, or sparse against the last one sent).

    ``request(kind, body)`` posts a ``full`` or ``sparse`` chunk's description to every server (and returns when all answered); the sender runs it beside the
    broadcasts, as the servers receive while their handler runs.
    """

    def __init__(self, group, request: Callable[[str, dict], None], dtype: torch.dtype | None, sparse: bool, anchor_every: int,
                 group_name: str, device: torch.device | str = "cpu"):
        self.group, self.request, self.dtype, self.sparse = group, request, dtype, sparse
        self.anchor_every, self.group_name, self.device = max(1, anchor_every), group_name, device
        self.last: dict[str, torch.Tensor] = {}  # name -> bits last sent (sparse only)
        self.syncs = 0

    def _wire(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to(device=self.device, dtype=self.dtype or tensor.dtype).contiguous()

    def _broadcast(self, tensor: torch.Tensor) -> None:
        self.group.broadcast(tensor, 0).wait()

    def _post_while(self, kind: str, body: dict, send: Callable[[], None]) -> None:
        beside(lambda: self.request(kind, body), send)

    def sync(self, named: Iterable[tuple[str, torch.Tensor]], chunk_bytes: int = CHUNK_BYTES) -> SyncReport:
        full = not self.sparse or self.syncs % self.anchor_every == 0 or not self.last
        report = SyncReport("full" if full else "sparse")
        start = time.perf_counter()
        for chunk in chunks(named, chunk_bytes):
            wired = [(name, self._wire(tensor)) for name, tensor in chunk]
            if full:
                self._send_full(wired, report)
            else:  # a tensor never sent before goes whole
                fresh = [(n, t) for n, t in wired if n not in self.last]
                if fresh:
                    self._send_full(fresh, report)
                self._send_sparse([(n, t) for n, t in wired if n in self.last], report)
            if self.sparse:
                self.last.update((name, bits(tensor).clone()) for name, tensor in wired)
        report.seconds = time.perf_counter() - start
        self.syncs += 1
        return report

    def _send_full(self, wired: list[tuple[str, torch.Tensor]], report: SyncReport) -> None:
        body = {"names": [n for n, _ in wired], "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in wired],
                "shapes": [list(t.shape) for _, t in wired], "group_name": self.group_name, "flush_cache": True}
        self._post_while("full", body, lambda: [self._broadcast(t) for _, t in wired])
        report.tensors += len(wired)
        report.elements += sum(t.numel() for _, t in wired)
        report.bytes += sum(t.numel() * t.element_size() for _, t in wired)

    def _send_sparse(self, wired: list[tuple[str, torch.Tensor]], report: SyncReport) -> None:
        names, shapes, dtypes, counts, indices, values = [], [], [], [], [], []
        for name, tensor in wired:
            changed = (bits(tensor) != self.last[name]).flatten().nonzero().squeeze(1)
            if changed.numel() == 0:
                continue
            names.append(name), shapes.append(list(tensor.shape)), dtypes.append(str(tensor.dtype).removeprefix("torch."))
            counts.append(changed.numel())
            indices.append(changed.to(torch.int32 if tensor.numel() < 2**31 else torch.int64))
            values.append(bits(tensor).flatten()[changed])  # as bits: one buffer for every same-width dtype of the chunk
        if not names:
            return
        index_dtype = torch.int64 if any(i.dtype == torch.int64 for i in indices) else torch.int32
        flat_index = torch.cat([i.to(index_dtype) for i in indices])
        widths = {v.element_size() for v in values}
        if len(widths) != 1:  # mixed widths in one chunk: send each width's tensors as its own request
            for width in sorted(widths):
                self._send_sparse([(n, t) for n, t in wired if t.element_size() == width], report)
            return
        flat_values = torch.cat(values).view(getattr(torch, dtypes[0]))  # floats travel as floats (gloo has no int16)
        body = {"names": names, "dtypes": dtypes, "shapes": shapes, "counts": counts, "group_name": self.group_name,
                "index_dtype": str(index_dtype).removeprefix("torch."), "flush_cache": True}

        def send():
            self._broadcast(flat_index)
            self._broadcast(flat_values)

        self._post_while("sparse", body, send)
        report.tensors += len(names)
        report.elements += flat_index.numel()
        report.bytes += flat_index.numel() * flat_index.element_size() + flat_values.numel() * flat_values.element_size()


def receive_full(group, body: dict, device="cpu") -> list[tuple[str, torch.Tensor]]:
    """The server's end of ``/update_weights_from_distributed``: the chunk's tensors, received in order."""
    out = []
    for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"]):
        tensor = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
        group.broadcast(tensor, 0).wait()
        out.append((name, tensor))
    return out


def receive_sparse(group, body: dict, device="cpu") -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """The server's end of ``/update_weights_sparse``: per tensor, its changed flat indices and their new bits."""
    total = sum(body["counts"])
    width = getattr(torch, body["dtypes"][0]).itemsize
    index = torch.empty(total, dtype=getattr(torch, body["index_dtype"]), device=device)
    values = torch.empty(total, dtype=getattr(torch, body["dtypes"][0]), device=device)
    group.broadcast(index, 0).wait()
    group.broadcast(values, 0).wait()
    values = values.view(_BITS[width])
    out, start = [], 0
    for name, count in zip(body["names"], body["counts"]):
        out.append((name, index[start : start + count].long(), values[start : start + count]))
        start += count
    return out


def apply_sparse(tensor: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
    """Writes the received bits into ``tensor`` (whose dtype is the wire dtype) in place."""
    bits_view = tensor.view(_BITS[tensor.element_size()]).view(-1)
    bits_view[index.to(tensor.device)] = values.to(tensor.device)
