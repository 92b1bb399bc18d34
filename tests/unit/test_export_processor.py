"""A run's export is complete: `AutoProcessor` + `LlavaForConditionalGeneration` (and `AutoTokenizer` +
`AutoModelForCausalLM` for --lm-only) load it as they are and greedy-decode a batch of prompts of different
lengths to the same text as `mimo generate`, for a run on the byte tokenizer and on a Hugging Face one; ids,
generation config, `<image>` token and file modes are set."""

import json
import stat

import numpy as np
import pytest
import torch
from PIL import Image

from mimo.data.shapes import image_tensor_values
from mimo.data.tokenizer import ByteTokenizer
from mimo.export.tokens import with_image_token
from mimo.models.generate import greedy_generate, left_pad
from mimo.train.checkpoint.weights import load_run
from tests.support.export_run import PROMPTS, STEPS, TOWERS, cli, make_run, mimo_generate
from tests.support.hf_helpers import PIL, WORDS, tiny_tokenizer, transformers

pytestmark = pytest.mark.usefixtures("one_thread")


def mimo_pixels(images) -> torch.Tensor:
    """[N, 3, 16, 16] float32: the tower's input for each image file as mimo's data makes it."""
    return torch.from_numpy(np.stack([image_tensor_values(np.asarray(Image.open(i).convert("RGB").resize(
        (16, 16), Image.BICUBIC))) for i in images]))


def test_the_torchvision_backend_is_within_one_level_of_mimos_pixels(tmp_path, capsys):
    # transformers' default backend where torchvision is installed; one 8-bit level is 2/255 after x / 127.5 - 1.
    pytest.importorskip("torchvision")
    run, images = make_run(tmp_path, "clip")
    cli(capsys, "export", "--run", run, "--to", tmp_path / "llava")
    proc = transformers.AutoProcessor.from_pretrained(tmp_path / "llava")
    got = proc(text=["<image>"] * len(images), images=[Image.open(i) for i in images], return_tensors="pt")
    assert (got.pixel_values - mimo_pixels(images)).abs().max() <= 2 / 255 + 1e-6


