"""safetensors files written by many processes at once, each writing the bytes of the tensor parts it holds.

A safetensors file is a header (every tensor's name, dtype, shape and byte range) and then the tensors' bytes back
to back. Every rank computes the same headers from the tensors' whole shapes, so each can write its part of a tensor
(a block of experts, an FSDP2 shard, a tensor-parallel column block) straight to where it belongs in the file with
``os.pwrite``, without gathering anything: no rank holds more than its own part, and the ranks write in parallel.
The files are the ones ``safetensors`` writes (tensors ordered by dtype size so each is aligned, the header padded
to 8 bytes), and every byte of the data is some rank's part, so a file is complete once every rank has written.

Each part written is recorded with the CRC-32 of its bytes (``zlib.crc32``, about 3 GB/s here), so that a reader
can check what it reads without reading what it does not need (``verify``).
"""

from __future__ import annotations

import itertools
import json
import os
import struct
import zlib
from dataclasses import dataclass, field
from typing import Callable

import torch

DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
    torch.uint16: "U16", torch.uint32: "U32", torch.uint64: "U64",
}
#: transformers' ``save_pretrained`` default: files of at most this many bytes (one larger tensor gets a file of its own).
MAX_FILE_BYTES = 50 * 10**9
_MAX_WRITE = 1 << 30  # one pwrite at most (Linux writes at most about 2 GiB a call)


def nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    numel = 1
    for size in shape:
        numel *= size
    return numel * torch.empty((), dtype=dtype).element_size()


@dataclass
class FileLayout:
    """One file's header and where each of its tensors' bytes go."""

    name: str
    header: bytes
    #: tensor -> (shape, dtype, absolute offset of its first byte)
    tensors: dict[str, tuple[tuple[int, ...], torch.dtype, int]] = field(default_factory=dict)
    size: int = 0


def plan_files(layout: dict[str, tuple[tuple[int, ...], torch.dtype]], prefix: str = "model", max_bytes: int = MAX_FILE_BYTES,
               single: str | None = None) -> list[FileLayout]:
    """The files ``layout`` (key -> whole shape, dtype, in order) goes into, as ``save_pretrained`` cuts them: filled in
    order up to ``max_bytes``, named ``{prefix}-0000i-of-0000K.safetensors``, or ``single`` (``{prefix}.safetensors``)
    when one file holds everything. ``{prefix}`` may also be a plain name (``exp_avg`` for optimizer state)."""
    shards: list[list[str]] = [[]]
    size = 0
    for key, (shape, dtype) in layout.items():
        bytes_ = nbytes(shape, dtype)
        if shards[-1] and size + bytes_ > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += bytes_
    count = len(shards)
    names = [single or f"{prefix}.safetensors"] if count == 1 else [f"{prefix}-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
    return [_layout(name, {k: layout[k] for k in keys}) for name, keys in zip(names, shards)]


def _layout(name: str, tensors: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> FileLayout:
    # safetensors' own order: larger elements first (each tensor then starts aligned to its element), then by name
    order = sorted(tensors, key=lambda k: (-torch.empty((), dtype=tensors[k][1]).element_size(), k))
    header: dict = {"__metadata__": {"format": "pt"}}
    begin = 0
    for key in order:
        shape, dtype = tensors[key]
        end = begin + nbytes(shape, dtype)
        header[key] = {"dtype": DTYPES[dtype], "shape": list(shape), "data_offsets": [begin, end]}
        begin = end
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    start = 8 + len(text)
    file = FileLayout(name, struct.pack("<Q", len(text)) + text, size=start + begin)
    for key in order:
        file.tensors[key] = (tensors[key][0], tensors[key][1], start + header[key]["data_offsets"][0])
    return file


def _runs(whole: tuple[int, ...], offset: tuple[int, ...], shape: tuple[int, ...]):
    """(element offset in the whole tensor, elements) of each contiguous run a part of ``shape`` at ``offset`` covers,
    in the part's own order: one run for a block of rows, one per row for a block of columns."""
    dims = len(whole)
    if dims == 0:
        yield 0, 1
        return
    split = 0  # the runs are contiguous over dims split.. (every later dim whole)
    for d in range(dims - 1, -1, -1):
        if offset[d] != 0 or shape[d] != whole[d]:
            split = d
            break
    strides = [1] * dims
    for d in range(dims - 2, -1, -1):
        strides[d] = strides[d + 1] * whole[d + 1]
    length = 1
    for d in range(split, dims):
        length *= shape[d]
    for index in itertools.product(*(range(offset[d], offset[d] + shape[d]) for d in range(split))):
        yield sum(i * s for i, s in zip(index, strides)) + offset[split] * strides[split], length


def _bytes(tensor: torch.Tensor) -> memoryview:
    return memoryview(tensor.detach().reshape(-1).contiguous().view(torch.uint8).numpy())


def _pwrite(fd: int, data: memoryview, at: int) -> None:
    while len(data):
        written = os.pwrite(fd, data[:_MAX_WRITE], at)
        data, at = data[written:], at + written


def write_part(fd: int, file: FileLayout, key: str, offset: tuple[int, ...], part: torch.Tensor) -> int:
    """Write ``part`` (a CPU tensor: the block of tensor ``key`` starting at ``offset``) where it belongs; its CRC-32."""
    whole, dtype, start = file.tensors[key]
    if part.dtype != dtype or part.dim() != len(whole):
        raise ValueError(f"{key}: part {tuple(part.shape)} {part.dtype} does not fit the file's {whole} {dtype}")
    data = _bytes(part)
    item = part.element_size()
    crc = zlib.crc32(data)
    position = 0
    for element, length in _runs(whole, tuple(offset), tuple(part.shape)):
        _pwrite(fd, data[position : position + length * item], start + element * item)
        position += length * item
    return crc


def crc_of(part: torch.Tensor) -> int:
    return zlib.crc32(_bytes(part))


class CorruptTensor(ValueError):
    """What a reader found differs from what the writer recorded."""


def verify(key: str, parts: list, read: Callable[[tuple[int, int] | None], torch.Tensor], rows: tuple[int, int] | None) -> torch.Tensor:
    """Rows ``rows`` of tensor ``key`` (``None``: the whole tensor), read with ``read(span)`` and checked against every
    recorded part (``[offset, shape, crc, ...]``) they overlap. A part reaching beyond ``rows`` is read whole: a reader
    reads at most one writer's part more than it needs, and never a tensor it does not need."""
    if rows is None:
        low, touched = 0, parts
        block = read(None)
    else:
        touched = [p for p in parts if p[0][0] < rows[1] and p[0][0] + p[1][0] > rows[0]]
        low = min([rows[0]] + [p[0][0] for p in touched])
        high = max([rows[1]] + [p[0][0] + p[1][0] for p in touched])
        block = read((low, high))
    for offset, shape, crc, *_ in touched:
        index = (slice(offset[0] - low, offset[0] - low + shape[0]), *(slice(o, o + s) for o, s in zip(offset[1:], shape[1:]))) if shape else ()
        if crc_of(block[index]) != crc:
            where = f" (the part at {list(offset)} of shape {list(shape)})" if len(parts) > 1 else ""
            raise CorruptTensor(f"{key}{where}: its bytes differ from what was written (CRC-32 mismatch)")
    return block if rows is None else block[rows[0] - low : rows[1] - low]
