"""`transformers.pipeline("image-text-to-text")` runs a mimo LLaVA export as it is (CPU, fp32, greedy) and
writes, for each (image, prompt), the text `mimo generate` prints."""

import pytest
import torch
from PIL import Image

from tests.support.export_run import PROMPTS, STEPS, TOWERS, cli, make_run, mimo_generate
from tests.support.hf_helpers import transformers

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("tower", list(TOWERS))
def test_image_text_to_text_pipeline_writes_what_mimo_generate_prints(tower, tmp_path, capsys):
    run, images = make_run(tmp_path, tower)
    out = tmp_path / "llava"
    cli(capsys, "export", "--run", run, "--to", out)
    pipe = transformers.pipeline("image-text-to-text", model=str(out), device="cpu", dtype=torch.float32)
    # The processor expands each `<image>` into the tower's placeholders; one batch, left-padded, like mimo's.
    texts = ["<image>" + p for p in PROMPTS]
    # Through generate_kwargs: the pipeline hands its other keywords to the processor.
    ask = dict(generate_kwargs={"do_sample": False, "max_new_tokens": STEPS})
    new = pipe(images=[Image.open(i) for i in images], text=texts, return_full_text=False, **ask)
    assert [r["input_text"] for r in new] == texts
    assert mimo_generate(capsys, run, images) == "".join(r["generated_text"] + "\n" for r in new)
    # By default (return_full_text=True) the pipeline writes the prompt as given, then the new text.
    full = pipe(images=[Image.open(i) for i in images], text=texts, **ask)
    assert [r["generated_text"] for r in full] == [t + r["generated_text"] for t, r in zip(texts, new)]
