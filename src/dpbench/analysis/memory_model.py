"""What each variant should hold per device, in closed form, beside what a run measured.

Per device, with P parameters of b bytes each as stored (4 in fp32; the record's param_bytes / P),
k optimizer slots of 4 bytes (SGD with momentum 1, without 0, Adam 2), N ranks:

    single, dp*, ddp   parameters b·P, gradients b·P, optimizer 4k·P
    zero1              the optimizer term divided by N (ZeroRedundancyOptimizer's partition)
    fsdp               all three divided by N, plus the largest unit's unsharded parameters while
                       it computes; with reshard_after_forward false every unit's unsharded
                       parameters stay from the forward to the backward
    hsdp               as fsdp, divided by the shard group's size S (hsdp_shard_size, else N)

The largest unit is what one all-gather brings: FSDP2 gathers one unit's own parameters at a
time (those no nested unit manages; the root's own are the embedding of a tied transformer),
in the compute dtype; on a shard group of one rank it gathers nothing (the unsharded
parameters are the shard itself), so the term is 0 there. A record measures it as the largest
single all-gather the rank's collective counter saw (`largest_gather_mib`).

Per rank under rehearsal (N ranks sharing one GPU, each its own process and allocator, doc
docs/sharding.md): every term above is per rank; the activation peak is predicted from the
one-rank run of the same variant and per-rank batch (`with_references`; reserved from it and
the slack of the fewest ranks that communicate, below), phase by phase, since what a rank holds
at a phase's peak differs:
  - forward: the state (last step's gradients included) and the activations;
  - backward: the step has freed last step's gradients (zero_grad(set_to_none=True) after the
    forward) and writes them again as it goes: a peak before it writes any holds the state less
    its gradients, b·P at one rank, b·P/N under fsdp, so sharded ranks' activation peaks,
    measured from the state, rise by b·P·(1 - 1/N); a later peak rises by the share not yet
    written (counted by kind where the CPU's tracker measured it; small where the peak comes at
    the backward's end). A row that marks the backward's first gradient (run.components:
    `backward_start_peak_mib`, from zero_grad to there, and `backward_late_peak_mib`, the rest)
    has both apart: the start rises by all the freed gradients and, from N = 2 with resharding,
    holds the unit the backward gathers first (the forward's last, prefetched as the root's
    backward begins: `gather_kept`; where one rank's start peaks before that unit would arrive,
    as at 11.7M and 42.3M, an upper bound by at most the unit); the later peak by the share not
    yet written (none on a GPU, where nothing tells); the backward's peak is the larger (fsdp at
    236M: the start from N = 4, issue 38). A row that marks each unit's part too
    (run.components.BACKWARD_UNIT) has the later peak part by part, each with the share its
    unit's place in the order tells and, from N = 2, the next unit's prefetched all-gather
    output (unit_parts_above_start): from N = 4 at 1.08B's units the highest part lies inside
    the units, which no part one rank holds shows. An older row, one backward peak: a share as above, none where it lies past the
    level the forward ended at (as at the transformer's loss), else all;
  - without resharding (fsdp-keep), where one rank's row lists its units (`unit_mib`), what a
    rank keeps beyond a resharding rank, moment by moment (kept_units): each unit stays whole
    from its forward to its post-backward, the root through the loss, which a resharding rank
    reshards as its forward ends; so at the loss (`loss_peak_mib`, marked apart) every unit
    and the root, inside the model's forward every unit but those one rank held there (by
    kind, else the root and the last unit), as the last unit gathers every unit before it, at
    the backward's start every unit and the root less what one rank held there (it gathers
    none), in a unit's part the units the backward has not reached, in the root's none.
    Older rows (no unit sizes): every unit added to every peak, an upper bound (the root twice);
  - both: the units held unsharded at the peak (`held_at_peak`; the older rule's term for fsdp
    without resharding above): every unit without resharding,
    at every N (FSDP2 copies a unit out at one rank too); none with resharding, where the peak
    falls outside every unit's compute (the LM's loss over its vocabulary, issue 38's CPU
    tracker); FSDP2 keeps the output of a unit's all-gather until the next one, and the last
    unit's until its root's forward ends (to overlap its copy-out with the next
    all-gather; none on a shard group of one), so with resharding a forward's peak inside the
    model's forward (marked apart from the loss, `model_forward_peak_mib`) holds one unit more
    than one rank does, the unit of the forward's last all-gather (`forward_last_gather_mib`,
    measured: `gather_kept`); a peak in the loss holds none. As the last unit gathers, before
    its compute, such a rank holds it three times over the level one rank's forward had reached
    there (`forward_last_unit_start_mib`): the unit before it kept, its all-gather output and
    its parameters copied out; where units are large beside a unit's activations that moment
    is the forward's peak (2048x20 at batch 1 on the CPU). Left out where one rank's row has no
    parts marked (older rows): the unit the backward prefetches where its later peak lies inside
    the units (the tests' tiny LM; 1.08B from N = 4).
Activations themselves do not depend on N at a fixed per-rank batch. Reserved is the predicted
state and peak plus the caching allocator's slack, measured at the fewest ranks (two or more) of
the same variant: a rank that communicates keeps pools on the communication streams, sized by the
units (FSDP2's all-gather and reduce-scatter buffers) and not by N, which one rank never makes.

Unsharded parameters are in the compute dtype: 2 bytes under bf16 (MixedPrecisionPolicy's bf16
parameters, fp32 reduction), b otherwise. The state is what a rank holds between steps: the
three terms plus DDP's gradient buckets (b·P, unless gradient_as_bucket_view), compared with
the allocated bytes as the profiled step's forward began.
Numbers only (torch-free); docs/sharding.md says what each term leaves out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from dpbench.results.schema import PREDICTED_COMPONENTS

MIB = 2 ** 20
SLOT_BYTES = 4          # optimizer state is fp32 (the parameters as stored)
BF16_BYTES = 2
TOLERANCE = 0.05        # a component further than this from its prediction is flagged
# What the closed forms predict (results.schema.PREDICTED_COMPONENTS), and which of them a record
# measures too (its <name>_mib; state: measured_state).
COMPARED = ("parameters", "gradients", "optimizer", "state", "largest_unit", "activation_peak", "reserved_peak")
# the measured column of each compared component where it is not <component>_mib
MEASURED_AS = {"largest_unit": "largest_gather_mib"}
CONTEXT_BYTES = 0.5 * 2 ** 30   # a CUDA context and cuBLAS's workspaces per process, outside the allocator
OPTIMIZER_SLOTS = {"sgd": 1, "adam": 2, "adamw": 2}


@dataclass(frozen=True)
class Setting:
    """What the closed forms need to know of a run."""
    variant: str
    parameters: int
    param_bytes: float = 4.0            # bytes per parameter as stored
    optimizer_slots: int = 1
    ranks: int = 1
    precision: str = "fp32"
    reshard_after_forward: bool = True
    hsdp_shard_size: int | None = None
    largest_unit_bytes: float | None = None     # the largest fully_shard unit, unsharded
    last_gather_bytes: float | None = None      # the model's forward's last all-gather, as gathered
    gradient_as_bucket_view: bool = False

    @property
    def shard_size(self) -> int:
        """How many ranks share one copy of the state."""
        if self.variant == "hsdp" and self.hsdp_shard_size:
            return self.hsdp_shard_size
        return self.ranks if self.variant in ("fsdp", "hsdp") else 1

    @property
    def compute_bytes(self) -> float:
        """Bytes per unsharded parameter while a sharded unit computes."""
        return BF16_BYTES if self.precision == "bf16" and self.variant in ("fsdp", "hsdp") else self.param_bytes


def optimizer_slots(config: Mapping[str, Any]) -> int:
    """k: state tensors per parameter of the run's optimizer (SGD keeps momentum only when > 0)."""
    name = str(config.get("optimizer") or "sgd").lower()
    if name == "sgd":
        return 1 if (config.get("momentum") or 0) > 0 else 0
    return OPTIMIZER_SLOTS.get(name, 0)


