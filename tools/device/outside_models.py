"""Workload factories for models nobody here wrote, built from configs (no download): the
fidelity benchmark's outside-library cells. Used as `tools/device/outside_models.py:vit_small`."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dpbench.workloads.spec import WorkloadSpec


def vit_small(image: int = 224, num_classes: int = 1000):
    """timm's ViT-S/16 from its config, random weights."""
    import timm
    from timm.models.vision_transformer import Block

    model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=num_classes, img_size=image)

    def batch(gen: torch.Generator, n: int):
        return (torch.randn(n, 3, image, image, generator=gen),
                torch.randint(0, num_classes, (n,), generator=gen))

    return WorkloadSpec(model=model, loss=lambda out, y: F.cross_entropy(out, y, reduction="none"),
                        batch=batch, shard_modules=(Block,), flops_per_sample=3 * 4.6e9)


def gpt2(width: int = 768, layers: int = 12, heads: int = 12, seq_len: int = 1024, vocab: int = 50257):
    """Hugging Face's GPT-2 (124M at the defaults) from its config, random weights: the
    docs/your-model.md factory at GPT-2 small's size (input ids and a right-padded mask)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    config = GPT2Config(n_embd=width, n_layer=layers, n_head=heads, n_positions=seq_len, vocab_size=vocab,
                        bos_token_id=vocab - 1, eos_token_id=vocab - 1, use_cache=False)
    model = GPT2LMHeadModel(config)

    def batch(gen: torch.Generator, n: int):
        ids = torch.randint(0, vocab, (n, seq_len), generator=gen)
        lengths = torch.randint(seq_len // 2, seq_len + 1, (n, 1), generator=gen)
        mask = (torch.arange(seq_len) < lengths).long()
        targets = torch.cat([ids[:, 1:], torch.zeros(n, 1, dtype=ids.dtype)], 1)
        targets = targets.masked_fill(torch.cat([mask[:, 1:], torch.zeros(n, 1, dtype=mask.dtype)], 1) == 0, -100)
        return {"input_ids": ids, "attention_mask": mask}, targets

    def loss(logits, targets):   # one loss per sample: the mean over its real tokens
        per_token = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none", ignore_index=-100)
        return per_token.sum(1) / (targets != -100).sum(1)

    return WorkloadSpec(model=model, loss=loss, batch=batch, output="logits", shard_modules=(GPT2Block,),
                        sample_unit="tokens", units_per_sample=seq_len)
