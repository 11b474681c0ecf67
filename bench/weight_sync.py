"""Weight sync into a rollout server, full against sparse deltas: bytes and seconds per sync after real AdamW steps.

    python3 bench/weight_sync.py --out weight_sync.json              # the 3B benchmark model on one GPU, lr 1e-6
    python3 bench/weight_sync.py --lr 1e-5 --steps 6 --anchor-every 4
    python3 bench/weight_sync.py --tiny --out tiny.json              # the tiny model (the CPU without a GPU): the harness in seconds

Trainer (this process): the model built from ``--config`` (random init, seed 0, on the GPU when there is one) with
**fp32 master weights**; every third decoder block trains (layers 0, 3, 6 of the 3B model's 8: ``--train-every``,
``--train-offset``), attention, norms, router and experts; embeddings, final norm and LM head are frozen. Each
step is a real forward and backward on random token batches (``--batch`` x ``--seq``; bf16 autocast on the GPU,
experts ``eager`` so that autocast reaches them), gradient clipping at 1.0 and a ``torch.optim.AdamW`` step
(fused on the GPU; betas 0.9/0.999, eps 1e-8, ``--weight-decay`` 0).

Syncs: after the start-up sync and after every step, three ``halo_core.rl.weight_sync.WeightSender`` s send the
weights in the wire dtype (``--wire``, bf16), each to its own receiver over its own group, in an order rotated every step:

  full       ``weight_sync: full``: every tensor, whole, every time
  trainable  every tensor once (start-up), then only the trainable tensors, whole: what skipping frozen blocks gives
  sparse     ``weight_sync: sparse``: every ``--anchor-every``-th sync full (the anchor), between them only the
             elements whose wire bits changed, as int32 flat index + value pairs

The three receivers are workers of one process of this script (``--receiver``), each Halo's vLLM worker extension
(``halo_core.rl.vllm_worker.HaloWeightReceiver``: ``weight_sync.join``, ``receive_full``, ``receive_sparse``,
``apply_sparse`` and its kept CPU copy) with ``load_weights`` keeping the tensors it is handed on the CPU; the chunk
descriptions reach it as JSON lines on its stdin (where vLLM's ``/collective_rpc`` would carry them), the tensors over
gloo groups: on one GPU NCCL cannot join two processes on the same device, and the receivers hold CPU tensors.
(``GLOO_SOCKET_IFNAME=lo`` keeps the groups on loopback where the host name resolves elsewhere.)
The sender's wire copies and diffs sit on ``--sender-device`` (the GPU when there is one, as with NCCL; gloo stages
CUDA tensors through the host).

Per sync: kind, tensors, elements, bytes (the ``SyncReport``), its seconds (the ``SyncReport``'s: the wire casts, the
diff, the broadcasts and every receiver's reply, which comes after it applied the chunk), the receiver's own
seconds, and the elements whose wire bits changed since the last step, counted by this script on its own.
Checked before the figures are written (the run fails loudly otherwise): every report against that count
(a sparse sync's bytes are its changed elements times index plus value bytes), frozen tensors unchanged, and after
the last sync every receiver's tensors sent back over its group and compared bitwise with the trainer's weights
in the wire dtype.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
DEFAULT_CONFIG = HERE / "configs" / "qwen3-moe-3b.config.json"
TINY_CONFIG = HERE.parent / "templates" / "tiny" / "model" / "config.json"
MODES = ("full", "trainable", "sparse")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the model's config.json (random init)")
    parser.add_argument("--tiny", action="store_true", help="the tiny model and short batches (on the GPU if there is one): checks the harness")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps (one sync of each mode after each)")
    parser.add_argument("--anchor-every", type=int, default=4, help="the sparse sender's anchor_every (sync 0 is an anchor)")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--train-every", type=int, default=3, help="decoder layer i trains when i %% N == offset")
    parser.add_argument("--train-offset", type=int, default=0)
    parser.add_argument("--wire", default="bfloat16", help="the wire dtype (weight_sync_dtype)")
    parser.add_argument("--experts", default="eager", help="experts_implementation (eager: bf16 autocast reaches the experts)")
    parser.add_argument("--sender-device", help="where the sender keeps its wire copies and diffs (default: cuda if there is one)")
    parser.add_argument("--chunk-mib", type=int, default=1024, help="the sender's chunk_bytes in MiB")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a group's collective may wait")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU even with a GPU")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--receiver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fault", action="store_true", help=argparse.SUPPRESS)  # the sparse receiver flips one bit at the end
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.tiny:
        args.config, args.batch, args.seq = TINY_CONFIG, 2, 32
    if args.steps < 1 or args.anchor_every < 2:
        parser.error("--steps must be >= 1 and --anchor-every >= 2 (a sparse sync needs a sync before it)")
    return args


# -- the receiver process --------------------------------------------------------------------------------------------

def receiver_main(fault: bool) -> None:
    """JSON lines in on stdin (``init``, ``full``, ``sparse``, ``dump``, ``stop``, each naming its mode), one JSON reply
    each on stdout. One worker a mode, each with its own group and its own copy of the weights."""
    from halo_core.rl.vllm_worker import HaloWeightReceiver

    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything else printed goes to stderr

    class Worker(HaloWeightReceiver):
        """A vLLM worker reduced to what the extension uses; ``load_weights`` keeps what it is handed (CPU)."""

        def __init__(self):
            self.rank, self.model_runner, self.model, self.served = 0, self, self, {}

        def load_weights(self, weights):
            for name, tensor in weights:
                self.served[name] = tensor

    workers: dict[str, Worker] = {}
    for line in sys.stdin:
        message = json.loads(line)
        kind, body = message["kind"], message.get("body", {})
        if kind == "stop":
            break
        start = time.perf_counter()
        try:
            worker = workers.setdefault(message["mode"], Worker())
            if kind == "init":
                worker.halo_init_group(json.dumps(body))
            elif kind == "full":
                worker.halo_update_full(json.dumps(body))
            elif kind == "sparse":
                worker.halo_update_sparse(json.dumps(body))
            elif kind == "dump":  # the served tensors back to the trainer, in the order asked, over the same group
                if fault and message["mode"] == "sparse":
                    worker.served[body["names"][-1]].view(-1).view(torch.uint8)[0] ^= 1
                for name in body["names"]:
                    worker._halo_group.broadcast(worker.served[name].contiguous(), 1).wait()
            else:
                raise ValueError(f"unknown message {kind!r}")
            reply = {"success": True, "seconds": time.perf_counter() - start}
        except Exception as exc:  # the trainer raises it, naming the mode
            reply = {"success": False, "message": f"{type(exc).__name__}: {exc}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


class ReceiverProcess:
    """The receiver process: its stdin and stdout carry the messages, one at a time."""

    def __init__(self, fault: bool):
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--receiver", *(["--fault"] if fault else [])],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lock = threading.Lock()

    def request(self, mode: str, kind: str, body: dict) -> float:
        with self.lock:
            self.proc.stdin.write(json.dumps({"mode": mode, "kind": kind, "body": body}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the receiver process exited (code {self.proc.poll()}) during a {mode} {kind!r} message")
        reply = json.loads(line)
        if not reply.get("success"):
            raise RuntimeError(f"the {mode} receiver refused a {kind!r} message: {reply.get('message')}")
        return reply["seconds"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"kind": "stop"}) + "\n")
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Receiver:
    """One mode's receiver (a worker of the receiver process) and its weight-sync group (rank 1 of 2; the trainer is rank 0)."""

    def __init__(self, mode: str, sparse: bool, process: ReceiverProcess, timeout: float):
        self.mode, self.sparse, self.process, self.timeout, self.seconds = mode, sparse, process, timeout, []
        self.group, self.group_name = None, f"halo-bench-{mode}"

    def request(self, kind: str, body: dict) -> None:
        """What ``WeightSender`` calls for each chunk (on its own thread, beside the broadcasts)."""
        self.seconds.append(self.process.request(self.mode, kind, body))

    def beside(self, kind: str, body: dict, work) -> None:
        """``request`` on a thread while ``work`` runs here (the receiver answers after the collectives)."""
        from halo_core.rl import weight_sync

        weight_sync.beside(lambda: self.request(kind, body), work)

    def join(self, port: int) -> None:
        from halo_core.rl import weight_sync

        body = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2, "group_name": self.group_name,
                "backend": "gloo", "sparse": self.sparse}

        def group():
            self.group = weight_sync.join("127.0.0.1", port, 0, 2, "gloo", self.group_name, timeout_s=self.timeout)

        self.beside("init", body, group)

    def served(self, names: list[str], shapes: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """What the receiver holds now, sent back over the group."""
        out = {}

        def fetch():
            for name in names:
                tensor = torch.empty(shapes[name], dtype=dtype)
                self.group.broadcast(tensor, 1).wait()
                out[name] = tensor

        self.beside("dump", {"names": names}, fetch)
        return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- the trainer -----------------------------------------------------------------------------------------------------

def trainable_layers(layers: int, every: int, offset: int) -> list[int]:
    return [i for i in range(layers) if i % every == offset % every]


def is_trainable(name: str, layers: list[int]) -> bool:
    return any(name.startswith(f"model.layers.{i}.") for i in layers)


def build_model(args, device: torch.device):
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = json.loads(args.config.read_text())
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)  # Halo's random_init: seed, then from_config on the device
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa",
                                                 experts_implementation=args.experts)
    return model.train()


