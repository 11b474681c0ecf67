"""What is alive at a step's memory peak: a replay of PyTorch's CUDA allocator history.

``torch.cuda.memory._record_memory_history`` keeps every allocation and free with its stack;
replaying them finds the moment ``max_memory_allocated`` is set and groups what was alive
then by where it was allocated. Allocations made before the recording started (weights,
optimizer state, gradients kept across steps) form the baseline.
"""

from __future__ import annotations

from collections import defaultdict

# Frames that name a place worth reading; the first one found labels the allocation.
INTERESTING = ("halo_core/", "transformers/", "trl/", "torch/distributed/fsdp/", "torch/utils/checkpoint", "torchinductor", "accelerate/")


def site(frames: list[dict]) -> str:
    """A short label for where an allocation was made: the first interesting Python frame and
    the first autograd node (a backward op's C++ frame), whichever exist."""
    python = _interesting(frames)[:1]
    node = next((f["name"] for f in frames if "Backward" in f.get("name", "") and "::apply" in f.get("name", "")), None)
    label = _frame(python[0]) if python else "(no Python frame)"
    return label + (f" | {node.split('(')[0]}" if node else "")


def stack(frames: list[dict], depth: int = 10) -> str:
    """The interesting Python frames of a stack, innermost first (where in the step it was)."""
    return "\n  " + "\n  ".join(_frame(f) for f in _interesting(frames)[:depth])


def _interesting(frames: list[dict]) -> list[dict]:
    return [f for f in frames if any(part in f.get("filename", "") for part in INTERESTING)]


def _frame(frame: dict) -> str:
    return f"{frame['filename'].split('site-packages/')[-1]}:{frame['line']} {frame['name']}"


def peak_breakdown(trace: list[dict], baseline: int, top: int = 25) -> str:
    """The allocations alive at the peak of ``trace`` (one device's events), by site, largest first."""
    current = peak = 0
    peak_index = -1
    for index, event in enumerate(trace):
        current += _delta(event)
        if current > peak:
            peak, peak_index = current, index
    alive: dict[int, tuple[int, str]] = {}
    for event in trace[: peak_index + 1]:
        if event["action"] == "alloc":
            alive[event["addr"]] = (event["size"], site(event.get("frames", [])))
        elif event["action"] == "free_requested":
            alive.pop(event["addr"], None)
    by_site: dict[str, list[int]] = defaultdict(list)
    for size, label in alive.values():
        by_site[label].append(size)
    gib = 2**30
    lines = [(f"baseline (allocated before the recorded step): {baseline / gib:.2f} GiB; peak above it: {peak / gib:.2f} GiB; "
              f"peak {(baseline + peak) / gib:.2f} GiB, reached at event {peak_index} of {len(trace)}"),
             "the stack of the allocation that set it: " + (stack(trace[peak_index].get("frames", [])) if peak_index >= 0 else "-"),
             f"{'GiB':>7} {'count':>6}  site (alive at the peak, allocated during the step)"]
    for label, sizes in sorted(by_site.items(), key=lambda item: -sum(item[1]))[:top]:
        lines.append(f"{sum(sizes) / gib:7.3f} {len(sizes):6}  {label}")
    return "\n".join(lines)


def _delta(event: dict) -> int:
    return {"alloc": event["size"], "free_requested": -event["size"]}.get(event["action"], 0)
