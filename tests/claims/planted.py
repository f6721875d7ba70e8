"""The claims tests' planted evidence: a fake result set (FakeTag) with C1, C6, C7 and C8 runs,
fake probe records for every claim, C9's rows, and the ledger run on them."""
from pathlib import Path

import pytest
import torch

from dpbench import results
from dpbench.claims import CONFIRMED, NUANCE, REFUTED, records
from dpbench.claims.c5 import probe as c5_probe
from dpbench.claims.c6 import probe as c6_probe
from dpbench.claims.ledger import Evidence, write_ledger
from dpbench.claims.c9 import verdict
from dpbench.claims.records import ProbeRecord, obs
from dpbench.plan.matrix import Plan, read_plan
from dpbench.plan.pipeline import load_experiment

ROOT = Path(__file__).resolve().parents[2]


PLANNED = Plan(load_experiment({"experiment": "claims"}, ROOT), 2).document()


cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path")


GATHER = c5_probe.ARTICLE_TEXT


RAN_ON_GPU = {"device_type": "cuda", "gpus_visible": 2, "torch": "2.11.0+cu130", "cuda": "13.0",
              "cudnn": 91900, "gpu_names": ["NVIDIA H200"] * 2, "python": "3.12.3"}


def _probe(cid, verdict, observations, ran_on=RAN_ON_GPU):
    return ProbeRecord(cid, cid, ran_on, observations, verdict, "")


SINGLE_STAGES_MS = {"forward": 7.0, "loss": 0.1, "backward": 14.0, "optimizer": 1.0}   # of one GPU's 23 ms step


def dp_stages(forward, **over):
    """A DataParallel step by stage (ms): the replicas' forward as given, the rest fixed unless overridden."""
    st = {"scatter": 0.3, "replicate": 1.5, "replica_threads": forward, "gather": 0.2, "loss": 0.1,
          "backward": 12.0, "backward_reduce": 0.8, "optimizer": 1.0, **over}
    return {**st, "total": sum(st.values())}


def dp_step_observations(stock=45.0, persistent=19.0, single=23.0, stock_on=725.0, persistent_on=20.0, spread=0.03,
                         off_stages=None, big=None, batch=512):
    """The C7 probe's step breakdown at `batch` with cudnn.benchmark off and on, and with `big` =
    (batch, one GPU's ms, stock DP's ms) a second one with benchmark off; each kind's timed steps
    within +-spread of its median. off_stages: stock DP's stages with benchmark off, overridden."""
    out = []
    legs = [("off", batch, single, stock, persistent), ("on", batch, single, stock_on, persistent_on)]
    if big:
        legs.append(("off", big[0], big[1], big[2], big[2] * 0.98))
    for flag, b, one, dp_ms, p_ms in legs:
        step = lambda ms: {"step_ms": ms, "images_per_s": b / ms * 1e3,
                           "step_ms_min": ms * (1 - spread), "step_ms_max": ms * (1 + spread)}
        out.append(obs(records.dp_step_id(flag, b, "steps"), f"steps {flag}", single=step(one), dp=step(dp_ms),
                       dp_persistent_threads=step(p_ms), batch=b, gpus=2))
        scale = one / 23.0
        out.append(obs(records.dp_step_id(flag, b, "stages.single"), "one GPU",
                       **{k: v * scale for k, v in SINGLE_STAGES_MS.items()}))
        over = (off_stages or {}) if (flag, b) == ("off", batch) else {}
        out.append(obs(records.dp_step_id(flag, b, "stages.dp"), "stock", **dp_stages(dp_ms - 15.9, **over)))
        out.append(obs(records.dp_step_id(flag, b, "stages.dp_persistent_threads"), "persistent",
                       **dp_stages(p_ms - 15.9)))
    return out


