"""Baseline of bench_moe: the MoE VLM of benchmarks/presets/moe_<size>.toml trained with Hugging Face transformers.

    python -m benchmarks.hf_moe_worker --size full --steps 6 --warmup 2 [--compile] [--bf16-weights]

What a user would reach for instead of mimo, built as benchmarks/baseline/hf_vlm_baseline.py builds its Qwen2
LLaVA (that file is a byte-identical copy and stays untouched): LlavaForConditionalGeneration with a CLIP tower,
the MLP projector and a Qwen3-MoE decoder (Qwen3MoeConfig from the TOML's model.llm: qk-norm, no qkv bias, every
layer `moe_experts` experts top-`moe_top_k`, untied head), SDPA attention, the experts as transformers' default
`experts_implementation` picks (recorded in the row), bf16 autocast over fp32 weights, fused AdamW with the
TOML's optim (lr, betas, weight decay); `--compile` wraps the model in torch.compile, `--bf16-weights` casts it
to bf16 instead of autocast (AdamW state in bf16 too). Its own random batches of the TOML's shapes (one image
per sample, its placeholders first, loss on the text), two, in turn. Timing and FLOPs are bench_moe's
(`time_steps`, `train_step_flops`): one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json

import torch
import transformers

from benchmarks.bench_moe import MODALITY, SIZES, moe_config, result_fields
from benchmarks.bench_vlm import time_steps, train_step
from mimo.config.schema import Config, MetricsConfig

IGNORE = -100


def hf_config(cfg: Config) -> transformers.LlavaConfig:
    """The TOML's model as a transformers LlavaConfig over CLIPVisionConfig and Qwen3MoeConfig."""
    llm, image = cfg.model.llm, cfg.model.modalities[MODALITY]
    vit = image.vit
    vision = transformers.CLIPVisionConfig(
        hidden_size=vit.hidden, intermediate_size=vit.mlp, num_hidden_layers=vit.layers,
        num_attention_heads=vit.heads, image_size=vit.image, patch_size=vit.patch, hidden_act=vit.act,
        layer_norm_eps=vit.norm_eps)
    text = transformers.Qwen3MoeConfig(
        vocab_size=llm.vocab, hidden_size=llm.hidden, intermediate_size=llm.mlp, num_hidden_layers=llm.layers,
        num_attention_heads=llm.heads, num_key_value_heads=llm.kv_heads, head_dim=llm.attention_head_dim,
        num_experts=llm.moe_experts, num_experts_per_tok=llm.moe_top_k, moe_intermediate_size=llm.moe_mlp,
        norm_topk_prob=llm.moe_norm_topk, decoder_sparse_step=llm.moe_every, mlp_only_layers=list(llm.moe_dense_layers),
        output_router_logits=False, max_position_embeddings=llm.max_seq, rms_norm_eps=llm.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": llm.rope_theta}, tie_word_embeddings=False)
    return transformers.LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=image.token_id,
        projector_hidden_act=image.projector.act, vision_feature_layer=-1, vision_feature_select_strategy="default",
        tie_word_embeddings=False)


def build_hf_model(cfg: Config, device: str) -> torch.nn.Module:
    """LlavaForConditionalGeneration of `cfg` on `device` with SDPA attention, initialised by transformers."""
    config = hf_config(cfg)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlavaForConditionalGeneration(config).to(device)


def make_batch(cfg: Config, device: str, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A random batch of the TOML's shapes as the VLM baseline lays it out: input_ids, pixel_values, labels
    (transformers shifts them itself; -100 on the image placeholders)."""
    d, image = cfg.data, cfg.model.modalities[MODALITY]
    v = image.vit
    n = (v.image // v.patch) ** 2 * d.images_per_sample
    pixels = torch.randn(d.global_batch * d.images_per_sample, v.channels, v.image, v.image, generator=gen)
    ids = torch.randint(0, cfg.model.llm.vocab - 2, (d.global_batch, d.seq_len), generator=gen)
    ids[:, :n] = image.token_id
    labels = ids.clone()
    labels[:, :n] = IGNORE
    return {"input_ids": ids.to(device), "pixel_values": pixels.to(device), "labels": labels.to(device)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="full")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--bf16-weights", action="store_true", help="bf16 weights and AdamW state, no autocast")
    ap.add_argument("--peak-tflops", type=float, default=MetricsConfig.peak_tflops, help="dense bf16 peak, for MFU")
    args = ap.parse_args(argv)

    cfg = moe_config(args.size)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_hf_model(cfg, device)
    if args.bf16_weights:
        model.to(torch.bfloat16)
    model.train()
    o = cfg.optim
    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay,
                            fused=device == "cuda")
    gen = torch.Generator().manual_seed(1)
    batches = [make_batch(cfg, device, gen) for _ in range(2)]
    step = train_step(model, batches, torch.device(device), args.compile, opt, autocast=not args.bf16_weights)
    timing = time_steps(step, device == "cuda", args.warmup, args.steps)
    name = "hf-transformers-llava-qwen3moe" + "".join(f"+{k}" for k in ("compile", "bf16_weights") if getattr(args, k))
    fields = result_fields(timing, cfg, model, torch.device(device), args.peak_tflops)
    row = {"system": name, "size": args.size, **fields,
           "experts_implementation": getattr(model.config.text_config, "_experts_implementation", None),
           "transformers": transformers.__version__}
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
