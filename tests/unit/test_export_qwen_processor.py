"""The Qwen-VL export's processor: transformers' image processor, loaded from the export, gives mimo's native
pixels and grids for images of several sizes, and expands each image into as many <|image_pad|> as mimo's data
gives it placeholders; the tokenizer names the vision tokens; AutoProcessor (torchvision) matches end to end."""

import copy
import json

import numpy as np
import pytest
import torch
from PIL import Image

from mimo.config.load import dump_toml, load_config
from mimo.data.native_images import item_ids, load_item, tokens_of
from mimo.data.samples import ImageRef
from mimo.export import export_qwen2_vl
from mimo.models.build import build_model
from mimo.train.checkpoint.weights import save_weights
from tests.support.configs import CONFIGS
from tests.support.export_run import STEPS, cli
from tests.support.hf_helpers import PIL, perturb, transformers
from tests.support.native_data import TINY

pytestmark = pytest.mark.usefixtures("one_thread")
NATIVE = "--model.modalities.images.native"
MARKS = [f"{NATIVE}.vision_start_token_id=261", f"{NATIVE}.vision_end_token_id=262"]
SIZES = [(40, 56), (100, 70), (30, 210), (150, 150)]
START, IMAGE_PAD, END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(run config, export directory, image files) of a tiny marked Qwen2.5-VL run."""
    tmp = tmp_path_factory.mktemp("qwen")
    cfg = load_config(CONFIGS / "native_qwen2_5_vl.toml", [*TINY, *MARKS])
    out = export_qwen2_vl(build_model(cfg.model), tmp / "out", tokenizer="byte")
    rng = np.random.default_rng(0)
    files = []
    for i, (h, w) in enumerate(SIZES):
        files.append(tmp / f"{i}.png")
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(files[-1])
    return cfg, out, files


def test_the_image_processor_gives_mimos_pixels_and_grids(exported):
    cfg, out, files = exported
    v = cfg.model.modalities["images"].native
    proc = transformers.AutoImageProcessor.from_pretrained(out, **PIL)
    for f in files:
        mine, grid = load_item((ImageRef(str(f)),), v)
        got = proc(images=[Image.open(f)], return_tensors="np")
        assert got["image_grid_thw"].tolist() == [list(grid)]
        assert got["pixel_values"].dtype == np.float32 and got["pixel_values"].shape == mine.shape
        np.testing.assert_allclose(got["pixel_values"], mine, rtol=0, atol=1e-6)
        assert int(np.prod(got["image_grid_thw"][0])) // proc.merge_size ** 2 == tokens_of(grid, v)


def test_the_processor_config_is_qwen_s(exported):
    _, out, _ = exported
    config = json.loads((out / "processor_config.json").read_text())
    assert config["processor_class"] == "Qwen2_5_VLProcessor"
    assert config["video_processor"]["video_processor_type"] == "Qwen2VLVideoProcessor"
    assert config["image_processor"] == json.loads((out / "preprocessor_config.json").read_text())


def test_the_tokenizer_names_the_vision_tokens(exported):
    cfg, out, _ = exported
    v = cfg.model.modalities["images"].native
    tok = transformers.AutoTokenizer.from_pretrained(out)
    names = ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]
    assert tok.convert_tokens_to_ids(names) == [259, 260, 261, 262]
    text = "<|vision_start|>" + "<|image_pad|>" * 3 + "<|vision_end|>"
    assert tok(text, add_special_tokens=False).input_ids == item_ids(3, 259, v)


def test_two_vision_tokens_at_one_id_are_refused_by_field(tmp_path):
    # No video placeholder set: the export names token_id + 1 <|video_pad|>, which the start marker holds here.
    cfg = load_config(CONFIGS / "native_qwen2_5_vl.toml", [*TINY, f"{NATIVE}.vision_start_token_id=260",
                                                            f"{NATIVE}.vision_end_token_id=262"])
    with pytest.raises(ValueError, match=r"<\|video_pad\|> 260 \(model.modalities.images.native.video_token_id\), "
                                         r"<\|vision_start\|> 260 \(model.modalities.images.native.vision_start"):
        export_qwen2_vl(build_model(cfg.model), tmp_path / "out", tokenizer="byte")


def test_auto_processor_matches_mimo(exported):
    pytest.importorskip("torchvision")
    cfg, out, files = exported
    v = cfg.model.modalities["images"].native
    proc = transformers.AutoProcessor.from_pretrained(out)
    got = proc(text=["<|vision_start|><|image_pad|><|vision_end|>hi"], images=[Image.open(files[1])],
               return_tensors="np")
    mine, grid = load_item((ImageRef(str(files[1])),), v)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    want = tok("", add_special_tokens=True).input_ids + item_ids(tokens_of(grid, v), 259, v) + list(b"hi")
    assert got["input_ids"][0].tolist() == want
    # The torchvision backend (the default where it is installed) resizes within one 8-bit level of PIL's.
    level = 1 / 255 / np.asarray(proc.image_processor.image_std).min()
    assert got["pixel_values"].shape == mine.shape
    np.testing.assert_allclose(got["pixel_values"], mine, rtol=0, atol=level + 1e-6)


def test_the_export_decodes_like_mimo_generate(exported, tmp_path, capsys):
    """Prompts of different lengths, one image each, prepared by the exported tokenizer and image processor
    (the placeholders expanded as Qwen2VLProcessor does) and decoded greedily by transformers, give the tokens
    `mimo generate` gives on the run."""
    cfg, _, files = exported
    torch.manual_seed(0)
    model = perturb(build_model(cfg.model), scale=0.3)
    run = tmp_path / "run"
    run.mkdir()
    saved = copy.deepcopy(cfg)
    saved.data.prompt_format = "plain"  # markers, the question and a line break, as the HF side lays them out below
    (run / "config.toml").write_text(dump_toml(saved))
    save_weights(model, run)
    out = tmp_path / "hf"
    cli(capsys, "export", "--run", run, "--to", out)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    images = transformers.AutoImageProcessor.from_pretrained(out, **PIL)
    prompts, pics = ["what?", "a", "how many shapes?"], [Image.open(f) for f in files[:3]]
    px = images(images=pics, return_tensors="pt")
    texts = [START + IMAGE_PAD * int(g.prod() // images.merge_size**2) + END + p + "\n"
             for g, p in zip(px["image_grid_thw"], prompts)]
    inputs = tok(texts, padding=True, return_tensors="pt")
    hf = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(out).float().eval()
    made = hf.generate(**inputs, **px, mm_token_type_ids=(inputs.input_ids == 259).int(), max_new_tokens=STEPS,
                       do_sample=False)[:, inputs.input_ids.shape[1]:]
    flags = [f for p, i in zip(prompts, files) for f in ("--prompt", p, "--image", i)]
    out = cli(capsys, "generate", "--run", run, "--max-new-tokens", STEPS, "--jsonl", *flags)
    answers = [json.loads(line)["answer"] for line in out.splitlines()]
    assert len(set(answers)) == 3 and all(answers)
    assert answers == tok.batch_decode(made, skip_special_tokens=True)