def predicted_bytes(s: Setting) -> dict[str, float | None]:
    """Bytes per device: parameters, gradients, optimizer state, DDP's gradient buckets, their sum
    (`state`: what a rank holds between steps, the last step's gradients included, since the
    step zeroes them after its forward), the unsharded parameters a sharded variant adds
    while it computes (`unsharded`, at most: None where the largest unit is not known), those
    it holds at its step's peaks (`held_at_peak`, module docstring), and the all-gather output
    it keeps through the model's forward (`gather_kept`: None where not measured)."""
    shard = s.shard_size
    params = s.param_bytes * s.parameters / shard
    grads = s.param_bytes * s.parameters / shard
    optimizer = SLOT_BYTES * s.optimizer_slots * s.parameters / (s.ranks if s.variant == "zero1" else shard)
    buckets = 0.0 if s.variant not in ("ddp", "zero1") or s.gradient_as_bucket_view \
        else s.param_bytes * s.parameters   # DDP's flat buckets beside the .grad tensors
    unsharded: float | None = 0.0
    largest: float | None = 0.0
    every_unit = s.variant in ("fsdp", "hsdp") and not s.reshard_after_forward
    if s.variant in ("fsdp", "hsdp") and shard > 1:   # a shard group of one gathers nothing
        # the unit in the compute dtype (bf16 under MixedPrecisionPolicy), stored as param_bytes
        largest = None if s.largest_unit_bytes is None else s.largest_unit_bytes * s.compute_bytes / s.param_bytes
        unsharded = s.compute_bytes * s.parameters if every_unit else largest
    # FSDP2 keeps the last all-gather's output until the next one or its root's forward ends
    # (to overlap the copy-out with the next all-gather). Without resharding it does so too, but
    # there every unit held (held_at_peak), the root included, stands in for it: one rank's
    # model-forward peak already held the root unsharded, so adding both would count the root
    # twice (236M on the CPU's tracker: -2.2%, where the loss decides the peak)
    kept = s.last_gather_bytes if s.variant in ("fsdp", "hsdp") and shard > 1 and not every_unit else 0.0
    return {"parameters": params, "gradients": grads, "optimizer": optimizer, "buckets": buckets,
            "state": params + grads + optimizer + buckets, "unsharded": unsharded, "largest_unit": largest,
            # at the step's peaks: every unit kept unsharded (copied out at one rank too), else none
            "held_at_peak": s.compute_bytes * s.parameters if every_unit else 0.0,
            "gather_kept": kept}


