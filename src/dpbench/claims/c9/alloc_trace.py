"""The device allocations of one rehearsed rank, recorded on fake tensors: every tensor storage
allocated and freed, in order, with the stream current at its allocation, for the caching
allocator's replay (dpbench.analysis.caching_allocator) to say what a GPU would reserve.

The case runs as claims.c9.fake runs it (rank 0 of N over the fake process group, under
FakeTensorMode: the workload, engine.wrap, a warm step, the profiled step), with what the GPU
rehearsal (claims.c9.rehearsal.run_case) does on the device and the fake run does not:
- the model built on the CPU comes whole onto the GPU before fully_shard (`model.to(device)`):
  one allocation per parameter storage, in the order Module._apply visits them, freed when that
  storage dies (fully_shard replaces the parameters by their shards);
- the step's inputs are two device tensors (x and y, each copied to the GPU on its own).

What counts as an allocation: a fake storage first seen as an op's output (a dispatch mode inside
FakeTensorMode; DTensor ops are seen as their local ops), and a storage resized from 0 bytes
(FSDP2 frees and re-allocates its unsharded parameters with UntypedStorage.resize_, which no
dispatch mode sees). A free: a storage resized to 0, or its Python object finalized (PyTorch
keeps one Python object per storage, as MemTracker relies on).

gloo's own copies: on CUDA tensors gloo's all-gather and reduce-scatter each hold one more buffer
of the whole while they run (docs/sharding.md: tools/device/gloo_clone_probe.py on an H100), on
the stream current at the call. Each is a transient allocation of the collective's whole payload
there, tagged GLOO (the replay leaves them out for NCCL's rank, which makes neither).

cuBLAS's workspaces, as the H100's own allocator history shows them (torch 2.11, the reference
h100-alloc-history-209515f): PyTorch gives each cuBLAS handle (one per thread) a workspace on
each stream at its first GEMM there, of the size NVIDIA recommends for the card (32 MiB from
Hopper on), and cuBLASLt one per stream (1 MiB), each from the caching allocator just after the
GEMM's output and never freed. The backward runs on the autograd engine's own thread, so its
first GEMM brings a second cuBLAS workspace: the forward's first GEMM allocates 32 + 1 MiB, the
backward's 32 MiB. Tagged CUBLAS (a replay for an older card leaves them out). They live as long
as the process: a case that is not its process's first finds them made (caching_allocator.replay's
`after`).

Streams: FSDP2 makes its streams on the CPU too (torch.cpu.Stream) and enters them with
torch.cpu.stream, so torch.cpu.current_stream() tells them apart. The default stream is "0";
FSDP2's by their FSDPCommContext names.

    PYTHONPATH=src python3 -m dpbench.claims.c9.alloc_trace --ranks 8 --out trace-n8.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
import weakref
from contextlib import contextmanager, nullcontext
from functools import wraps
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from dpbench.analysis.caching_allocator import (PROFILED_END, PROFILED_START, SHARDED, WARM_END, WARM_START,
                                                replay)
from dpbench.claims.c9.fake import fake_store
from dpbench.claims.c9.rehearsal import run_config
from dpbench.plan import variants
from dpbench.run import components, engine
from dpbench.run.components import collective_name, payload_bytes
from dpbench.run.step import train_step

DEFAULT_STREAM = "0"
FSDP_STREAMS = ("all_gather_copy_in_stream", "all_gather_stream", "reduce_scatter_stream", "all_reduce_stream")
GLOO = "gloo"   # the tag of gloo's own copy of a collective's buffer
GLOO_COPIED = ("all_gather", "reduce_scatter")   # the collectives it copies (all_reduce: none)
CUBLAS = "cublas"   # the tag of cuBLAS's and cuBLASLt's workspaces
CUBLAS_WORKSPACE_BYTES = 32 * 2 ** 20   # NVIDIA's recommended size from Hopper (sm90) on, per handle and stream
CUBLASLT_WORKSPACE_BYTES = 2 ** 20      # cuBLASLt's, per stream (the H100's history: once, not per thread)
GEMMS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
         torch.ops.aten.baddbmm.default}

# the 236M case of tools/device/rehearse.py (SIZES["235m"]): width 1024, 16 layers, batch 2
CASE_236M = {"name": "235m-fsdp", "variant": "fsdp", "options": {}, "batch": 2,
             "args": {"width": 1024, "layers": 16, "heads": 16}}


PROPAGATION_FILE = "_sharding_prop.py"   # torch.distributed.tensor's ShardingPropagator


def in_sharding_propagation() -> bool:
    """Whether DTensor's sharding propagation is on the stack (it calls ops on whole-shaped
    fake tensors, as no device does)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.endswith(PROPAGATION_FILE):
            return True
        frame = frame.f_back
    return False


