"""Tiny random `transformers` models saved to disk, and the parity measure the HF interop tests share."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mimo.data.tokenizer import load_tokenizer
from mimo.export import export_causal_lm, export_llava
from mimo.hf import files, import_audio_encoder, import_llava, import_llm
from mimo.models.layers import padded_causal_mask
from mimo.models.llm import DecoderLM

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TOL = 1e-5
PIL = {"backend": "pil"}
"""transformers' PIL image backend, which prepares an exported processor's pixels exactly as mimo's data path (PIL)
does. Where torchvision is installed transformers picks its torchvision backend by default, whose resize rounds
within one 8-bit level of PIL's (held by test_export_processor / test_export_qwen_processor)."""


def rel_diff(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """max |ours - ref| / max |ref|: the acceptance measure (must be <= 1e-5 in fp32)."""
    return float((ours.float() - ref.float()).abs().max() / ref.float().abs().max())


def llava_logits(hf, model) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """mimo's and transformers' logits on two 16-px images each framed by a short prompt; also the ids and
    pixels (for further forwards on the same batch)."""
    n = model.modality_submodules["images"].encoders["vit"].tokens_per_image
    token = hf.config.image_token_index
    ids = torch.tensor([[1] + [token] * n + [5, 6, 7], [2] + [token] * n + [8, 9, 10]])
    pixels = torch.randn(2, 3, 16, 16)
    inputs = {"images": {"vit": {"pixel_values": pixels}}}
    with torch.no_grad():
        return model(ids, modality_inputs=inputs).logits, hf(input_ids=ids, pixel_values=pixels).logits, ids, pixels


def save(model: torch.nn.Module, directory: Path) -> Path:
    model.save_pretrained(directory)
    return directory


# Eight experts, two per token; Qwen3-MoE with a dense layer (mlp_only_layers) and renormalised weights, Qwen2-MoE
# with its gated shared expert and plain top-k weights.
MOE_FIELDS = {"qwen3_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True,
                                mlp_only_layers=[1], num_hidden_layers=3),
              "qwen2_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=False,
                                shared_expert_intermediate_size=40),
              "mixtral": dict(num_local_experts=8, num_experts_per_tok=2)}


def tiny_text_config(family: str, **extra):
    """A two-layer config of `family` with GQA and a head_dim that differs from hidden/heads for Qwen3 and
    Mistral."""
    common = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, rms_norm_eps=1e-6, initializer_range=0.2, max_position_embeddings=128)
    cls = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config, "llama": transformers.LlamaConfig,
           "mistral": transformers.MistralConfig, "phi3": transformers.Phi3Config, "olmo2": transformers.Olmo2Config,
           "gemma2": transformers.Gemma2Config, "gemma3_text": transformers.Gemma3TextConfig,
           "qwen3_moe": transformers.Qwen3MoeConfig, "qwen2_moe": transformers.Qwen2MoeConfig,
           "mixtral": transformers.MixtralConfig}
    common.update(MOE_FIELDS.get(family, {}))
    if family in ("qwen3", "mistral", "gemma2", "gemma3_text", "qwen3_moe", "mixtral"):
        common["head_dim"] = 16
    if family in ("mistral", "mixtral"):
        common["sliding_window"] = None
    if family == "gemma3_text":  # a window shorter than the test rows, sliding and full layers, two RoPE thetas
        common.update(sliding_window=5, layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=24,
                      rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                       "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    if family == "gemma2":  # soft caps low enough to bite on random weights
        common.update(sliding_window=5, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                      final_logit_softcapping=3.0)
    if family in ("phi3", "olmo2", "gemma2", "gemma3_text"):
        common.update(pad_token_id=0, bos_token_id=1, eos_token_id=2)  # its defaults lie outside a tiny vocabulary
    return cls[family](**{**common, **extra})


def tiny_causal_lm(family: str, **extra):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_text_config(family, **extra))
    return model.float().eval()


def tiny_vision_config(family: str, **extra):
    common = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, image_size=16,
                  patch_size=4, initializer_range=0.2)
    if family == "clip":
        return transformers.CLIPVisionConfig(**{**common, **extra})
    if family == "siglip2":
        side = common.pop("image_size") // common["patch_size"]
        return transformers.Siglip2VisionConfig(**{**common, "num_patches": side * side, **extra})
    if family == "dinov2":
        common.pop("intermediate_size")
        return transformers.Dinov2Config(**{**common, "mlp_ratio": 2, **extra})
    return transformers.SiglipVisionConfig(**{**common, **extra})


def tiny_llava(tower: str = "clip", text: str = "qwen2", layer: int = -2, strategy: str = "default",
               token: int = 96) -> torch.nn.Module:
    """A random LlavaForConditionalGeneration (eval mode) of a `tower` tiny_vision_config and a `text`
    tiny_text_config, reading hidden states `layer` with `strategy`, placeholder id `token`."""
    config = transformers.LlavaConfig(
        vision_config=tiny_vision_config(tower).to_dict(), text_config=tiny_text_config(text).to_dict(),
        image_token_index=token, vision_feature_layer=layer, vision_feature_select_strategy=strategy)
    return transformers.LlavaForConditionalGeneration(config).eval()


def perturb(model: torch.nn.Module, scale: float = 0.1) -> torch.nn.Module:
    """HF initialises biases to zero and norms to the identity; noise on every parameter makes the parity
    tests see each of them."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))
    return model


def padded_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two sequences, the second left-padded by 4: ids, 0/1 attention mask, position ids."""
    torch.manual_seed(2)
    ids = torch.randint(0, vocab, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :4] = 0
    return ids, mask, (mask.cumsum(1) - 1).clamp_min(0)


