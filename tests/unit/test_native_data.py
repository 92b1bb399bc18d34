"""Native-resolution data: Qwen's smart_resize and patch layout against transformers' Qwen2-VL image processor, a
JSONL manifest of images of several sizes and a video becoming batches with per-sample token counts and M-RoPE
positions, and `mimo train` end to end on it (then `mimo export` to a Qwen2.5-VL directory)."""

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from mimo.cli import main
from mimo.config.load import load_config
from mimo.config.schema import NativeViTConfig
from mimo.data.native_images import HEADER_BYTES, grid_of, header_size, load_item, smart_resize
from mimo.data.samples import ImageRef
from mimo.data.tokenizer import ByteTokenizer
from mimo.hf.build import build_model as build_hf_model
from mimo.hf.qwen2_vl import import_qwen2_vl, qwen_vl_inputs
from mimo.models.build import build_model
from mimo.models.generate import left_pad
from mimo.models.mrope import mrope_positions
from mimo.models.step_hints import forward_args
from mimo.tasks import build_demo_data
from mimo.train.trainer import Trainer
from tests.support.configs import CONFIGS
from tests.support.hf_helpers import TOL, rel_diff, transformers
from tests.support.native_data import SIZES, TINY, manifest, write_image
from tests.support.qwen_vl import batch, tiny_qwen_vl

pytestmark = pytest.mark.usefixtures("one_thread")


