"""Qwen2-VL's vision markers on mimo's native data path: with native.vision_start_token_id / vision_end_token_id
set (here from the Qwen2-VL checkpoint that model.llm.hf_path names), a sample of two images of different sizes
gives the input_ids and pixels of transformers' Qwen2VLProcessor (its PIL image processor; the video processor
needs torchvision), the positions of `get_rope_index` and Qwen2VLForConditionalGeneration's fp32 logits (and
Qwen2.5-VL's); a video is wrapped alike, neither markers nor placeholders are loss targets, and `mimo generate`'s
prompts take the markers."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from mimo.config.load import load_config
from mimo.data.prompts import PromptRequest, prompt_batch, prompt_positions
from mimo.data.tokenizer import ByteTokenizer
from mimo.export.tokens import byte_tokenizer
from mimo.hf.build import build_model as build_hf_model
from mimo.models.loss import IGNORE_INDEX
from mimo.tasks import build_demo_data
from tests.support.configs import CONFIGS
from tests.support.hf_helpers import TOL, rel_diff, transformers
from tests.support.native_data import TINY, write_image
from tests.support.qwen_vl import tiny_qwen_vl

pytestmark = pytest.mark.usefixtures("one_thread")

IDS = {"image_token_id": 300, "video_token_id": 301, "vision_start_token_id": 302, "vision_end_token_id": 303}
QWEN_TOKENS = ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]  # at IDS' ids
TWO_IMAGES = "<|vision_start|><|image_pad|><|vision_end|>" * 2 + "two pictures<|eos|>"  # Qwen2-VL's chat layout
MIN_PIXELS, MAX_PIXELS = 256, 4096


PROCESSORS = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor"}


def qwen_processor(family: str = "qwen2_vl"):
    """The byte tokenizer in Hugging Face form with Qwen2-VL's tokens at IDS, under the family's processor (its
    text expansion untouched, without a video processor)."""

    class ImageProcessorOnly(getattr(transformers, PROCESSORS[family])):
        def check_argument_for_proper_class(self, name, arg):
            return None if arg is None else super().check_argument_for_proper_class(name, arg)

    tok = byte_tokenizer()
    tok.add_tokens([f"<|r{i}|>" for i in range(len(tok), IDS["image_token_id"])] + QWEN_TOKENS, special_tokens=True)
    assert tok.convert_tokens_to_ids(QWEN_TOKENS) == list(IDS.values())
    images = transformers.Qwen2VLImageProcessorPil(patch_size=4, temporal_patch_size=2, merge_size=2,
                                                   min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    return ImageProcessorOnly(image_processor=images, tokenizer=tok)


def marked_batch(tmp_path, family: str = "qwen2_vl"):
    """(the Qwen2-VL checkpoint, the run's config, mimo's model built from it, the batch of a two-image row and a
    3-frame video row, the two images' paths)."""
    hf = tiny_qwen_vl(family, vocab=320)
    for config in (hf.config, hf.model.config):
        for k, v in IDS.items():
            setattr(config, k, v)
    hf.save_pretrained(tmp_path / "qwen")
    images = [write_image(tmp_path / f"i{k}.png", size, k) for k, size in enumerate([(40, 72), (100, 30)])]
    frames = [write_image(tmp_path / f"v{k}.png", (48, 64), 10 + k) for k in range(3)]
    rows = [{"image": images, "caption": "two pictures"}, {"video": frames, "fps": 1.0, "caption": "a clip"}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths = [f"--model.llm.hf_path={tmp_path / 'qwen'}", f"--model.modalities.images.hf_path={tmp_path / 'qwen'}",
             "--model.modalities.images.token_id=300", f"--model.modalities.images.native.min_pixels={MIN_PIXELS}",
             f"--model.modalities.images.native.max_pixels={MAX_PIXELS}", f"--data.path={tmp_path / 'm.jsonl'}"]
    cfg = load_config(CONFIGS / "native_qwen2_5_vl.toml", [*TINY, *paths])
    model = build_hf_model(cfg.model).eval()
    data = build_demo_data(cfg, model)
    items = data.reader(data)
    batch = data._assemble([items[(r, r, True, frozenset({"images"}))] for r in range(2)], 2,
                           torch.tensor([False, False]))
    return hf, cfg, model, batch, images


@pytest.mark.parametrize("family", list(PROCESSORS))
def test_two_images_match_qwen2_vl_processor_rope_index_and_logits(family, tmp_path):
    hf, _, model, batch, images = marked_batch(tmp_path, family)
    ref = qwen_processor(family)(text=[TWO_IMAGES], images=[Image.open(p) for p in images], return_tensors="pt")
    n = ref["input_ids"].shape[1]
    ids, visual = batch["input_ids"], batch["modality_inputs"]["images"]["visual"]
    assert torch.equal(ids[0, :n], ref["input_ids"][0]) and (ids[0, n:] == ByteTokenizer.PAD).all()
    assert torch.equal(visual["grid_thw"][:2], ref["image_grid_thw"])
    sizes = ref["image_grid_thw"].prod(-1).tolist()
    patches = torch.cat([visual["pixel_values"][k, :size] for k, size in enumerate(sizes)])
    np.testing.assert_allclose(patches.numpy(), ref["pixel_values"].numpy(), atol=2e-5)
    positions, _ = hf.model.get_rope_index(ref["input_ids"], ref["mm_token_type_ids"], ref["image_grid_thw"])
    assert torch.equal(batch["position_ids"][0, :n], positions.permute(1, 2, 0)[0])
    with torch.no_grad():
        expected = hf(**ref).logits
        ours = model(input_ids=ids[:1, :n], position_ids=batch["position_ids"][:1, :n],
                     modality_inputs={"images": {"visual": {"pixel_values": patches,
                                                            "grid_thw": visual["grid_thw"][:2]}}}).logits
    assert rel_diff(ours, expected) <= TOL


def test_a_video_is_wrapped_and_markers_are_never_targets(tmp_path):
    batch = marked_batch(tmp_path)[3]
    ids, labels = batch["input_ids"].tolist(), batch["labels"].tolist()
    assert batch["modality_inputs"]["images"]["visual"]["grid_thw"][2].tolist() == [2, 12, 16]
    video = [ByteTokenizer.BOS, 302] + [300] * (2 * 12 * 16 // 4) + [303]
    for row, caption in ((0, b"two pictures"), (1, b"a clip")):
        text = [*caption, ByteTokenizer.EOS]
        start = len(ids[row]) - ids[row][::-1].index(303)  # the text follows the last item's end marker
        assert ids[row][start: start + len(text)] == text
        # as transformers' chat data: only the text is a target, predicted from the position before it on
        assert set(labels[row][: start - 1]) == {IGNORE_INDEX}
        assert labels[row][start - 1: start - 1 + len(text)] == text
    assert ids[1][: len(video)] == video


def test_generate_prompts_take_the_markers_too(tmp_path):
    """`mimo generate`'s prompts: an image then a text give the processor's ids and get_rope_index's positions."""
    hf, cfg, model, _, images = marked_batch(tmp_path)
    tok = ByteTokenizer()
    ids, inputs, _ = prompt_batch(cfg, model, [PromptRequest("pic", images=(images[1],))], "r", tok)
    # The run's prompt format (data.prompt_format = "chat", byte tokenizer): LLaVA-1.5's, the image's line first.
    ref = qwen_processor()(text=["USER: <|vision_start|><|image_pad|><|vision_end|>\npic ASSISTANT:"],
                           images=[Image.open(images[1])], return_tensors="pt")
    assert ids == ref["input_ids"].tolist()
    positions, _ = hf.model.get_rope_index(ref["input_ids"], ref["mm_token_type_ids"], ref["image_grid_thw"])
    ours = prompt_positions(cfg, ref["input_ids"], ref["attention_mask"], inputs)
    assert torch.equal(ours, positions.permute(1, 2, 0))