def wire_bits(tensor: torch.Tensor, wire: torch.dtype) -> torch.Tensor:
    from halo_core.rl.weight_sync import bits

    return bits(tensor.detach().to(wire)).clone()


def check_report(mode: str, row: dict, numel: dict, trainable: list[str], wire: torch.dtype) -> None:
    """The report against what this script counted on its own; raises on any difference."""
    expect_tensors, expect_elements = len(numel), sum(numel.values())
    if row["kind"] == "sparse":
        expect_tensors, expect_elements = row["changed_tensors"], row["changed_elements"]
        expect_bytes = expect_elements * (4 + wire.itemsize)  # int32 flat indices (every tensor under 2**31 elements)
    elif mode == "trainable" and row["sync"] > 0:
        expect_tensors, expect_elements = len(trainable), sum(numel[n] for n in trainable)
        expect_bytes = expect_elements * wire.itemsize
    else:
        expect_bytes = expect_elements * wire.itemsize
    got = (row["tensors"], row["elements"], row["bytes"])
    if got != (expect_tensors, expect_elements, expect_bytes):
        raise SystemExit(f"{mode} sync {row['sync']} ({row['kind']}): reported (tensors, elements, bytes) {got}, "
                         f"counted {(expect_tensors, expect_elements, expect_bytes)}")


