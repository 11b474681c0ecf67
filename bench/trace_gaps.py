"""Where a profiled step's GPU time goes, from the timeline: a summary of ``trace-rank*.json``.

    python3 bench/sft_vs_trl.py --nproc 2 --steps 12 --profile halo-ep2+compile   # writes the traces
    python3 bench/trace_gaps.py /tmp/halo-bench/trace-rank0.json

The profile table sums kernel time; it cannot say whether communication hid behind compute or
whether the GPU waited for the host. This splits the profiled window's wall time into compute,
communication not hidden behind compute (per NCCL collective), and idle, and charges each idle
gap to what the host was doing when it ended: the innermost named phase (FSDP2's hooks, a
compiled graph, the optimizer, an autograd node) around the launch of the kernel that ended the
gap, marked "after a read-back" when a host synchronisation returned during the gap.
"""

from __future__ import annotations

import argparse
import bisect
import json
from collections import defaultdict

#: Host phases a gap is charged to, innermost first wins; the first match in this order breaks ties.
PHASES = ("FSDP::", "halo::", "## Call CompiledFxGraph", "CompiledFunction", "Optimizer.step", "autograd::engine::evaluate_function", "Torch-Compiled Region")
SYNCS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"}  # cudaMemcpyAsync does not wait
MIN_GAP_US = 5.0


def union(intervals):
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def clip(intervals, lo, hi):
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def length(intervals):
    return sum(e - s for s, e in intervals)


def minus(intervals, holes):
    """``intervals`` without the parts inside ``holes`` (both merged)."""
    out, j = [], 0
    for s, e in intervals:
        while j < len(holes) and holes[j][1] <= s:
            j += 1
        k, cur = j, s
        while k < len(holes) and holes[k][0] < e:
            if holes[k][0] > cur:
                out.append((cur, holes[k][0]))
            cur = max(cur, holes[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def collective(name: str) -> str:
    for kind in ("SendRecv", "AllGather", "ReduceScatter", "AllReduce", "Broadcast"):
        if kind in name:
            return {"SendRecv": "all-to-all (SendRecv)"}.get(kind, kind)
    return "other NCCL"


def summarise(events: list[dict], profiled_steps: int) -> str:
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    steps = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    if not kernels:
        return "no GPU kernels in this trace (was it recorded with CUDA activity on a GPU?)"
    span = lambda es: (min(e["ts"] for e in es), max(e["ts"] + e["dur"] for e in es))  # noqa: E731
    lo, hi = span(steps) if steps else span(kernels)
    n_steps = len(steps) or profiled_steps  # the Trainer does not call profiler.step(): no ProfilerStep marks
    per = lambda us: us / 1e3 / n_steps  # noqa: E731  (ms per step)

    comm = [e for e in kernels if "nccl" in e["name"].lower()]
    compute = [e for e in kernels if "nccl" not in e["name"].lower()]
    busy_compute = union(clip([(e["ts"], e["ts"] + e["dur"]) for e in compute], lo, hi))
    busy_all = union(clip([(e["ts"], e["ts"] + e["dur"]) for e in kernels], lo, hi))
    lines = [f"window {per(hi - lo):.1f} ms per step ({n_steps} steps): compute {per(length(busy_compute)):.1f}, "
             f"communication not under compute {per(length(busy_all) - length(busy_compute)):.1f}, idle {per(hi - lo - length(busy_all)):.1f}"]
    by_kind = defaultdict(list)
    for e in comm:
        by_kind[collective(e["name"])].append((e["ts"], e["ts"] + e["dur"]))
    for kind, spans in sorted(by_kind.items()):
        merged = union(clip(spans, lo, hi))
        lines.append(f"  {kind:24} {per(length(merged)):6.1f} ms per step, {per(length(minus(merged, busy_compute))):6.1f} not under compute, "
                     f"{len(spans) / n_steps:.0f} kernels")

    # Host side: launches by correlation id, enclosing events per thread, synchronisations.
    launches = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    host = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation", "python_function"):
            host[e["tid"]].append(e)
    parents = {}
    for tid, es in host.items():  # events on one thread nest: each one's parent, from one sweep
        es.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack, parent = [], []
        for i, e in enumerate(es):
            while stack and es[stack[-1]]["ts"] + es[stack[-1]]["dur"] < e["ts"] + e["dur"]:
                stack.pop()
            parent.append(stack[-1] if stack else -1)
            stack.append(i)
        parents[tid] = parent
    starts = {tid: [e["ts"] for e in es] for tid, es in host.items()}
    sync_ends = sorted(e["ts"] + e["dur"] for e in events if e.get("cat") == "cuda_runtime" and e["name"] in SYNCS)

    def phase(launch) -> str:
        tid, at = launch["tid"], launch["ts"]
        es, parent = host.get(tid, []), parents.get(tid, [])
        j = bisect.bisect_right(starts.get(tid, []), at) - 1  # the last event to start; what encloses `at` is it or an ancestor
        while j >= 0 and es[j]["ts"] + es[j]["dur"] < at:
            j = parent[j]
        enclosing = []  # innermost first
        while j >= 0:
            enclosing.append(es[j])
            j = parent[j]
        for e in enclosing:
            if e["name"].startswith(PHASES):
                return e["name"].split(" (")[0][:70]
        outer = [e for e in enclosing if not e["name"].startswith("ProfilerStep#")]
        return f"other: {outer[-1]['name'][:60]}" if outer else "other: no host event"

    first_kernel = {}
    for e in kernels:
        first_kernel.setdefault(e["ts"], e)
    gap_time, gap_count = defaultdict(float), defaultdict(int)
    previous_end = lo
    for start, end in busy_all:
        gap = start - previous_end
        if gap >= MIN_GAP_US:
            kernel = first_kernel.get(start)
            launch = launches.get(kernel["args"].get("correlation")) if kernel else None
            label = phase(launch) if launch else "unattributed"
            i = bisect.bisect_right(sync_ends, previous_end)
            if i < len(sync_ends) and sync_ends[i] <= start:
                label = f"after a read-back: {label}"
            gap_time[label] += gap
            gap_count[label] += 1
        previous_end = end
    if hi - previous_end >= MIN_GAP_US:
        gap_time["after the window's last kernel"] += hi - previous_end
        gap_count["after the window's last kernel"] += 1
    lines.append("idle gaps (>= 5 us) by what the host was in when the GPU got work again:")
    for label, us in sorted(gap_time.items(), key=lambda kv: -kv[1])[:20]:
        lines.append(f"  {per(us):6.2f} ms per step in {gap_count[label] / n_steps:6.1f} gaps  {label}")
    syncs = [e for e in events if e.get("cat") == "cuda_runtime" and e["name"] in SYNCS and lo <= e["ts"] <= hi]
    lines.append(f"host synchronisations: {len(syncs) / n_steps:.0f} per step, {per(sum(e['dur'] for e in syncs)):.1f} ms per step waiting")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace", nargs="+", help="chrome traces written by sft_vs_trl.py --profile")
    parser.add_argument("--steps", type=int, default=2, help="steps the trace holds, where it has no ProfilerStep marks (sft_vs_trl.py profiles 2)")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: a trace holds at least one step; give the number of profiled steps (sft_vs_trl.py: 2)")
    for path in args.trace:
        with open(path) as f:
            print(f"{path}:\n{summarise(json.load(f)['traceEvents'], args.steps)}\n")


if __name__ == "__main__":
    main()