def rank_estimate_bytes(s: Setting, cap_bytes: float | None = None) -> float:
    """What one rank needs of its device at least: its state, the units it holds gathered (the
    largest unit where unknown), and a CUDA context; with a memory cap, the cap (what the rank
    may fill) where larger. Activations are left out (a lower bound without a cap)."""
    b = predicted_bytes(s)
    need = float(b["state"] or 0.0) + float(b["unsharded"] or 0.0)
    return max(need, cap_bytes or 0.0) + CONTEXT_BYTES


def rehearsal_misfit(s: Setting, ranks_on_device: int, device_bytes: float,
                     cap_bytes: float | None = None, replayed_bytes: float | None = None) -> str | None:
    """Why `ranks_on_device` rehearsed ranks cannot share a device of `device_bytes` (None when
    they fit): the sum of their per-rank estimates (rank_estimate_bytes, or the reserved bytes
    the caching allocator's replay of the case's trace gives where larger) beside its memory."""
    estimate = rank_estimate_bytes(s, cap_bytes)
    replayed = replayed_bytes + CONTEXT_BYTES if replayed_bytes else 0.0
    per_rank = max(estimate, replayed)
    if ranks_on_device * per_rank <= device_bytes:
        return None
    what = ("the allocator's replay of its trace" if replayed > estimate else
            "its memory cap" if cap_bytes and cap_bytes >= per_rank - CONTEXT_BYTES else "the memory model's state")
    return (f"{ranks_on_device} rehearsed ranks do not fit one GPU: {ranks_on_device} x {per_rank / 2**30:.2f} GiB "
            f"per rank ({what} + {CONTEXT_BYTES / 2**30:g} GiB of CUDA context) = "
            f"{ranks_on_device * per_rank / 2**30:.2f} GiB > the device's {device_bytes / 2**30:.2f} GiB")