def median(values):
    return statistics.median(values) if values else None


def summarise(rows: list[dict], model: dict, target: float = 10.0) -> dict:
    """Medians over the syncs after steps (sync 0, the start-up sync, left out); sparse split into anchors and deltas."""
    after = [r for r in rows if r["sync"] > 0]
    pick = lambda mode, kind=None: [r for r in after if r["mode"] == mode and (kind is None or r["kind"] == kind)]  # noqa: E731
    out = {}
    for key, chosen in (("full", pick("full")), ("trainable", pick("trainable")), ("sparse_anchor", pick("sparse", "full")),
                        ("sparse_delta", pick("sparse", "sparse"))):
        out[key] = {"syncs": len(chosen), "bytes": median([r["bytes"] for r in chosen]), "elements": median([r["elements"] for r in chosen]),
                    "tensors": median([r["tensors"] for r in chosen]), "seconds": median([r["seconds"] for r in chosen]),
                    "receiver_seconds": median([r["receiver_seconds"] for r in chosen])}
    deltas = pick("sparse", "sparse")
    out["changed_fraction_all"] = median([r["changed_elements"] / model["elements"] for r in deltas])
    out["changed_fraction_trainable"] = median([r["changed_elements"] / model["trainable_elements"] for r in deltas])
    full, delta, trainable = out["full"]["bytes"], out["sparse_delta"]["bytes"], out["trainable"]["bytes"]
    anchor_every = model["anchor_every"]
    if full and delta:
        out["full_over_sparse_delta_bytes"] = full / delta
        out["trainable_over_sparse_delta_bytes"] = trainable / delta
        # over an anchor cycle: one anchor (every tensor, whole) and anchor_every - 1 deltas
        cycle = (model["elements"] * model["wire_bytes"] + (anchor_every - 1) * delta) / anchor_every
        out["full_over_sparse_cycle_bytes"] = full / cycle
        out["target"] = target
        out["target_met"] = full / delta >= target
    return out


