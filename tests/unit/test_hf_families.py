"""Families beyond Qwen and Llama, each both ways against transformers in fp32 (<= 1e-5 relative, random
configs, a left-padded batch): the import gives the family's hidden states and logits, and the export loads as
the same family's class with the same logits."""

import pytest
import torch

from mimo.config.load import load_config
from mimo.config.schema import ConfigError, ProjectorConfig
from mimo.export import export_llava, export_vision_tower
from mimo.hf import import_llava, import_llm, import_vision
from mimo.hf.files import DirectorySource, RowsSlice
from mimo.hf.load import dim_shard_fn
from mimo.models.generate import greedy_generate, left_pad
from mimo.models.multimodal import MimoModel, ModalitySubmodules
from mimo.models.projector import MLPProjector
from mimo.models.vit import patchify
from tests.support.hf_generate import EOS, PAD, hf_greedy
from tests.support.hf_helpers import (
    TOL,
    llava_both_ways,
    llava_logits,
    lm_both_ways,
    perturb,
    rel_diff,
    save,
    tiny_causal_lm,
    tiny_llava,
    tiny_text_config,
    tiny_vision_config,
    transformers,
)
from tests.support.layout_error import layout_error
from tests.support.tiny_run import DEMO, TINY

pytestmark = pytest.mark.usefixtures("one_thread")

LM_FAMILIES = {"mistral": ("MistralForCausalLM", {}), "phi3": ("Phi3ForCausalLM", {}),
               "phi3_tied": ("Phi3ForCausalLM", {"tie_word_embeddings": True}), "olmo2": ("Olmo2ForCausalLM", {}),
               "gemma2": ("Gemma2ForCausalLM", {}), "gemma3_text": ("Gemma3ForCausalLM", {})}


@pytest.mark.parametrize("case", list(LM_FAMILIES))
def test_lm_family_both_ways(case, tmp_path):
    arch, extra = LM_FAMILIES[case]
    lm_both_ways(perturb(tiny_causal_lm(case.removesuffix("_tied"), **extra)), tmp_path, arch)


@pytest.mark.parametrize("text", ["mistral", "phi3", "olmo2", "gemma3_text"])
def test_llava_with_family_lm_both_ways(text, tmp_path):
    llava_both_ways(text, tmp_path)


def test_gemma3_vlm_is_refused_with_the_reason(tmp_path):
    config = transformers.Gemma3Config(text_config=tiny_text_config("gemma3_text").to_dict(),
                                       vision_config=tiny_vision_config("siglip").to_dict(), mm_tokens_per_image=4)
    directory = save(transformers.Gemma3ForConditionalGeneration(config), tmp_path / "hf")
    with pytest.raises(ValueError, match="model_type 'gemma3', which mimo cannot import: .* both ways"):
        import_llava(directory)


def test_sliding_window_is_refused_naming_the_field(tmp_path):
    hf = tiny_causal_lm("mistral", sliding_window=8)
    with pytest.raises(ValueError, match="sliding_window = 8 is not supported"):
        import_llm(save(hf, tmp_path / "hf"))