def fake_gpu_probes(dp_step=None):
    return {
        "C2": _probe("C2", NUANCE, [
            obs("c2.wrap.model_not_on_first_id", "model on cuda:0, DataParallel(device_ids=[1, 0])",
                stage="first forward", error="RuntimeError: module must have its parameters and buffers on device cuda:1"),
            obs("c2.cvd.set_after_cuda_init", "late", before=2, after=2),
            obs("c2.plain_fix", "plain fix", stage=None)]),
        "C3": _probe("C3", REFUTED, [
            obs("c3.cuda_all_ids.zero_grad", "zero_grad", result="gradients accumulate (grad == 2 x one pass)"),
            obs("c3.misbehaving_calls", "calls that misbehave", result=["wrapper.zero_grad()", "wrapper.state_dict()"])]),
        "C4": _probe("C4", NUANCE, [
            obs("c4.article_load", "article's load", error="RuntimeError: Error(s) in loading state_dict for DataParallel:",
                second_line='Missing key(s) in state_dict: "module.conv1.weight"'),
            obs("c4.load.bare_then_wrap", "load into the bare model, then wrap", round_trip_bit_exact=True)]),
        "C5": _probe("C5", CONFIRMED, [
            obs("c5.one_gpu", "one GPU", shape=[], warnings=[]),
            obs("c5.all_gpus", "all GPUs", shape=[2], device_ids=[0, 1], exact_article_text=True, warnings=[GATHER]),
            obs("c5.shown.default_filters", "default", shown=1, steps=5),
            obs("c5.shown.always", "always", shown=5, steps=5)]),
        "C6": _probe("C6", CONFIRMED, [
            obs("c6.article_example", "article's example", **c6_probe.article_arithmetic()),
            obs("c6.cpu.bn_eval.batch128_split3", "CPU emulation, BatchNorm eval: batch 128 as 3 chunks",
                chunks=[43, 43, 42], grad_rel_diff_mean_of_means=0.015, grad_rel_diff_sum_over_n=6e-7)]),
        "C7": _probe("C7", CONFIRMED, [
            obs("c7.conv.slowdown", "new-thread / same-thread slowdown", benchmark_on=65.7, benchmark_off=3.9),
            *(dp_step if dp_step is not None else dp_step_observations())]),
        "C9": probe_record(CROSSING),
    }


class FakeTag:
    """A results/<tag> folder: tidy tables, each run's metrics.json (its config), probes, provenance."""

    def __init__(self):
        self.groups = read_plan(PLANNED)
        self.summary, self.memory, self.steps, self.warnings, self.configs, self.records = [], [], [], [], {}, {}

    def run(self, group, variant, gpus, repeat=0, status="ok", config=None, record=None, **metrics):
        """record: more fields of the run's metrics.json (its provenance, say)."""
        opts = self.groups[group]["options"]
        rid = results.run_id(variant, gpus, repeat, opts)
        self.records.setdefault(rid, {}).update(record or {})
        known = next((row for row in self.summary if row["run_id"] == rid), None)
        if known is not None:   # groups with the same options share their runs
            known.update(metrics)
            self.configs[rid].update(config or {})
            return rid
        cfg = {"global_batch": 512, "precision": "fp32", "num_classes": 10, "momentum": 0.9, "seed": repeat,
               "deterministic": bool(opts.get("deterministic")), "channels_last": False, **opts, **(config or {})}
        self.configs[rid] = cfg
        self.summary.append({"run_id": rid, "variant": variant, "gpus": gpus, "repeat": repeat,
                             "options": self.groups[group]["label"], "status": status,
                             "reason": "" if status == "ok" else "DataParallel needs CUDA; no GPU visible",
                             "device_type": "cuda" if status == "ok" else "cpu",
                             "global_batch": cfg["global_batch"], "precision": cfg["precision"], **metrics})
        return rid

    def mem(self, rid, per_device, data_dev0=None, reserved=None):
        self.memory += [{"run_id": rid, "device": d, "allocated_mib": m, "data_mib": data_dev0 if d == 0 else None,
                         "reserved_mib": (reserved or {}).get(d, m + 200), "nvml_used_mib": m + 700}
                        for d, m in enumerate(per_device)]

    def losses(self, rid, values):
        self.steps += [{"run_id": rid, "epoch": 1, "step": i, "loss_global": v} for i, v in enumerate(values)]

    def write(self, root, tag, probes):
        rs = results.ResultSet(root, tag)
        for name, rows in [("summary", self.summary), ("memory", self.memory), ("steps", self.steps),
                           ("warnings", self.warnings)]:
            results.write_csv(rs.table_path(name), results.TABLES[name], rows)
        results.write_json(rs.provenance_path,
                           {"torch": "2.11.0+cu130", "cuda": "13.0", "cudnn": 91900,
                            "gpu_names": ["NVIDIA H200"] * 2, "driver": "580.159.04", "tag": tag})
        for rid, cfg in self.configs.items():
            results.write_json(rs.metrics_path(rid), {"run_id": rid, "config": cfg, **self.records.get(rid, {})})
        for cid, rec in probes.items():
            results.write_json(rs.probe_path(cid), rec.to_json())