def _active_fake_mode():
    from torch._guards import detect_fake_mode
    return detect_fake_mode()


class AllocationTrace(TorchDispatchMode):
    """Records ("alloc", key, nbytes, stream), ("free", key) and ("mark", name) events. A key
    names one allocation (a storage resized to 0 and back gets a new key)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple] = []
        self._key_of: dict[int, int | None] = {}   # id(storage) -> its live allocation's key
        self._next_key = 0
        self._streams: dict[int, tuple[Any, str]] = {}   # id(stream) -> (stream, label)
        self._fake_mode = None
        self.paused = False
        self._workspaces: set[tuple[str, str]] = set()   # (thread, stream) pairs whose workspaces exist

    # -- streams ------------------------------------------------------------------------------
    def name_streams(self, default: Any, named: dict[str, Any]) -> None:
        """Labels for stream objects: the default one, and FSDP2's by name. Streams unnamed when
        first seen get "s<k>" by order of appearance."""
        self._streams[id(default)] = (default, DEFAULT_STREAM)
        for name, stream in named.items():
            self._streams[id(stream)] = (stream, name)

    def _stream_label(self) -> str:
        stream = torch.cpu.current_stream()
        if id(stream) not in self._streams:
            # kept alive, so its id is not reused by another stream
            self._streams[id(stream)] = (stream, f"s{len(self._streams)}")
        return self._streams[id(stream)][1]

    def relabel(self, names: dict[Any, str]) -> None:
        """Rename streams labelled before their names were known (FSDP2 makes its streams at
        the first forward): `names` maps stream objects to their names."""
        renames = {}
        for key, (stream, label) in list(self._streams.items()):
            for obj, name in names.items():
                if obj is stream and label != name:
                    renames[label] = name
                    self._streams[key] = (stream, name)
        if renames:
            self.events = [(*e[:3], renames.get(e[3], e[3]), *e[4:]) if e[0] == "alloc" else e
                           for e in self.events]

    # -- events -------------------------------------------------------------------------------
    def mark(self, name: str) -> None:
        self.events.append(("mark", name))

    def allocate(self, storage: torch.UntypedStorage, nbytes: int | None = None,
                 stream: str | None = None) -> int:
        """One allocation of `storage` (its bytes unless given), freed when it dies or is
        resized to 0."""
        key = self._next_key
        self._next_key += 1
        sid = id(storage)
        fresh = sid not in self._key_of
        self._key_of[sid] = key
        self.events.append(("alloc", key, storage.nbytes() if nbytes is None else nbytes,
                            stream or self._stream_label()))
        if fresh:
            weakref.finalize(storage, self._finalized, sid)
        return key

    def allocate_standalone(self, nbytes: int, stream: str = DEFAULT_STREAM, tag: str | None = None) -> int:
        """An allocation the fake run has no storage for (an input's own device copy, gloo's
        copy of a collective's buffer: `tag`); freed only by free_key."""
        key = self._next_key
        self._next_key += 1
        self.events.append(("alloc", key, nbytes, stream) + ((tag,) if tag else ()))
        return key

    def ignore(self, storage: torch.UntypedStorage) -> None:
        """A storage that is no device allocation of its own (the CPU batch the inputs are
        copied from): its views are not new allocations either."""
        sid = id(storage)
        if sid not in self._key_of:
            self._key_of[sid] = None
            weakref.finalize(storage, self._finalized, sid)

    def free_key(self, key: int) -> None:
        self.events.append(("free", key))

    def _finalized(self, sid: int) -> None:
        key = self._key_of.pop(sid, None)
        if key is not None:
            self.events.append(("free", key))

    def _resized(self, storage: torch.UntypedStorage, before: int, after: int) -> None:
        sid = id(storage)
        if sid not in self._key_of or self.paused:
            return
        if before and not after:
            key = self._key_of[sid]
            if key is not None:
                self.events.append(("free", key))
            self._key_of[sid] = None
        elif after and not before:
            self.allocate(storage)

    @contextmanager
    def resizes_tracked(self):
        """UntypedStorage.resize_ patched for the trace (no dispatch mode sees it)."""
        original = torch.UntypedStorage.resize_

        @wraps(original)
        def resize_(storage, size):
            before = storage.nbytes()
            out = original(storage, size)
            self._resized(storage, before, storage.nbytes())
            return out

        torch.UntypedStorage.resize_ = resize_
        try:
            yield
        finally:
            torch.UntypedStorage.resize_ = original

    def __enter__(self):
        self._fake_mode = _active_fake_mode()
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # DTensor's own dispatch first: its local ops come back here as plain fake tensors
        if any(t is DTensor for t in types):
            return NotImplemented
        if func is torch.ops._c10d_functional.wait_tensor.default:
            # the meta kernel returns a new tensor; on the device wait_tensor returns its input
            return args[0]
        workspaces = self._new_workspaces() if func in GEMMS and not self.paused else ()
        copy = None
        name = collective_name(str(getattr(func, "_overloadpacket", "")))
        if name in GLOO_COPIED and not self.paused and str(func.namespace) == "c10d":
            copy = self.allocate_standalone(payload_bytes(name, args), self._stream_label(), GLOO)
        out = func(*args, **(kwargs or {}))
        if copy is not None:   # held while the collective runs
            self.free_key(copy)
        # DTensor's sharding propagation runs ops on whole-shaped fake tensors to learn their
        # outputs' shapes (under a fake mode of its own, or under this one where one is active,
        # as for foreach ops and clone): no device allocates for it
        if not self.paused and _active_fake_mode() is self._fake_mode and not in_sharding_propagation():
            for t in tree_flatten(out)[0]:
                if isinstance(t, FakeTensor):
                    storage = t.untyped_storage()
                    if id(storage) not in self._key_of and storage.nbytes() > 0:
                        self.allocate(storage)
        for stream, nbytes in workspaces:   # after the GEMM's output, as on the GPU
            self.allocate_standalone(nbytes, stream, CUBLAS)
        return out

    def _new_workspaces(self) -> list[tuple[str, int]]:
        """The workspaces a GEMM here makes: cuBLAS's for this thread's handle on this stream
        (the backward runs on the autograd engine's thread: an autograd node is executing) and
        cuBLASLt's for the stream, each the first time."""
        stream = self._stream_label()
        thread = "autograd" if torch._C._current_autograd_node() is not None else "main"
        out = []
        for key, nbytes in (((thread, stream), CUBLAS_WORKSPACE_BYTES), (("lt", stream), CUBLASLT_WORKSPACE_BYTES)):
            if key not in self._workspaces:
                self._workspaces.add(key)
                out.append((stream, nbytes))
        return out


def parameters_as_moved(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters in the order model.to(device) copies them (Module._apply: a module's
    children first, then its own), each storage once (a tied weight is moved once)."""
    out, seen = [], set()

    def visit(module: torch.nn.Module) -> None:
        for child in module.children():
            visit(child)
        for p in module._parameters.values():
            if p is not None and id(p.untyped_storage()) not in seen:
                seen.add(id(p.untyped_storage()))
                out.append(p)

    visit(model)
    return out


def as_on_cuda(opt: torch.optim.Optimizer) -> None:
    """The optimizer's implementation as CUDA tensors choose it: torch.optim takes foreach (one op
    over every tensor, a new list where the step is not in place: weight decay's gradients, all
    at once) for CUDA tensors, DTensors included, and a loop over the tensors on the CPU; fused
    where the run asks for it either way."""
    for group in opt.param_groups:
        if not group.get("fused") and group.get("foreach") is None:
            group["foreach"] = True


def record_case(case: dict[str, Any], world: int) -> dict[str, Any]:
    """The allocation trace of `case` as rank 0 of `world` ranks: {"events": [...], "streams":
    [labels], "wall_s": seconds, ...}."""
    started = time.perf_counter()
    cfg = run_config(case, world, case["batch"])
    dist.init_process_group("fake", rank=0, world_size=world, store=fake_store())
    trace = AllocationTrace()
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), trace.resizes_tracked():
            trace.paused = True
            spec = engine.build_workload(cfg)
            model = spec.model
            trace.paused = False
            with trace:
                default = torch.cpu.current_stream()
                trace.name_streams(default, {})
                # model.to(device): every parameter on the device before fully_shard
                # (no loop variable left holding the last parameter past fully_shard)
                for storage in [p.untyped_storage() for p in parameters_as_moved(model)]:
                    trace.allocate(storage, stream=DEFAULT_STREAM)
                del storage
                variant, opt = engine.wrap(cfg, spec, model, [torch.device("cpu")], world)
                as_on_cuda(opt)
                trace.mark(SHARDED)
                trace.paused = True
                x, y = spec.batch(torch.Generator().manual_seed(cfg.seed), case["batch"])
                trace.paused = False
                for t in (x, y):
                    trace.ignore(t.untyped_storage())
                # each copied to the device on its own (rehearsal.batch_of: x.to(device), y.to(device))
                inputs = [trace.allocate_standalone(t.numel() * t.element_size()) for t in (x, y)]
                trace.mark(WARM_START)
                train_step(variant, opt, x, y, case["batch"] * world)
                trace.mark(WARM_END)
                trace.mark(PROFILED_START)
                # as on the GPU (track_cpu off): no live-tensor tracker in the step
                components.profiled_step(variant, opt, x, y, case["batch"] * world, nullcontext, True,
                                         track_cpu=False)
                trace.mark(PROFILED_END)
                ctx = variant.module._get_fsdp_state()._comm_ctx
                trace.relabel({getattr(ctx, n): n for n in FSDP_STREAMS if hasattr(ctx, n)})
                for key in inputs:
                    trace.free_key(key)
                trace.paused = True
    finally:
        dist.destroy_process_group()
    streams = sorted({e[3] for e in trace.events if e[0] == "alloc"})
    return {"case": case["name"], "ranks": world, "torch": torch.__version__, "streams": streams,
            "events": trace.events, "wall_s": round(time.perf_counter() - started, 2)}


def replayed_reserved_mib(cases: list[dict[str, Any]], world: int, work: Path) -> dict[str, float]:
    """Per sharded case of a plan, rank 0's reserved bytes (MiB) at the profiled step's end, as
    the rehearsal on one GPU would cache them: each case traced here on fake tensors (a process
    of its own: the fake process group), then replayed with the cache emptied after sharding and
    gloo's copies kept. A case whose trace failed has none."""
    sharded = [c for c in cases if variants.spec(c["variant"]).shards_parameters]
    if not sharded:
        return {}
    plan, out = work / f"trace-plan-{world}.json", work / f"traces-{world}.jsonl"
    plan.write_text(json.dumps(sharded))
    out.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-m", "dpbench.claims.c9.alloc_trace", "--ranks", str(world), "--plan",
                    str(plan), "--out", str(out)], check=False, timeout=60 + 30 * len(sharded),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    found = {}
    for line in (out.read_text().splitlines() if out.exists() else []):
        t = json.loads(line)
        if t.get("status") == "ok":
            end = replay([tuple(e) for e in t["events"]], empty_cache_at=(SHARDED,)).marks[PROFILED_END]
            found[t["case"]] = end.reserved / 2 ** 20
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", required=True, type=int, help="N, the ranks rank 0 stands among")
    ap.add_argument("--out", required=True, type=Path,
                    help="the trace, JSON; with --plan, JSON lines, one trace per case (appended)")
    ap.add_argument("--case", type=json.loads, default=CASE_236M,
                    help="a rehearsal case as JSON (default: the 236M fsdp one)")
    ap.add_argument("--plan", type=Path, help="JSON: a list of cases (tools/device/rehearse.py's plan)")
    args = ap.parse_args(argv)
    cases = json.loads(args.plan.read_text()) if args.plan else [args.case]
    for case in cases:
        if args.ranks < case.get("min_ranks", 1) or args.ranks > case.get("max_ranks", args.ranks):
            continue
        about = {"case": case["name"], "ranks": args.ranks, "variant": case["variant"],
                 "options": case.get("options") or {}, "batch": case["batch"],
                 "size": f"{case['args']['width']}x{case['args']['layers']}"}
        try:
            rec = {**record_case(case, args.ranks), **about, "status": "ok"}
        except Exception as exc:   # one case's failure is a line with its reason; the others still run
            print(traceback.format_exc()[-2000:], flush=True)
            rec = {**about, "status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:500], "events": []}
        if args.plan:
            with open(args.out, "a") as f:
                f.write(json.dumps(rec) + "\n")
        else:
            args.out.write_text(json.dumps(rec))
        why = f" ({rec['reason']})" if rec.get("reason") else ""
        print(f"[alloc_trace] {case['name']} N={args.ranks}: {rec['status']}{why}, {len(rec['events'])} events, "
              f"streams {rec.get('streams')}, {rec.get('wall_s')} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