@pytest.mark.parametrize("tower", list(TOWERS))
def test_llava_export_decodes_like_mimo_generate(tower, tmp_path, capsys):
    run, images = make_run(tmp_path, tower)
    out = tmp_path / "llava"
    cli(capsys, "export", "--run", run, "--to", out)
    proc = transformers.AutoProcessor.from_pretrained(out, **PIL)
    hf = transformers.LlavaForConditionalGeneration.from_pretrained(out).float().eval()
    inputs = proc(text=["<image>" + p for p in PROMPTS], images=[Image.open(i) for i in images], padding=True,
                  return_tensors="pt")
    assert inputs.attention_mask[:, 0].tolist().count(0) == 2  # left-padded, prompts of different lengths
    made = hf.generate(**inputs, max_new_tokens=STEPS, do_sample=False)[:, inputs.input_ids.shape[1]:]
    texts = proc.batch_decode(made, skip_special_tokens=True)
    assert mimo_generate(capsys, run, images) == "".join(t + "\n" for t in texts)
    # The processor prepares what mimo's data does: BOS, one placeholder per tower row, bytes; mimo's pixels.
    _, model = load_run(run)
    n = model.modality_submodules["images"].encoders["vit"].tokens_per_image
    byte = ByteTokenizer()
    ids, mask = left_pad([[byte.BOS] + [byte.IMAGE] * n + byte.encode(p) for p in PROMPTS], byte.PAD)
    assert torch.equal(inputs.input_ids, ids) and torch.equal(inputs.attention_mask, mask)
    assert (inputs.pixel_values - mimo_pixels(images)).abs().max() <= 1e-6
    ours = greedy_generate(model, ids, {"images": {"vit": {"pixel_values": inputs.pixel_values}}}, STEPS,
                           byte.EOS, attention_mask=mask)
    assert ours == [[t for t in row if t != byte.PAD] for row in made.tolist()]
    gen = json.loads((out / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (256, 257, 258)
    assert json.loads((out / "config.json").read_text())["text_config"]["eos_token_id"] == 257
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.convert_tokens_to_ids("<image>") == ByteTokenizer.IMAGE and tok("hé").input_ids == [256, 104, 195, 169]
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o644 for f in out.iterdir())


def test_lm_only_export_decodes_like_mimo_generate(tmp_path, capsys):
    run, _ = make_run(tmp_path, "clip")
    out = tmp_path / "lm"
    cli(capsys, "export", "--run", run, "--to", out, "--lm-only")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    lm = transformers.AutoModelForCausalLM.from_pretrained(out).float().eval()
    inputs = tok(PROMPTS, padding=True, return_tensors="pt")
    made = lm.generate(**inputs, max_new_tokens=STEPS, do_sample=False)[:, inputs.input_ids.shape[1]:]
    texts = tok.batch_decode(made, skip_special_tokens=True)
    assert mimo_generate(capsys, run) == "".join(t + "\n" for t in texts)


def test_image_token_is_added_at_the_placeholder_id(tmp_path):
    words = [w for w in WORDS if w != "<image>"]
    tok = with_image_token(tiny_tokenizer(tmp_path / "a", words=words), len(words) + 2, "t")
    assert tok.convert_tokens_to_ids("<image>") == len(words) + 2 and len(tok) == len(words) + 3
    with pytest.raises(ValueError, match="holds 'is' at id 9"):
        with_image_token(tiny_tokenizer(tmp_path / "b", words=words), 9, "t")
    with pytest.raises(ValueError, match="token_id = 3"):
        with_image_token(tiny_tokenizer(tmp_path / "c"), 20, "t")


@pytest.mark.parametrize("in_vocab", [False, True])
def test_hf_tokenizer_run_exports_its_tokenizer(in_vocab, tmp_path, capsys):
    # A run on a Hugging Face tokenizer without `<image>` (the export appends it at the run's placeholder id) or
    # with it as a plain word (the export makes it a special token, which text cannot split).
    words = WORDS if in_vocab else [w for w in WORDS if w != "<image>"]
    image = words.index("<image>") if in_vocab else len(words)
    run_tok = tiny_tokenizer(tmp_path / "tok", words=words)
    run, images = make_run(tmp_path, "clip", vocab=len(words) + (not in_vocab), token_id=image,
                           tokenizer=tmp_path / "tok")
    prompts = ["what is this?", "this", "what?"]
    out = tmp_path / "llava"
    cli(capsys, "export", "--run", run, "--to", out)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.convert_tokens_to_ids("<image>") == image and len(tok) == len(words) + (not in_vocab)
    proc = transformers.AutoProcessor.from_pretrained(out, **PIL)  # mimo generate's pixels, torchvision or not
    inputs = proc(text=["<image>" + p for p in prompts], images=[Image.open(i) for i in images], padding=True,
                  return_tensors="pt")
    # What mimo's data and `mimo generate` build with the run's own tokenizer: BOS, placeholders, text, left-padded
    # with EOS (the tokenizer has no pad token).
    _, model = load_run(run)
    n = model.modality_submodules["images"].encoders["vit"].tokens_per_image
    bos, eos = run_tok.bos_token_id, run_tok.eos_token_id
    ids, mask = left_pad([[bos] + [image] * n + run_tok.encode(p, add_special_tokens=False) for p in prompts], eos)
    assert torch.equal(inputs.input_ids, ids) and torch.equal(inputs.attention_mask, mask)
    hf = transformers.LlavaForConditionalGeneration.from_pretrained(out).float().eval()
    made = hf.generate(**inputs, max_new_tokens=STEPS, do_sample=False)[:, inputs.input_ids.shape[1]:].tolist()
    ours = greedy_generate(model, ids, {"images": {"vit": {"pixel_values": inputs.pixel_values}}}, STEPS, eos,
                           attention_mask=mask)
    assert ours == [row[:row.index(eos) + 1] if eos in row else row for row in made]
    texts = proc.batch_decode(made, skip_special_tokens=True)
    assert mimo_generate(capsys, run, images, prompts) == "".join(t + "\n" for t in texts)