def compare(lm: DecoderLM, hf: torch.nn.Module) -> tuple[float, float]:
    ids, mask, pos = padded_batch(lm.cfg.vocab)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True)
        hidden = lm(lm.embed(ids), pos, mask=padded_causal_mask(mask))
        logits = lm.logits(hidden)
    real = mask.bool()
    return rel_diff(hidden[real], ref.hidden_states[-1][real]), rel_diff(logits[real], ref.logits[real])


def lm_both_ways(hf: torch.nn.Module, directory: Path, architecture: str) -> DecoderLM:
    """`hf` saved, imported and exported under `directory`: the import's hidden states and logits within TOL of
    transformers' (`compare`), and the export loads as `architecture` with no missing or unexpected weights and
    the same logits. The imported LM."""
    lm = import_llm(save(hf, directory / "hf"))
    assert max(compare(lm, hf)) <= TOL
    again, info = transformers.AutoModelForCausalLM.from_pretrained(export_causal_lm(lm, directory / "out"),
                                                                    output_loading_info=True)
    assert type(again).__name__ == architecture and not info["missing_keys"] and not info["unexpected_keys"]
    assert max(compare(lm, again.float().eval())) <= TOL
    return lm


def llava_both_ways(text: str, directory: Path) -> None:
    """A tiny LLaVA (CLIP tower, a `text` LM, "default" feature selection) saved, imported and exported under
    `directory`: mimo's logits within TOL of transformers' (`llava_logits`), and the export loads as a LLaVA
    whose LM is `text`, with the same logits."""
    torch.manual_seed(0)
    hf = perturb(tiny_llava(text=text))
    _, model = import_llava(save(hf, directory / "hf"))
    ours, ref, ids, pixels = llava_logits(hf, model)
    assert rel_diff(ours, ref) <= TOL
    again = transformers.LlavaForConditionalGeneration.from_pretrained(export_llava(model, directory / "out"))
    again = again.float().eval()
    assert again.config.text_config.model_type == text
    with torch.no_grad():
        assert rel_diff(again(input_ids=ids, pixel_values=pixels).logits, ours) <= TOL


def whisper(tmp_path, max_positions: int = 10):
    """A tiny random Whisper saved under `tmp_path`, and its encoder imported by mimo."""
    cfg = transformers.WhisperConfig(
        d_model=32, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=80, max_source_positions=max_positions, vocab_size=50,
        max_target_positions=8, pad_token_id=1, bos_token_id=2, eos_token_id=3, decoder_start_token_id=2)
    torch.manual_seed(0)
    hf = perturb(transformers.WhisperModel(cfg).eval())
    return hf, import_audio_encoder(save(hf, tmp_path / "whisper"))


WORDS = ["<unk>", "<s>", "</s>", "<image>", "USER", "ASSISTANT", "user", "assistant", ":", "what", "is", "this", "?"]


def tiny_tokenizer(directory, chat_template: str | None = None, words: list[str] = WORDS):
    """A word-level tokenizer that prepends <s>, saved and reloaded like a real checkpoint's."""
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>")
    if chat_template:
        fast.chat_template = chat_template
    fast.save_pretrained(directory)
    return load_tokenizer(directory)


class _Recorded:
    """A TensorSlice that counts the elements read through it."""

    def __init__(self, inner, reads: list[int]):
        self.inner, self.reads = inner, reads

    def get_shape(self):
        return self.inner.get_shape()

    def __getitem__(self, index):
        t = self.inner[index]
        self.reads.append(t.numel())
        return t


def record_reads(reads: list[int]) -> None:
    get = files.DirectorySource.get_slice
    files.DirectorySource.get_slice = lambda self, name: _Recorded(get(self, name), reads)


def exported_logits(directory) -> torch.Tensor:
    hf = transformers.LlavaForConditionalGeneration.from_pretrained(directory).float().eval()
    n = hf.config.image_seq_length
    token = hf.config.image_token_index
    ids = torch.tensor([[1] + [token] * n + [5, 6, 7], [2] + [token] * n + [8, 9, 10]])
    torch.manual_seed(4)
    size = hf.config.vision_config.image_size
    with torch.no_grad():
        return hf(input_ids=ids, pixel_values=torch.randn(2, 3, size, size)).logits


def llava_parts(directory: Path, lm_family: str, tower: str) -> tuple[torch.nn.Module, torch.nn.Module, list[str]]:
    """A tiny random `lm_family` LM and `tower` ("clip" or "siglip") saved under `directory`, and the overrides
    that point a LLaVA preset (configs/llava_*.toml) at them, with the image placeholder at id 90."""
    lm = perturb(tiny_causal_lm(lm_family))
    cls = transformers.CLIPVisionModel if tower == "clip" else transformers.SiglipVisionModel
    torch.manual_seed(0)
    # 18-pixel images with 4-pixel patches: the patch grid floors, as SigLIP-so400m's 384 / 14 does.
    vision = perturb(cls(tiny_vision_config(tower, image_size=18)).eval())
    overrides = [f"--model.llm.hf_path={save(lm, directory / 'lm')}",
                 f"--model.modalities.images.hf_path={save(vision, directory / 'tower')}",
                 "--model.modalities.images.token_id=90"]
    return lm, vision, overrides