def main_trainer(args) -> dict:
    from halo_core.rl import weight_sync

    gpu = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda" if gpu else "cpu")
    sender_device = torch.device(args.sender_device or device.type)
    wire = getattr(torch, args.wire)
    started = time.perf_counter()
    process = ReceiverProcess(args.fault)  # it imports while the model builds
    receivers = {mode: Receiver(mode, mode == "sparse", process, args.timeout) for mode in MODES}
    try:
        model = build_model(args, device)
        layers = trainable_layers(model.config.num_hidden_layers, args.train_every, args.train_offset)
        for name, param in model.named_parameters():
            param.requires_grad_(is_trainable(name, layers))
        names = list(model.state_dict())
        trainable = [n for n in names if is_trainable(n, layers)]
        numel = {n: t.numel() for n, t in model.state_dict().items()}
        shapes = {n: list(t.shape) for n, t in model.state_dict().items()}
        info = {"config": str(args.config), "device": torch.cuda.get_device_name() if gpu else "cpu", "sender_device": str(sender_device),
                "torch": torch.__version__, "layers": model.config.num_hidden_layers, "trainable_layers": layers,
                "tensors": len(names), "elements": sum(numel.values()), "trainable_tensors": len(trainable),
                "trainable_elements": sum(numel[n] for n in trainable), "wire": args.wire, "wire_bytes": wire.itemsize,
                "master": "float32", "lr": args.lr, "weight_decay": args.weight_decay, "batch": args.batch, "seq": args.seq,
                "steps": args.steps, "anchor_every": args.anchor_every, "backend": "gloo", "experts": args.experts,
                "chunk_bytes": args.chunk_mib << 20, "build_s": round(time.perf_counter() - started, 2)}
        print(f"model: {json.dumps(info)}", flush=True)
        joined = time.perf_counter()
        for mode, receiver in receivers.items():
            receiver.join(free_port())
        info["join_s"] = round(time.perf_counter() - joined, 2)
        senders = {mode: weight_sync.WeightSender(r.group, r.request, wire, sparse=mode == "sparse", anchor_every=args.anchor_every,
                                                  group_name=r.group_name, device=sender_device) for mode, r in receivers.items()}
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                                      weight_decay=args.weight_decay, **({"fused": True} if gpu else {}))
        previous = {n: wire_bits(t, wire) for n, t in model.state_dict().items()}
        generator = torch.Generator(device=device).manual_seed(1)
        rows, losses, step_seconds = [], [], []
        for sync in range(args.steps + 1):
            changed = {}
            if sync > 0:  # one optimizer step, then count the elements whose wire bits moved
                step_start = time.perf_counter()
                ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq), device=device, generator=generator)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
                    loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                losses.append(float(loss.detach()))
                if gpu:
                    torch.cuda.synchronize()
                step_seconds.append(round(time.perf_counter() - step_start, 3))
                for name, tensor in model.state_dict().items():
                    now = wire_bits(tensor, wire)
                    moved = int((now != previous[name]).sum())
                    if moved:
                        changed[name] = moved
                    previous[name] = now
                frozen = sorted(n for n in changed if n not in trainable)
                if frozen:
                    raise SystemExit(f"step {sync}: frozen tensors changed: {frozen[:5]}")
            order = MODES[sync % len(MODES):] + MODES[: sync % len(MODES)]
            for mode in order:
                named = [(n, t) for n, t in model.state_dict().items() if mode != "trainable" or sync == 0 or n in trainable]
                receivers[mode].seconds.clear()
                if gpu:
                    torch.cuda.synchronize()
                wall = time.perf_counter()
                report = senders[mode].sync(named, args.chunk_mib << 20)
                if sender_device.type == "cuda":
                    torch.cuda.synchronize()
                row = {"sync": sync, "mode": mode, "kind": report.kind, "tensors": report.tensors, "elements": report.elements,
                       "bytes": report.bytes, "seconds": round(report.seconds, 4), "wall_seconds": round(time.perf_counter() - wall, 4),
                       "receiver_seconds": round(sum(receivers[mode].seconds), 4), "changed_tensors": len(changed),
                       "changed_elements": sum(changed.values()), "changed_fraction_trainable": sum(changed.values()) / info["trainable_elements"]}
                if sync == 0:
                    row["changed_elements"] = row["changed_tensors"] = row["changed_fraction_trainable"] = None
                check_report(mode, row, numel, trainable, wire)
                rows.append(row)
                print(json.dumps(row), flush=True)
        verified = {}
        for mode, receiver in receivers.items():  # the receiver's tensors against the trainer's, in the wire dtype, bit for bit
            start = time.perf_counter()
            served = receiver.served(names, shapes, wire)
            wrong = [n for n in names if not torch.equal(weight_sync.bits(served[n]), previous[n].cpu())]
            if wrong:
                raise SystemExit(f"the {mode} receiver's weights differ from the trainer's {args.wire} weights in {len(wrong)} tensors, "
                                 f"first {wrong[0]}")
            verified[mode] = {"tensors": len(names), "bitwise_equal": True, "seconds": round(time.perf_counter() - start, 2)}
        info["gpu_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2) if gpu else None
        result = {"model": info, "losses": losses, "step_seconds": step_seconds, "syncs": rows, "verified": verified, "summary": summarise(rows, info),
                  "wall_s": round(time.perf_counter() - started, 1)}
    finally:
        process.stop()
    return result


def print_summary(result: dict) -> None:
    info, s = result["model"], result["summary"]
    print(f"\n{info['device']}: {info['elements']:,} elements in {info['tensors']} tensors; layers {info['trainable_layers']} of "
          f"{info['layers']} train ({info['trainable_elements']:,} elements); fp32 master, AdamW lr {info['lr']}, {info['wire']} wire, gloo")
    print(f"{'sync':>4} {'mode':9} {'kind':6} {'tensors':>7} {'elements':>14} {'bytes':>15} {'s':>8} {'recv s':>8} {'changed/trainable':>17}")
    for r in result["syncs"]:
        frac = "" if r["sync"] == 0 else f"{r['changed_fraction_trainable']:.5f}"
        print(f"{r['sync']:>4} {r['mode']:9} {r['kind']:6} {r['tensors']:>7} {r['elements']:>14,} {r['bytes']:>15,} {r['seconds']:>8.3f} "
              f"{r['receiver_seconds']:>8.3f} {frac:>17}")
    print("medians after the start-up sync:")
    for key in ("full", "trainable", "sparse_anchor", "sparse_delta"):
        m = s[key]
        if m["syncs"]:
            print(f"  {key:14} {m['syncs']} syncs: {m['bytes'] / 1e6:12.2f} MB  {m['seconds']:8.3f} s  (receiver {m['receiver_seconds']:.3f} s)")
    if "target_met" in s:
        print(f"  changed elements per step: {s['changed_fraction_trainable']:.4%} of the trainable, {s['changed_fraction_all']:.4%} of all")
        print(f"  full / sparse delta bytes: {s['full_over_sparse_delta_bytes']:.1f}x (target {s['target']:.0f}x: "
              f"{'met' if s['target_met'] else 'NOT met'}); trainable-whole / sparse delta: {s['trainable_over_sparse_delta_bytes']:.1f}x; "
              f"full / sparse over an anchor cycle of {info['anchor_every']}: {s['full_over_sparse_cycle_bytes']:.2f}x")
    print(f"  receivers bitwise equal to the trainer's {info['wire']} weights: {', '.join(result['verified'])}")


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.receiver:
        return receiver_main(args.fault)
    result = main_trainer(args)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print_summary(result)


if __name__ == "__main__":
    main()