def setting_of(record: Mapping[str, Any], largest_unit_mib: float | None = None,
               last_gather_mib: float | None = None) -> Setting | None:
    """The closed forms' inputs from a record (its config and sizes); None without its sizes."""
    cfg = record.get("config") or {}
    parameters, param_bytes = record.get("parameters"), record.get("param_bytes")
    if not parameters or not param_bytes:
        return None
    ranks = int(record.get("gpus") or 1)
    nodes = int((record.get("launch") or {}).get("nodes") or 1)
    return Setting(variant=str(record.get("variant")), parameters=int(parameters),
                   param_bytes=param_bytes / parameters, optimizer_slots=optimizer_slots(cfg),
                   ranks=ranks, precision=str(cfg.get("precision", "fp32")),
                   reshard_after_forward=bool(cfg.get("reshard_after_forward", True)),
                   # hsdp_shard_size null: the ranks of one node
                   hsdp_shard_size=cfg.get("hsdp_shard_size") or max(1, ranks // nodes),
                   largest_unit_bytes=None if largest_unit_mib is None else largest_unit_mib * MIB,
                   last_gather_bytes=None if last_gather_mib is None else last_gather_mib * MIB,
                   gradient_as_bucket_view=bool(cfg.get("gradient_as_bucket_view", False)))


def _mib(value: float | None) -> float | None:
    return None if value is None else value / MIB


def step_start(row: Mapping[str, Any]) -> float | None:
    """What was allocated as the profiled step's forward began (MiB): the forward-backward peak
    less the activation peak (measured from that start)."""
    peaks = [row.get(k) for k in ("forward_peak_mib", "backward_peak_mib") if is_number(row.get(k))]
    activations = row.get("activation_peak_mib")
    if not peaks or not is_number(activations):
        return None
    return max(peaks) - activations


def measured_state(row: Mapping[str, Any]) -> float | None:
    """What the device held as the profiled step's forward began (MiB), the dataset on it left
    out (step_start less data_mib)."""
    start = step_start(row)
    if start is None:
        return None
    data = row.get("data_mib")
    return start - (data if is_number(data) else 0.0)


def predicted_row(record: Mapping[str, Any], row: Mapping[str, Any]) -> dict[str, float | None]:
    """One device's predicted components in MiB (the table's predicted_<component>_mib); None
    where the record lacks the sizes the closed forms need."""
    last = row.get("forward_last_gather_mib")
    s = setting_of(record, row.get("largest_unit_mib"), last if is_number(last) else None)
    b = predicted_bytes(s) if s is not None else {}
    return {f"predicted_{c}_mib": _mib(b.get(c)) for c in PREDICTED_COMPONENTS}


def _options_key(row: Mapping[str, Any]) -> str:
    return str(row.get("options") or "")


def reference_key(row: Mapping[str, Any]) -> tuple:
    """Which one-rank row predicts a row's activations: the same variant and options (at one
    rank hsdp shards as fsdp does: nothing)."""
    variant = "fsdp" if row.get("variant") == "hsdp" else row.get("variant")
    return variant, _options_key(row)


def _number(row: Mapping[str, Any], key: str) -> float:
    value = row.get(key)
    return float(value) if is_number(value) else 0.0


def backward_after_zero_grad(row: Mapping[str, Any]) -> bool:
    """Whether a memory row's backward peaked after zero_grad freed the gradients: the backward
    phase begins at the level the forward ended at, so a peak above it came later (without that
    level recorded, above the forward's peak, which is at least as high)."""
    backward = row.get("backward_peak_mib")
    ended = row.get("forward_end_mib") if is_number(row.get("forward_end_mib")) else row.get("forward_peak_mib")
    return is_number(backward) and is_number(ended) and backward > ended


# The memory tracker's names for the gradients a rank holds (run.live_memory: the CPU's peaks by kind)
GRADIENT_KINDS = ("Gradient", "Sharded Grad")


def gradients_at_backward_peak(row: Mapping[str, Any], phase: str = "backward") -> float | None:
    """The share of its gradients a rank holds again at its backward's peak (0: the peak comes
    before the backward writes any, as at the transformer's loss; near 1: at its end, as at
    2048x20), where the tracker counted the peak by kind (the CPU); None elsewhere. `phase`:
    backward_start or backward_late for the backward's two parts where the row has them apart."""
    kinds, gradients = row.get(f"{phase}_peak_by_kind_mib"), row.get("gradients_mib")
    if not isinstance(kinds, Mapping) or not is_number(gradients) or gradients <= 0:
        return None
    return min(1.0, sum(float(kinds.get(k) or 0.0) for k in GRADIENT_KINDS) / gradients)


@dataclass(frozen=True)
class KeptUnits:
    """Without resharding: the units a rank keeps unsharded from the forward through the backward,
    from ref's unit sizes (`unit_mib`, the root last) in the compute dtype, MiB."""
    sizes: tuple[float, ...]     # every unit but the root, in fully_shard's order
    root: float

    @property
    def all(self) -> float:
        return sum(self.sizes)

    @property
    def last(self) -> float:
        return self.sizes[-1] if self.sizes else 0.0

    def before(self, i: int) -> float:
        """The units the forward ran before unit i: in unit i's part of the backward still unsharded."""
        return sum(self.sizes[:i])


def kept_units(row: Mapping[str, Any], ref: Mapping[str, Any]) -> KeptUnits | None:
    """A row that keeps every unit unsharded (fsdp or hsdp without resharding: its held_at_peak
    beyond ref's) where ref lists its units' sizes (runs from 56c1f32 on); None otherwise."""
    extra = _number(row, "predicted_held_at_peak_mib") - _number(ref, "predicted_held_at_peak_mib")
    sizes = ref.get("unit_mib")
    if extra <= 0 or not isinstance(sizes, list) or len(sizes) < 2 or sum(sizes) <= 0:
        return None
    dtype = extra / sum(sizes)   # the compute dtype's bytes over the stored ones
    return KeptUnits(tuple(dtype * float(u) for u in sizes[:-1]), dtype * float(sizes[-1]))


def held_by_ref(ref: Mapping[str, Any], keep: KeptUnits, phase: str, otherwise: float) -> float:
    """The unsharded parameters (units and root) a one-rank row held at a phase's peak, MiB: by
    kind where the CPU's tracker counted it, else `otherwise`."""
    kinds = ref.get(f"{phase}_peak_by_kind_mib")
    if isinstance(kinds, Mapping) and kinds:   # a kind not held is left out
        return min(keep.all + keep.root, float(kinds.get("Unsharded Param") or 0.0))
    return otherwise


def unit_parts_above_start(ref: Mapping[str, Any], start: float, freed: float, kept: float,
                           keep: KeptUnits | None = None) -> dict[str, float]:
    """fsdp's backward part by part where `ref` (a one-rank row) marked where each unit's part ends
    (run.components.BACKWARD_UNIT, after its post-backward: `backward_unit_peaks_mib` by the unit's index in fully_shard's
    order, the root last, and `backward_end_part_peak_mib`, the root's part), MiB above the step's
    start at this N: ref's, plus the gradients this N frees less than ref (`freed`) for the share
    not yet written, plus, in a unit's part, the all-gather output of the unit the backward
    computes next (the one before it in fully_shard's order), which its pre-backward prefetches
    and one rank never gathers: `kept` (the forward's last unit's, this N beyond ref) scaled to
    that unit's size; the first unit has none after it. A unit's part ends with its post-backward,
    which writes its gradient shard: in a unit's part the gradients of the units after it (but
    the root) are written, in the root's part every unit's but the root's (`unit_mib`, each
    unit's own parameters as stored). Without resharding (`keep`), a unit's part holds every unit
    the backward has not reached yet unsharded, kept from the forward, and gathers none: the
    units before it in fully_shard's order in place of the prefetched one. {} where ref marked no units."""
    peaks, sizes = ref.get("backward_unit_peaks_mib"), ref.get("unit_mib")
    if not isinstance(peaks, Mapping) or not peaks or not isinstance(sizes, list) or not sizes \
            or not is_number(ref.get("backward_end_part_peak_mib")):
        return {}
    total, last = sum(sizes), sizes[-2] if len(sizes) > 1 else 0.0
    if total <= 0:
        return {}

    def prefetched(i: int) -> float:   # the next unit's all-gather output, in the compute dtype
        return kept * sizes[i - 1] / last if i >= 1 and last > 0 else 0.0
    def held(i: int) -> float:   # what this N holds in unit i's part beyond ref's
        return keep.before(i) if keep is not None else prefetched(i)
    out = {key: peak - start + (1.0 - sum(sizes[int(key) + 1:-1]) / total) * freed + held(int(key))
           for key, peak in peaks.items()}
    out["end"] = ref["backward_end_part_peak_mib"] - start + (sizes[-1] / total) * freed
    return out


def reserved_slack(row: Mapping[str, Any]) -> float | None:
    """What a row's allocator kept reserved beyond its predicted state and measured activation
    peak (MiB): the caching allocator's free blocks at the reserved peak, streams' pools included."""
    keys = ("reserved_peak_mib", "predicted_state_mib", "activation_peak_mib")
    if not all(is_number(row.get(k)) for k in keys):
        return None
    return row["reserved_peak_mib"] - row["predicted_state_mib"] - row["activation_peak_mib"]


def predicted_peaks(row: Mapping[str, Any], ref: Mapping[str, Any],
                    slack: float | None = None) -> dict[str, float] | None:
    """A row's activation peak and reserved peak (MiB) predicted from `ref`, the one-rank row of
    its variant and per-rank batch, phase by phase (module docstring): the forward's peak above
    the state as there; the backward's as there plus the gradients this N frees less than one
    rank does, for the share of them not yet written again at that peak; both plus the units
    this N holds at its peaks beyond ref's. Reserved: the predicted state and peak plus the
    allocator's `slack` (the fewest ranks that communicate, with_references), else ref's. None
    without ref's peaks."""
    start = step_start(ref)
    if start is None or not all(is_number(ref.get(k)) for k in ("forward_peak_mib", "backward_peak_mib")):
        return None
    parts: dict[str, float] = {}
    freed = _number(ref, "predicted_gradients_mib") - _number(row, "predicted_gradients_mib")
    # the unit FSDP2 gathers last in the forward, which this N keeps beyond ref's; the backward
    # gathers it first, as its root's pre-backward prefetches it
    kept = _number(row, "predicted_gather_kept_mib") - _number(ref, "predicted_gather_kept_mib")
    # without resharding, where ref lists its units: what this N keeps unsharded beyond a
    # resharding rank at each moment (KeptUnits), in place of every unit added to every peak
    keep, held = kept_units(row, ref), 0.0
    if keep is not None:
        # it gathers the forward's last unit as a resharding rank does (sharded: fewer parameters than ref)
        kept = keep.last if _number(row, "predicted_parameters_mib") < _number(ref, "predicted_parameters_mib") else 0.0
    else:
        held = _number(row, "predicted_held_at_peak_mib") - _number(ref, "predicted_held_at_peak_mib")
    # as the last unit starts, every unit before it; at the loss every unit and the root (a
    # resharding rank reshards its root as its forward ends: the CPU's tracker, issue 38); at the
    # backward's start both again, less what ref held unsharded there, and it gathers none (the
    # unit a resharding rank gathers first is not `kept`)
    before_last, at_loss = (keep.all - keep.last, keep.all + keep.root) if keep is not None else (0.0, 0.0)
    at_start = keep.all + keep.root - held_by_ref(ref, keep, "backward_start", keep.root) - kept \
        if keep is not None else 0.0
    if is_number(ref.get("backward_start_peak_mib")) and is_number(ref.get("backward_late_peak_mib")):
        # ref marked the backward's first gradient: its start (every gradient freed, none written
        # but that one, the unit gathered first held) rises by all the gradients this N frees
        # less than ref does; its later peak by the share not yet written again (counted by kind
        # on the CPU; on a GPU nothing tells, so as it is)
        early = ref["backward_start_peak_mib"] - start + kept + at_start + \
            (1.0 - (gradients_at_backward_peak(ref, "backward_start") or 0.0)) * freed
        late_share = gradients_at_backward_peak(ref, "backward_late")
        late = ref["backward_late_peak_mib"] - start + at_start + \
            (1.0 - (1.0 if late_share is None else late_share)) * freed
        parts = {"backward_start_above_start_mib": early}
        if units := unit_parts_above_start(ref, start, freed, kept, keep):
            # ref marked each unit's part: the later peak is the highest part's at this N (from
            # N = 4 at 1.08B's units a unit's, not the root's: issue 38)
            late = max(units.values())
            parts["backward_units_above_start_mib"] = max(v for k, v in units.items() if k != "end")
            parts.update({f"backward_part_{k}_above_start_mib": v for k, v in units.items()})
        parts["backward_late_above_start_mib"] = late
        backward = max(early, late)
    else:
        # zero_grad freed the gradients and the backward writes them again, a share of them by
        # its peak: counted where the tracker counted the peak by kind; else none where the peak
        # lies past the forward's end (after zero_grad, before the backward writes any: the
        # transformer's loss), and all where it does not (nothing to tell: the one-rank peak)
        regrown = gradients_at_backward_peak(ref)
        if regrown is None:
            regrown = 0.0 if backward_after_zero_grad(ref) else 1.0
        backward = ref["backward_peak_mib"] - start + at_start + (1.0 - regrown) * freed
    # the loss: its own peak where ref marked it apart (loss_peak_mib), else the forward's (at
    # least the loss's); it holds no all-gather output (it comes after the root)
    model_forward, loss = ref.get("model_forward_peak_mib"), ref.get("loss_peak_mib")
    forward = (loss if is_number(loss) else ref["forward_peak_mib"]) - start + at_loss
    if is_number(model_forward):
        # the model's forward (where ref marked it apart from the loss) holds the last unit's
        # all-gather output this N keeps beyond ref's; keeping, every unit and the root but those
        # ref held there too (by kind, else the root and the forward's last unit: a one-rank
        # forward peaks as its activations grow)
        inside = keep.all + keep.root - held_by_ref(ref, keep, "model_forward", keep.root + keep.last) \
            if keep is not None else 0.0
        forward = max(forward, model_forward - start + kept + inside)
    # as the last unit gathers, before its compute, a resharding rank holds that unit three times
    # over the level ref's forward had reached there: the unit before it kept (as large, for
    # equal units), its all-gather output and its parameters copied out (ref copies them too);
    # the peak where units are large beside a unit's activations (1.08B at batch 1, the CPU)
    if kept > 0 and is_number(ref.get("forward_last_unit_start_mib")):
        forward = max(forward, ref["forward_last_unit_start_mib"] - start + 3 * kept + before_last)
    activation = max(forward, backward) + held
    # each phase's too (above the step's start): which one the prediction took, and by how much
    out = {"activation_peak_mib": activation, "forward_above_start_mib": forward + held,
           "backward_above_start_mib": backward + held, **{k: v + held for k, v in parts.items()}}
    slack = reserved_slack(ref) if slack is None else slack
    if slack is not None and is_number(row.get("predicted_state_mib")):
        out["reserved_peak_mib"] = row["predicted_state_mib"] + activation + slack
    return out


def slack_key(row: Mapping[str, Any]) -> tuple:
    """Which row's allocator slack predicts a row's reserved bytes: the same variant and options
    (hsdp its own: it adds a stream; fsdp without resharding its own where a row names it by
    `variant_label`: it keeps its units)."""
    return row.get("variant_label") or row.get("variant"), _options_key(row)


def with_references(rows: list[Mapping[str, Any]], key=reference_key) -> list[dict[str, Any]]:
    """Rows with predicted_activation_peak_mib and predicted_reserved_peak_mib where a one-rank
    row of the same key (variant and options: the same per-rank batch, weak scaling) measured
    them (predicted_peaks). Reserved takes its slack from the fewest ranks, two or more, of the
    same slack_key that measured it (their mean over ranks and repeats): a one-rank run gathers
    and reduces nothing, so the pools its communication streams keep (FSDP2's, docs/sharding.md)
    first appear there, sized by the units, not by N; at that N reserved compares with itself."""
    one = {key(r): r for r in rows if int(r.get("gpus") or 0) == 1 and is_number(r.get("activation_peak_mib"))}
    # per slack_key, the fewest ranks >= 2 that measured reserved, and its ranks' mean slack
    fewest: dict[tuple, tuple[int, list[float]]] = {}
    for r in rows:
        gpus, slack = int(r.get("gpus") or 0), reserved_slack(r)
        if gpus < 2 or slack is None:
            continue
        have = fewest.get(slack_key(r))
        if have is None or gpus < have[0]:
            fewest[slack_key(r)] = (gpus, [slack])
        elif gpus == have[0]:
            have[1].append(slack)
    out = []
    for row in rows:
        row = dict(row)
        ref, (slack_gpus, slacks) = one.get(key(row)), fewest.get(slack_key(row), (1, []))
        if slack_gpus > int(row.get("gpus") or 0):
            slack_gpus, slacks = 1, []   # a one-rank row keeps its own
        peaks = predicted_peaks(row, ref, sum(slacks) / len(slacks) if slacks else None) if ref is not None else None
        for name, value in (peaks or {}).items():
            row[f"predicted_{name}"] = value
        if peaks:   # the N whose rows each prediction came from: at that N it compares with itself
            row["reference_gpus"] = {"activation_peak": 1, "reserved_peak": slack_gpus if slacks else 1}
        out.append(row)
    return out


def comparison(rows: list[Mapping[str, Any]], tolerance: float = TOLERANCE, key=reference_key) -> list[dict[str, Any]]:
    """Measured against predicted per run, device and component (rows of memory_components.csv):
    the relative difference (measured / predicted - 1) and whether it lies beyond the tolerance.
    A component either side lacks is left out; a zero prediction compares by equality. The
    activation peak and reserved bytes compare where a one-rank row gives them (with_references),
    with the N their prediction came from (`reference_gpus`; None for the closed forms)."""
    out = []
    for row in with_references(rows, key):
        for c in COMPARED:
            measured, predicted = row.get(MEASURED_AS.get(c, f"{c}_mib")), row.get(f"predicted_{c}_mib")
            if not is_number(measured) or not is_number(predicted):
                continue
            rel = (measured / predicted - 1.0) if predicted else (0.0 if measured == 0 else float("inf"))
            out.append({**{k: row.get(k) for k in ("run_id", "variant", "gpus", "options", "device")},
                        "component": c, "measured_mib": measured, "predicted_mib": predicted,
                        "reference_gpus": (row.get("reference_gpus") or {}).get(c),
                        "relative_difference": rel, "beyond_tolerance": abs(rel) > tolerance})
    return out


def is_number(value: Any) -> bool:
    """A measured number (not None, a flag or NaN)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