def plant_c1(t, excess_dp=None, excess_sum=None, ddp_spread=0.4, ddp_swing=0.0, momentum=0.9, repeats=2,
             data_mib=None, ddp_rank=4900.0):
    """device 0's excess (MiB) per output size for dp and dp_sum over 4,800 MiB on the other
    devices; DDP ranks at ddp_rank MiB, within ddp_spread of each other, every other repeat
    ddp_swing higher on all ranks; data_mib: the gpu feed's dataset resident on DP's device 0,
    inside its allocated, reserved and NVML numbers."""
    excess_dp = excess_dp or {10: 100.0, 1000: 115.0, 32768: 900.0}
    excess_sum = excess_sum or {10: 98.0, 1000: 100.0, 32768: 160.0}
    for classes, group in ((10, "c1_out10"), (1000, "c1_out1000"), (32768, "c1_out32768")):
        for r in range(repeats):
            cfg = {"num_classes": classes, "global_batch": 2048, "momentum": momentum}
            for variant, ex in (("dp", excess_dp[classes]), ("dp_sum", excess_sum[classes])):
                t.mem(t.run(group, variant, 2, r, config=cfg), [4800.0 + ex + 0.3 * r + (data_mib or 0.0), 4800.0],
                      data_dev0=data_mib)
            if "ddp" in t.groups[group]["variants"]:
                base = ddp_rank + ddp_swing * (r % 2)
                t.mem(t.run(group, "ddp", 2, r, config=cfg), [base, base + ddp_spread])


def plant_c6(t, mean_shift=0.02, noise=0.003, seeds=3, steps=8):
    """Final loss per seed: single, dp_sum = single + tiny noise, dp_mean = single + shift + noise."""
    g = "c6_uneven"
    for r in range(seeds):
        jitter = noise * ((-1) ** r) * (1 + r / 3)
        base = 1.8 + 0.05 * r
        for variant, loss, acc in (("single", base, 0.40 + 0.01 * r),
                                   ("dp_sum", base + 1e-4 * (r - 1), 0.40 + 0.01 * r),
                                   ("dp_mean", base + mean_shift + jitter, 0.40 + 0.01 * r - mean_shift / 4)):
            rid = t.run(g, variant, 1 if variant == "single" else 2, r, config={"global_batch": 127, "seed": 100 + r},
                        final_loss=loss, test_acc=acc)
            curve = [2.3 - 0.05 * i for i in range(steps)]
            gap = {"single": 0.0, "dp_sum": 1e-6, "dp_mean": 1e-4}[variant]
            t.losses(rid, [c + gap * (i > 0) for i, c in enumerate(curve)])
            if variant == "dp_mean":
                t.warnings.append({"run_id": rid, "variant": variant, "gpus": 2, "options": t.groups[g]["label"],
                                   "repeat": r, "category": "UserWarning", "message": GATHER, "count": 150,
                                   "first_step": 0})


def plant_c7(t, dp_on_ms=725.0, repeats=2):
    """The benchmark-on group; its off leg is C8's batch-512 group (plant_c8: single 25.6 ms, dp 51.2 ms)."""
    for r in range(repeats):
        for v, p50 in {"single": 23.0, "dp": dp_on_ms}.items():
            t.run("c7_benchmark_on", v, 1 if v == "single" else 2, r, step_ms_p50=p50 * (1 + 0.01 * r),
                  images_per_s=512 / p50 * 1e3, wall_s=10.0)


