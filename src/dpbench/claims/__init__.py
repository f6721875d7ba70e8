"""The article's claims C1..C9 as experiments with verdicts.

One folder per claim (claims/cN/, listed in `registry`): probes (C1..C7, run via
`python -m dpbench.claims.probe CX`) test API behaviour directly; the C7 probe also takes a
DataParallel step apart (`c7/dp_step`), which C7 and C8 name their cause from; the C9 probe
searches each variant's largest batch along the transformer's size (`c9/probe`). C1, C8 and the
training-level parts of C6 and C7 come from the pipeline's runs of experiments/claims.yaml.
`ledger` turns both into claims.md / claims.json through each claim's verdict.py and text.py.
"""

CONFIRMED, REFUTED, NUANCE, NOT_RUN = "confirmed", "refuted", "needs nuance", "not measured here"

# id -> (short title, the claim in one sentence, as the article or the seed states it)
CLAIMS = {
    "C1": ("DP's first GPU uses more memory",
           "DataParallel's output_device defaults to device_ids[0], so the first GPU uses more "
           "memory than the others: outputs and the loss are gathered and reduced there."),
    "C2": ("device_ids must match the model's device",
           "With device_ids=[2,3] while the model sits on cuda:0 DataParallel errors; set "
           "CUDA_DEVICE_ORDER=PCI_BUS_ID and CUDA_VISIBLE_DEVICES='2,3' first, then use device_ids=[0,1]."),
    "C3": ("wrap the optimizer in DataParallel",
           "The optimizer can be wrapped too: optimizer = nn.DataParallel(optimizer, device_ids=...), "
           "then optimizer.module.step()."),
    "C4": ("save and load a DataParallel model",
           "Save with torch.save(net.module.state_dict(), path); load with "
           "net = nn.DataParallel(Resnet18()); net.load_state_dict(torch.load(path)); net = net.module."),
    "C5": ("gather warning for scalar losses",
           "A module returning a scalar loss makes multi-GPU DataParallel warn 'Was asked to gather "
           "along dimension 0, but all input tensors were scalars; will instead unsqueeze and return "
           "a vector.' and return one loss per GPU; on one GPU it returns a scalar."),
    "C6": ("mean of per-GPU means is biased on uneven splits",
           "Averaging per-GPU mean losses is wrong when the batch splits unevenly ([0.3, 0.2, 0.8]: "
           "0.4333 on one GPU, 0.525 on two); per-replica sums divided by the global batch are "
           "right on any GPU count."),
    "C7": ("cudnn.benchmark slows DataParallel (not in the article)",
           "With torch.backends.cudnn.benchmark=True, as kuangliu/pytorch-cifar sets it, DataParallel "
           "on >=2 GPUs is much slower, because cuDNN autotunes again in every new replica thread."),
    "C8": ("DataParallel makes training faster (the article's premise)",
           "Just add DataParallel and training gets faster on more GPUs."),
    "C9": ("other ways than DataParallel: where sharding starts to pay (the article's last sentence)",
           "Besides DataParallel there are DistributedDataParallel and other ways; to be continued after "
           "experiments. Here: from what model size FSDP2's largest batch, and its throughput at that "
           "batch, first exceed DDP's."),
}
CLAIM_IDS = list(CLAIMS)

# What a user should do instead (or in addition, where the article is right).
ADVICE = {
    # Standing advice, given where no measurement decided otherwise: it says what device 0 holds,
    # not how large any part of it was here.
    "C1": ('Size the batch for device 0: besides its share of activations it keeps the summed '
            'gradients, the optimizer state (one model-sized buffer for SGD with momentum, two for '
            'Adam) and the whole input batch, and, with the loss on the gathered outputs, the whole '
            "batch's outputs and their log-softmax, which grow with batch x outputs. Computing the "
            'loss inside the replicas keeps the outputs where they were made; DDP keeps all of these '
            'evenly on every rank.'),
    "C2": ("Put the model on device_ids[0] before wrapping (model.to(f'cuda:{device_ids[0]}')). "
            'CUDA_VISIBLE_DEVICES works only if set before CUDA initialises (in the shell, or before '
            'the first torch.cuda call); ids are then renumbered from 0.'),
    "C3": ("Do not wrap the optimizer. Build it on the bare model's parameters (before wrapping, or "
            'from net.module.parameters()) and call zero_grad(), step() and schedulers on the '
            'optimizer itself.'),
    "C4": ('Keep saving net.module.state_dict(). Load it into the bare model before wrapping '
            "(model.load_state_dict(torch.load(path, map_location='cpu')); net = "
            "nn.DataParallel(model)) or into net.module; for a checkpoint of the wrapper's own "
            'state_dict use torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(sd, '
            "'module.'). Pass map_location when the saving GPU may not exist where you load."),
    "C5": ('Reduce the returned vector yourself (per-replica sums: loss.sum() / global batch, see '
            'C6); its length is the number of chunks torch.chunk makes, which can be fewer than the '
            "GPUs. Return per-sample losses (reduction='none') to avoid the warning altogether."),
    "C6": ("Return per-replica sums and divide by the global batch size (dpbench's dp_sum), or "
            'return per-sample losses and average the gathered vector. With BatchNorm in train mode '
            'every DataParallel reduction still differs from one device (per-replica statistics); use '
            'DDP with SyncBatchNorm where that matters.'),
    # C7 and C8: standing advice names no cause; the ledger names one where the C7 probe's step
    # breakdown measured it.
    "C7": ('Time DataParallel with torch.backends.cudnn.benchmark on and off before keeping it on, or '
            'use DDP (one process per GPU).'),
    "C8": ('Measure before scaling out: time DataParallel against one GPU at the batch you train with. '
            'Use DDP (one process per GPU) for multi-GPU training, and feed data fast enough for one GPU '
            'first.'),
    "C9": ('Use DDP while the model, its gradients and optimizer state leave room for the batch you want; '
           'shard (ZeRO-1 for the optimizer state, FSDP2 for all three) once they do not, and measure the '
           'throughput at the largest batch each variant fits before choosing.'),
}


def needs_text(n: int, found: int) -> str:
    """The one wording for a part that could not run: `needs N GPUs (found M)`."""
    return f"needs {n} GPU{'s' if n > 1 else ''} (found {found})"
