"""The native-resolution tower built from a config: each image attends only to itself (packed with others it gives
the rows it gives alone), windows confine the windowed layers, a text-only batch runs, and bad configs are refused
naming the field."""

import pytest
import torch

from mimo.config.load import load_config
from mimo.config.model_rules import validate_model
from mimo.config.schema import Config, ConfigError, DataConfig
from mimo.config.validate import validate, validate_data
from mimo.models.build import build_model
from mimo.models.flops import modality_flops
from mimo.models.mrope import mrope_positions
from mimo.train.gate import check_tokenizer
from tests.support.configs import CONFIGS, tiny_native_vlm

pytestmark = pytest.mark.usefixtures("one_thread")

PIXELS = 3 * 2 * 4 * 4


def encode(model, grids: list[list[int]], pixels: torch.Tensor) -> torch.Tensor:
    sub = model.modality_submodules["images"]
    return sub({"visual": {"pixel_values": pixels, "grid_thw": torch.tensor(grids)}})


def test_packed_images_give_the_rows_each_gives_alone():
    torch.manual_seed(0)
    model = build_model(tiny_native_vlm()).eval()
    grids = [[1, 8, 12], [2, 4, 4], [1, 4, 6]]  # two images and a two-temporal-patch video
    sizes = [t * h * w for t, h, w in grids]
    pixels = torch.randn(sum(sizes), PIXELS)
    with torch.no_grad():
        packed = encode(model, grids, pixels)
        alone = torch.cat([encode(model, [g], p) for g, p in zip(grids, pixels.split(sizes))])
    assert packed.shape == (sum(sizes) // 4, 32)
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-6)


def test_windowed_layers_see_only_their_window():
    """Without the full-attention layer, pixels of one 16-px window leave the other windows' rows unchanged."""
    torch.manual_seed(0)
    model = build_model(tiny_native_vlm(full_attention_layers=[])).eval()
    pixels = torch.randn(8 * 8, PIXELS)  # an 8 x 8-patch image: four 4 x 4-patch windows of 4 merged rows each
    changed = pixels.clone()
    changed[:16] += 1.0  # processor order: the first 16 patches are merged cells (0, 0..3), windows (0, 0), (0, 1)
    with torch.no_grad():
        a, b = encode(model, [[1, 8, 8]], pixels), encode(model, [[1, 8, 8]], changed)
    moved = (a - b).abs().amax(-1) > 1e-6  # merged cell (r, c) is row r * 4 + c; windows (1, *) hold rows 8..15
    assert moved[:4].all() and not moved[8:].any()


def test_text_only_batch_and_mrope_forward():
    torch.manual_seed(0)
    model = build_model(tiny_native_vlm()).eval()
    ids = torch.tensor([[1, 60, 60, 60, 60, 60, 60, 2, 3]])
    grid = torch.tensor([[1, 4, 6]])
    pos = mrope_positions(ids, 60, grid, 2)
    assert pos[0, :, 0].tolist() == [0, 1, 1, 1, 1, 1, 1, 4, 5]  # text resumes past max(h, w) / merge = 3
    inputs = {"images": {"visual": {"pixel_values": torch.randn(24, PIXELS), "grid_thw": grid}}}
    with torch.no_grad():
        out = model(ids, position_ids=pos, modality_inputs=inputs).logits
        text = model(torch.tensor([[1, 2, 3]])).logits
    assert out.shape == (1, 9, 64) and torch.isfinite(out).all() and text.shape == (1, 3, 64)


@pytest.mark.parametrize("change, field", [
    ({"window": 12}, "native.window"), ({"family": "qwen3_vl"}, "native.family"),
    ({"full_attention_layers": [5]}, "native.full_attention_layers"), ({"min_pixels": 4}, "native: need"),
    ({"heads": 3}, "native.hidden"), ({"act": "swish"}, "native.act"), ({"rope_theta": 0.0}, "native.rope_theta"),
    ({"video_token_id": 64}, "native.video_token_id"),
    ({"vision_start_token_id": 61}, "native.vision_start_token_id .61. and .*vision_end_token_id .-1.: set both"),
    ({"vision_start_token_id": 61, "vision_end_token_id": 64}, "native.vision_end_token_id .64. must lie in"),
    ({"vision_start_token_id": 60, "vision_end_token_id": 62}, "native.vision_start_token_id .60. must differ"),
    ({"vision_start_token_id": 61, "vision_end_token_id": 61}, "native.vision_end_token_id .61. must differ")])
def test_bad_native_configs_name_the_field(change, field):
    with pytest.raises(ConfigError, match=f"model.modalities.images.{field}"):
        validate(Config(model=tiny_native_vlm(**change)))  # family and act by their Literal types


def test_native_vision_needs_mrope_and_a_fitting_section():
    model = tiny_native_vlm()
    model.llm.mrope_section = []
    with pytest.raises(ConfigError, match="set model.llm.mrope_section"):
        validate_model(Config(model=model))
    model.llm.mrope_section = [1, 1, 1]
    with pytest.raises(ConfigError, match="model.llm.mrope_section = .1, 1, 1. must be three sizes"):
        validate_model(Config(model=model))


def test_native_data_needs_a_real_data_set_and_packs():
    with pytest.raises(ConfigError, match="kind = 'native_vision' trains on data.name = 'jsonl' or 'webdataset'"):
        validate_data(Config(model=tiny_native_vlm(), data=DataConfig(name="shapes")))
    validate_data(Config(model=tiny_native_vlm(), data=DataConfig(name="jsonl", path="m.jsonl", packing=True,
                                                                  pack_length=64)))


def test_native_flops_by_hand():
    """An 8 x 12-patch image through TINY_NATIVE (16 wide, 2 layers, 4 x 4-patch windows outside layer 1), LM 32."""
    cfg = tiny_native_vlm()
    inputs = {"visual": {"pixel_values": torch.zeros(96, PIXELS), "grid_thw": torch.tensor([[1, 8, 12], [1, 0, 0]])}}
    weights = 2 * 96 * (PIXELS * 16 + 2 * (4 * 16 * 16 + 3 * 16 * 32))
    attention = 4 * 16 * (96 * 96 + 6 * 16 * 16)  # layer 1 whole; layer 0 over six 16-patch windows
    merger = 2 * 24 * (64 * 64 + 64 * 32)
    assert modality_flops(cfg, "images", inputs) == weights + attention + merger


def test_vision_markers_the_tokenizer_writes_for_text_are_refused():
    marks = ["--model.modalities.images.native.vision_start_token_id=97",
             "--model.modalities.images.native.vision_end_token_id=262"]
    cfg = load_config(CONFIGS / "native_qwen2_5_vl.toml", marks)
    with pytest.raises(ConfigError, match=r"model.modalities.images.native.vision_start_token_id \(97\) is an id "
                                          "the byte tokenizer writes for text"):
        check_tokenizer(cfg, cfg.model)