def plant_c8(t, dp_speedup=None, single_ips=20000.0, repeats=2, spread=0.02, skip=()):
    """DP's speed-up over single per batch (fp32 and bf16 curves); DDP 1.9x; kuangliu's DP 0.3x."""
    dp_speedup = dp_speedup or {128: 0.2, 512: 0.5, 2048: 1.5, 8192: 1.9}
    for r in range(repeats):
        f = 1 + spread * (r - 0.5)
        for batch, sp in dp_speedup.items():
            for group in (f"c8_fp32_b{batch}", f"c8_bf16_b{batch}"):
                if group not in t.groups or group in skip:
                    continue
                cfg = {"global_batch": batch, "precision": "bf16" if "bf16" in group else "fp32"}
                t.run(group, "single", 1, r, config=cfg, images_per_s=single_ips * f, wall_s=10.0,
                      step_ms_p50=batch / (single_ips * f) * 1e3)
                t.run(group, "dp", 2, r, config=cfg, images_per_s=single_ips * sp / f, wall_s=10.0,
                      step_ms_p50=batch / (single_ips * sp / f) * 1e3)
                if "ddp" in t.groups[group]["variants"]:
                    t.run(group, "ddp", 2, r, config=cfg, images_per_s=single_ips * 1.9, wall_s=10.0)
        kl = {"global_batch": 128, "feed": "torch"}
        t.run("c8_kuangliu", "single", 1, r, config=kl, images_per_s=9600.0 * f, wall_s=10.0)
        t.run("c8_kuangliu", "dp", 2, r, config=kl, images_per_s=2800.0 / f, wall_s=10.0)


def gpu_tag(**kw):
    t = FakeTag()
    plant_c7(t, **kw.pop("c7", {}))
    plant_c8(t, **kw.pop("c8", {}))
    plant_c1(t, **kw.pop("c1", {}))
    plant_c6(t, **kw.pop("c6", {}))
    assert not kw
    return t


def evidence(tmp_path, tag, probes=None):
    tag.write(tmp_path, "t", fake_gpu_probes() if probes is None else probes)
    return Evidence(tmp_path, "t", PLANNED)


def ledger(tmp_path, tag, probes):
    tag.write(tmp_path, "t", probes)
    md, js = write_ledger(tmp_path, "t", PLANNED)
    data = results.read_json(js)
    return md.read_text(), {c["id"]: c for c in data["claims"]}


OOM = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


# -- C9's rows ------------------------------------------------------------------------------------

def row(variant, gpus, parameters, batch, speed, reshard=None, precision="fp32", cap=12.0):
    return {"workload": f"transformer-lm-{parameters}", "parameters": parameters, "variant": variant,
            "reshard_after_forward": variant == "fsdp" if reshard is None else reshard, "gpus": gpus,
            "precision": precision, "largest_batch": batch, "samples_per_s_at_largest": speed,
            "cap_gib": cap, "reason": "" if batch else OOM}


# Along 12M .. 1.07B on 2 GPUs: FSDP2's batch first exceeds DDP's at 235M, its throughput at 1.07B
# (where DDP fits no batch at all); on 1 GPU each variant's own cost.
SIZES = [12_000_000, 42_000_000, 235_000_000, 1_070_000_000]
CROSSING = ([row("ddp", 2, p, b, s) for p, b, s in zip(SIZES, [512, 256, 48, None], [900.0, 400.0, 60.0, None])]
            + [row("fsdp", 2, p, b, s) for p, b, s in zip(SIZES, [480, 256, 64, 16], [500.0, 250.0, 40.0, 9.0])]
            + [row(v, 1, SIZES[0], 500, 880.0) for v in ("ddp", "fsdp")])


def probe_record(rows, gpus=2, interconnect="NV18"):
    ran_on = {"device_type": "cuda", "gpus_visible": gpus, "torch": "2.14.1", "cuda": "13.0", "cudnn": 91900,
              "gpu_names": ["NVIDIA H200"] * gpus, "python": "3.12.3"}
    observations = [obs(verdict.CONDITIONS_ID, "where", interconnect=interconnect)]
    observations += [obs(verdict.row_id(r), "a row", **r) for r in rows]
    return ProbeRecord("C9", "C9", ran_on, observations, verdict.verdict_from(rows).verdict, "")