def test_a_shard_function_reads_its_block_of_a_fused_part(tmp_path):
    """Phi-3's k rows inside qkv_proj: rank 1 of 2 reads the second half of k, nothing of q or v."""
    directory = save(perturb(tiny_causal_lm("phi3")), tmp_path / "hf")
    name = "model.layers.0.self_attn.qkv_proj.weight"
    with DirectorySource(directory) as src:
        whole = src.get_slice(name)[:]
        q, kv = 32, 16  # 4 heads and 2 KV heads of 8
        piece = dim_shard_fn(lambda _: 0, 1, 2)("k", RowsSlice(src.get_slice(name), q, q + kv))
    assert torch.equal(piece, whole[q + kv // 2 : q + kv])


def test_olmo2_norms_over_all_heads_refuse_tensor_parallelism():
    err = layout_error(2, "--model.llm.kv_heads=2", "--model.llm.qk_norm=true", "--model.llm.qk_norm_full=true",
                       "--model.llm.post_norm=true", "--parallel.modules.language.tp=2")
    assert "model.llm.qk_norm_full = true (OLMo 2)" in err and "tp = 1" in err


TOWERS = {"dinov2": "Dinov2Model", "siglip2": "Siglip2VisionModel", "clip": "CLIPVisionModel",
          "siglip": "SiglipVisionModel"}


def tower_outputs(hf, family: str, pixels: torch.Tensor):
    """The tower's outputs; SigLIP2 takes its patches flattened (row, column, channel) with their grid."""
    if family != "siglip2":
        return hf(pixel_values=pixels, output_hidden_states=True)
    patches = patchify(pixels, hf.config.patch_size)
    side = pixels.shape[-1] // hf.config.patch_size
    return hf(pixel_values=patches, pixel_attention_mask=torch.ones(patches.shape[:2], dtype=torch.long),
              spatial_shapes=torch.tensor([[side, side]] * len(pixels)), output_hidden_states=True)


@pytest.mark.parametrize("family", list(TOWERS))
def test_tower_both_ways(family, tmp_path):
    """last_hidden_state (with the final norm, except CLIP's) and hidden_states[-2] (LLaVA's feature layer -2)
    on import; the exported tower loads as its class with the same outputs."""
    torch.manual_seed(0)
    config = tiny_vision_config(family)
    hf = perturb(getattr(transformers, TOWERS[family])(config).eval())
    directory = save(hf, tmp_path / family)
    pixels = torch.randn(2, 3, 16, 16)
    last = import_vision(directory, post_norm=family != "clip")
    penultimate = import_vision(directory, feature_layer=-2)
    with torch.no_grad():
        ref = tower_outputs(hf, family, pixels)
        assert rel_diff(last(pixels), ref.last_hidden_state) <= TOL
        assert rel_diff(penultimate(pixels), ref.hidden_states[-2]) <= TOL
        again, info = getattr(transformers, TOWERS[family]).from_pretrained(
            export_vision_tower(last, tmp_path / "out"), output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
        assert rel_diff(tower_outputs(again.float().eval(), family, pixels).last_hidden_state, last(pixels)) <= TOL


@pytest.mark.parametrize("tower", ["dinov2"])
def test_llava_with_family_tower_both_ways(tower, tmp_path):
    torch.manual_seed(0)
    hf = perturb(tiny_llava(tower, layer=-1))
    _, model = import_llava(save(hf, tmp_path / "hf"))
    ours, ref, ids, pixels = llava_logits(hf, model)
    assert rel_diff(ours, ref) <= TOL
    again, info = transformers.LlavaForConditionalGeneration.from_pretrained(export_llava(model, tmp_path / "out"),
                                                                             output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert again.config.vision_config.model_type == tower
    with torch.no_grad():
        assert rel_diff(again.float().eval()(input_ids=ids, pixel_values=pixels).logits, ours) <= TOL


def test_siglip2_tower_in_llava_export_is_refused(tmp_path):
    hf = perturb(transformers.Siglip2VisionModel(tiny_vision_config("siglip2")).eval())
    vit = import_vision(save(hf, tmp_path / "siglip2"))
    lm = import_llm(save(tiny_causal_lm("qwen2"), tmp_path / "lm"))
    proj = MLPProjector(vit.cfg.hidden, lm.cfg.hidden, ProjectorConfig())
    model = MimoModel(lm, {"images": ModalitySubmodules(encoders={"vit": vit}, input_projections=[proj])},
                      {"images": 96})
    with pytest.raises(ValueError, match="patch_linear = true .SigLIP2. takes patchified pixels"):
        export_llava(model, tmp_path / "out")


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text"])
def test_gemma_generates_like_transformers_past_its_window(family, tmp_path):
    """Left-padded prompts longer than the sliding window, decoded with a KV cache, give generate's tokens."""
    hf = perturb(tiny_causal_lm(family), scale=0.3)
    model = MimoModel(import_llm(save(hf, tmp_path / "hf")), {}, {}).eval()
    ids, mask = left_pad([[5, 6, 7, 8, 9, 10, 11, 20, 21], [12, 13], [15, 16, 17, 18, 19, 22, 23]], PAD)
    assert greedy_generate(model, ids, None, 10, eos_id=EOS, attention_mask=mask) == hf_greedy(hf, ids, mask, 10)


def test_sliding_window_and_softcap_configs_are_checked():
    with pytest.raises(ConfigError, match="layer_types must name each of the 2 layers"):
        load_config(DEMO, [*TINY, "--model.llm.layers=2", "--model.llm.sliding_window=4",
                           "--model.llm.layer_types=['sliding']"])
    err = layout_error(2, "--model.llm.kv_heads=2", "--model.llm.sliding_window=4",
                       "--parallel.modules.language.tp=2", "--parallel.modules.language.sequence_parallel=true")
    assert "model.llm.sliding_window = 4 masks by row position" in err
    err = layout_error(1, "--model.llm.logit_softcap=3.0", "--perf.chunked_loss=true")
    assert "model.llm.logit_softcap = 3.0 (Gemma 2) caps the logits, which perf.chunked_loss never forms" in err


def test_gemma2_inside_llava_is_refused(tmp_path):
    """LlavaForConditionalGeneration never soft-caps a Gemma 2 LM's logits: both ways refused, naming why."""
    directory = save(tiny_llava(text="gemma2"), tmp_path / "hf")
    with pytest.raises(ValueError, match="never applies its final_logit_softcapping"):
        import_llava(directory)
    vit = import_vision(directory)
    lm = import_llm(directory)
    proj = MLPProjector(vit.cfg.hidden, lm.cfg.hidden, ProjectorConfig())
    model = MimoModel(lm, {"images": ModalitySubmodules(encoders={"vit": vit}, input_projections=[proj])},
                      {"images": 96})
    with pytest.raises(ValueError, match="never soft-caps its logits"):
        export_llava(model, tmp_path / "out")