def cli(argv: list[str]) -> None:
    """`mimo ARGV` in this process; it must exit 0."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code in (0, None)


def test_smart_resize_and_patches_match_transformers(tmp_path):
    cfg = NativeViTConfig(patch=14, merge=2, min_pixels=56 * 56, max_pixels=28 * 28 * 64)
    proc = transformers.Qwen2VLImageProcessorPil(min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
    ref_resize = transformers.models.qwen2_vl.image_processing_pil_qwen2_vl.smart_resize
    for h, w in [(40, 72), (1000, 300), (33, 33), (2000, 1500), (57, 29)]:
        assert smart_resize(h, w, 28, cfg.min_pixels, cfg.max_pixels) == ref_resize(h, w, 28, cfg.min_pixels,
                                                                                      cfg.max_pixels)
    for k, size in enumerate([(56, 84), (300, 120)]):
        path = write_image(tmp_path / f"p{k}.png", size, k)
        ref = proc(images=[Image.open(path)], return_tensors="np")
        patches, grid = load_item((type("R", (), {"read": lambda self, p=path: open(p, "rb").read()})(),), cfg)
        assert list(grid) == ref["image_grid_thw"][0].tolist()
        np.testing.assert_allclose(patches, ref["pixel_values"], atol=2e-5)


def test_a_manifest_becomes_batches_with_per_sample_tokens(tmp_path):
    cfg = load_config(CONFIGS / "native_qwen2_5_vl.toml", [*TINY, f"--data.path={manifest(tmp_path)}"])
    model = build_model(cfg.model)
    data = build_demo_data(cfg, model)
    items = data.reader(data)
    batch = data._assemble([items[(r, r, True, frozenset({"images"}))] for r in range(6)], 6,
                           torch.tensor([False] * 5 + [True]))
    grids = batch["modality_inputs"]["images"]["visual"]["grid_thw"]
    native = cfg.model.modalities["images"].native
    assert grids.tolist() == [list(grid_of(s, 1, native)) for s in SIZES] + [[2, 6, 8]]
    counts = (batch["input_ids"] == 259).sum(1)
    assert counts.tolist() == [t * h * w // 4 for t, h, w in grids.tolist()] + [0]
    assert batch["modality_counts"]["images"].tolist() == [1, 1, 1, 1, 1, 0]
    video_row = batch["input_ids"][4:5]  # 3 frames at 1 fps: 2 s per temporal patch, 4 tokens/s -> step 8
    expected = mrope_positions(video_row, 259, grids[4:5], 2, torch.tensor([8.0]))
    assert torch.equal(batch["position_ids"][4:5], expected) and expected[0, :, 0].max() >= 8
    with torch.no_grad():
        out = model(**forward_args({k: v for k, v in batch.items() if k != "modality_counts"}))
    assert torch.isfinite(out.loss_sum)


def test_a_sample_of_two_images_holds_both_runs_and_their_positions(tmp_path):
    """Row 6 of the manifest: BOS, the 40 x 72 image's 2 x 4 merged cells, the 100 x 30 image's 6 x 2, the caption;
    positions by hand (the second image starts past the first's larger side, the text past the second's). Row 7
    holds text alone."""
    cfg = load_config(CONFIGS / "native_qwen2_5_vl.toml", [*TINY, f"--data.path={manifest(tmp_path, several=True)}"])
    model = build_model(cfg.model).eval()
    data = build_demo_data(cfg, model)
    items = data.reader(data)
    batch = data._assemble([items[(r, r, True, frozenset({"images"}))] for r in range(8)], 8,
                           torch.tensor([False] * 5 + [True, False, False]))
    native = cfg.model.modalities["images"].native
    grids = batch["modality_inputs"]["images"]["visual"]["grid_thw"]
    assert batch["modality_counts"]["images"].tolist() == [1, 1, 1, 1, 1, 0, 2, 0]
    assert batch["input_ids"][7, :6].tolist() == [256, *b"none", 257]
    assert torch.equal(batch["position_ids"][7], torch.arange(batch["input_ids"].shape[1])[:, None].expand(-1, 3))
    first, second = grid_of(SIZES[0], 1, native), grid_of(SIZES[1], 1, native)
    assert grids[-2:].tolist() == [list(first), list(second)] and first[1:] == (4, 8) and second[1:] == (12, 4)
    text = list(b"two pictures") + [257]
    assert batch["input_ids"][6, : 1 + 8 + 12 + len(text)].tolist() == [256] + [259] * 20 + text
    cells = lambda start, h, w: [[start, start + r, start + c] for r in range(h) for c in range(w)]
    expected = [[0, 0, 0]] + cells(1, 2, 4) + cells(5, 6, 2) + [[11 + i] * 3 for i in range(len(text))]
    assert batch["position_ids"][6, : len(expected)].tolist() == expected
    pixels = batch["modality_inputs"]["images"]["visual"]["pixel_values"]
    for k, item in ((0, -2), (1, -1)):  # each image's own patches, the first not cut to the second's
        patches, _ = load_item((ImageRef(str(tmp_path / f"i{k}.png")),), native)
        assert torch.equal(pixels[item, : len(patches)], torch.from_numpy(patches))
    with torch.no_grad():
        one = model(**forward_args({k: v for k, v in batch.items() if k != "modality_counts"}))
        alone = {"input_ids": batch["input_ids"][6:7], "labels": batch["labels"][6:7],
                 "position_ids": batch["position_ids"][6:7],
                 "modality_inputs": {"images": {"visual": {"pixel_values": pixels[-2:], "grid_thw": grids[-2:]}}}}
        two = model(**forward_args(alone))
    assert torch.isfinite(one.loss_sum) and two.num_tokens == len(text)


def test_mimo_train_then_export_on_native_resolution_data(tmp_path, capsys):
    """Six steps of `mimo train` on images of four sizes and a video, a falling loss, then `mimo export`; `mimo
    generate` on the run answers two images of different sizes as transformers' generate on the export does."""
    run = tmp_path / "runs"
    cli(["train", str(CONFIGS / "native_qwen2_5_vl.toml"), *TINY, f"--data.path={manifest(tmp_path)}",
         f"--run.out_dir={run}", "--run.name=n", "--train.steps=6", "--optim.lr=3e-3"])
    losses = [json.loads(line)["loss"] for line in (run / "n" / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 6 and losses[-1] < losses[0]
    summary = json.loads((run / "n" / "summary.json").read_text())
    assert summary["eval"]["data"]["corrupt_samples"] == 1
    cli(["export", "--run", str(run / "n"), "--to", str(tmp_path / "hf")])
    hf = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
    cfg = load_config(run / "n" / "config.toml")
    capsys.readouterr()
    cli(["generate", "--run", str(run / "n"), "--max-new-tokens", "8", "--image", str(tmp_path / "i0.png"), "--image",
         str(tmp_path / "i3.png"), "--prompt", "pic", "--prompt", "a picture"])
    assert capsys.readouterr().out == hf_answers(hf, cfg.model.modalities["images"].native, tmp_path,
                                                 ["pic", "a picture"])
    _, model = import_qwen2_vl(tmp_path / "hf")
    grid = torch.tensor([[1, 4, 6]])
    ids = torch.tensor([[1] + [259] * 6 + [5, 6, 7]])
    pixels = torch.randn(24, cfg.model.modalities["images"].native.patch_pixels)
    with torch.no_grad():
        ref = hf(input_ids=ids, pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=(ids == 259).int()).logits
        ours = model(**qwen_vl_inputs(cfg.model, ids, pixels, grid)).logits
    assert rel_diff(ours, ref) <= TOL


def hf_answers(hf, native: NativeViTConfig, tmp_path, texts: list[str]) -> str:
    """transformers' greedy answers to the question `text` about images i0 and i3 (as mimo's data reads them),
    left-padded, one line each."""
    tok = ByteTokenizer()
    items = [load_item((ImageRef(str(tmp_path / f"i{k}.png")),), native) for k in (0, 3)]
    # data.prompt_format = "chat" with the byte tokenizer: LLaVA-1.5's "USER: <image>\ntext ASSISTANT:".
    rows = [[tok.BOS, *tok.encode("USER: ")] + [tok.IMAGE] * (math.prod(g) // 4) + tok.encode(f"\n{t} ASSISTANT:")
            for (_, g), t in zip(items, texts)]
    ids, mask = left_pad(rows, tok.PAD)
    out = hf.generate(input_ids=ids, attention_mask=mask, mm_token_type_ids=(ids == tok.IMAGE).int(),
                      pixel_values=torch.from_numpy(np.concatenate([p for p, _ in items])),
                      image_grid_thw=torch.tensor([g for _, g in items]), max_new_tokens=8, do_sample=False,
                      eos_token_id=tok.EOS, pad_token_id=tok.PAD)[:, ids.shape[1]:]
    return "".join(tok.decode(row) + "\n" for row in out.tolist())


def test_training_from_a_qwen_vl_checkpoint_named_by_hf_path(tmp_path):
    """model.llm.hf_path and the modality's hf_path name one Qwen2.5-VL directory: the built model gives its logits,
    and it trains on the manifest."""
    hf = tiny_qwen_vl("qwen2_5_vl", vocab=320)
    ids = dict(image_token_id=300, video_token_id=301, vision_start_token_id=302, vision_end_token_id=303)
    for config in (hf.config, hf.model.config):  # ids the byte tokenizer never writes
        for k, v in ids.items():
            setattr(config, k, v)
    hf.save_pretrained(tmp_path / "qwen")
    paths = [f"--model.llm.hf_path={tmp_path / 'qwen'}", f"--model.modalities.images.hf_path={tmp_path / 'qwen'}",
             "--model.modalities.images.token_id=300", "--model.modalities.images.native.min_pixels=256",
             "--model.modalities.images.native.max_pixels=4096"]
    cfg = load_config(CONFIGS / "native_qwen2_5_vl.toml", [*TINY, *paths, f"--data.path={manifest(tmp_path)}",
                                                             f"--run.out_dir={tmp_path / 'runs'}", "--train.steps=2"])
    model = build_hf_model(cfg.model).eval()  # resolves cfg.model from the directory in place
    native = cfg.model.modalities["images"].native
    assert (native.video_token_id, native.vision_start_token_id, native.vision_end_token_id) == (301, 302, 303)
    inputs = batch()
    inputs["input_ids"] = inputs["input_ids"] + 200 * ((inputs["input_ids"] >= 100) & (inputs["input_ids"] <= 103))
    with torch.no_grad():
        ref = hf(**inputs).logits
        mine = qwen_vl_inputs(cfg.model, **{k: v for k, v in inputs.items() if k != "mm_token_type_ids"})
        assert rel_diff(model(**forward_args(mine)).logits, ref) <= TOL
    summary = Trainer(cfg).train()
    assert summary["steps"] == 2 and math.isfinite(summary["final_loss"])


def test_an_images_size_reads_its_header_bytes_only(tmp_path, monkeypatch):
    """A 400 x 300 PNG of noise (352 KiB) gives its size from its first HEADER_BYTES, also as a tar member; a JPEG
    whose 100 KiB colour profile comes before its header, from the whole file."""
    reads = []
    real = ImageRef.read
    monkeypatch.setattr(ImageRef, "read", lambda ref, limit=-1: reads.append(limit) or real(ref, limit))
    png = write_image(tmp_path / "big.png", (400, 300), 0)
    assert header_size(ImageRef(png)) == (400, 300) and reads == [HEADER_BYTES]
    blob = open(png, "rb").read()
    assert len(blob) > 4 * HEADER_BYTES
    shard = tmp_path / "shard.bin"
    shard.write_bytes(b"x" * 100 + blob + b"y" * 100)
    assert header_size(ImageRef(str(shard), 100, len(blob))) == (400, 300) and reads == [HEADER_BYTES] * 2
    jpeg = tmp_path / "profiled.jpg"
    Image.new("RGB", (50, 70)).save(jpeg, icc_profile=b"\0" * 100_000)
    reads.clear()
    assert header_size(ImageRef(str(jpeg))) == (70, 50) and reads == [HEADER_BYTES, -1]
