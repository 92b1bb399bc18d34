"""A run trained on chat data through `mimo train` answers through `mimo generate` what it learned, on held-out
images (a small learnable task: the colour and the size of a drawn square; oracle: the drawing's own values),
and its export, asked through its own processor and chat template by transformers, answers the same. A run
saved before data.prompt_format existed reads as the old ("plain") format."""

import json

import pytest
import torch
from PIL import Image

from mimo.cli import main
from mimo.config.load import load_config
from mimo.train.checkpoint.weights import load_run
from tests.support.chat_task import COLOURS, QUESTIONS, WORDS, chat_manifest, chat_tokenizer
from tests.support.hf_helpers import transformers
from tests.support.tiny_run import DEMO, TINY

pytestmark = pytest.mark.usefixtures("one_thread")

HELD_OUT = 24


def cli(capsys, *args) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main([*map(str, args)])
    out, err = capsys.readouterr()
    assert done.value.code == 0, err
    return out


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory):
    """(run folder, tokenizer folder, held-out truth): a tiny VLM trained 200 steps on 400 chats."""
    root = tmp_path_factory.mktemp("chat")
    tok = chat_tokenizer(root / "tokenizer")
    manifest, _ = chat_manifest(root / "train", 400, seed=0)
    _, held_out = chat_manifest(root / "held_out", HELD_OUT, seed=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.raises(SystemExit) as done:
            main(["train", str(DEMO), *TINY, f"--run.out_dir={root / 'runs'}", "--data.name=jsonl",
                  f"--data.path={manifest}", f"--data.tokenizer={tok}", "--data.seq_len=40", "--data.global_batch=16",
                  f"--model.llm.vocab={len(WORDS)}", f"--model.modalities.images.token_id={WORDS.index('<image>')}",
                  "--train.steps=200", "--optim.lr=3e-3", "--optim.warmup_steps=10"])
    finally:
        torch.set_num_threads(threads)
    assert done.value.code == 0
    return root / "runs" / "tiny", tok, held_out


def questions(held_out: list[dict], folder) -> tuple:
    """A --prompts JSONL file asking each held-out image both questions, and the true answers in its order."""
    rows = [{"prompt": QUESTIONS[q], "image": t["image"]} for t in held_out for q in QUESTIONS]
    (folder / "ask.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "ask.jsonl", rows, [t[q] for t in held_out for q in QUESTIONS]


def test_generate_answers_what_training_taught(chat_run, capsys, tmp_path):
    run, _, held_out = chat_run
    ask, rows, truth = questions(held_out, tmp_path)
    out = cli(capsys, "generate", "--run", run, "--prompts", ask, "--max-new-tokens", 4, "--jsonl")
    answers = [json.loads(line) for line in out.splitlines()]
    assert [a["prompt"] for a in answers] == [r["prompt"] for r in rows]
    right = [a["answer"].strip() == t for a, t in zip(answers, truth)]
    colour, overall = sum(right[0::2]) / HELD_OUT, sum(right) / len(right)
    colour_majority = max(truth[0::2].count(c) for c in COLOURS) / HELD_OUT
    majority = max(truth.count(t) for t in set(truth)) / len(truth)
    print(f"colour accuracy {colour:.2f} (majority {colour_majority:.2f}); both questions {overall:.2f} (majority "
          f"answer {majority:.2f})")
    assert colour >= 0.8 and colour > colour_majority + 0.4, (colour, colour_majority, answers)
    assert overall > majority + 0.4, (overall, majority, answers)


def test_a_run_saved_without_the_key_reads_as_plain(chat_run, tmp_path):
    run, _, _ = chat_run
    saved = (run / "config.toml").read_text()
    assert 'prompt_format = "chat"' in saved
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.toml").write_text(saved.replace('prompt_format = "chat"\n', ""))
    (old / "checkpoints").symlink_to(run / "checkpoints")
    assert load_run(old)[0].data.prompt_format == "plain"
    assert load_config(old / "config.toml").data.prompt_format == "chat"  # a new config's default


def test_the_export_asked_through_its_chat_template_answers_as_mimo_generate(chat_run, capsys, tmp_path):
    """transformers' LLaVA, its prompts made by the exported processor's own chat template (a string content with
    `<image>` where the image goes), greedy: the same answers as `mimo generate`, in one left-padded batch."""
    run, _, held_out = chat_run
    ask, rows, _ = questions(held_out[:6], tmp_path)
    ours = cli(capsys, "generate", "--run", run, "--prompts", ask, "--max-new-tokens", 4).splitlines()
    out = tmp_path / "llava"
    cli(capsys, "export", "--run", run, "--to", out)
    proc = transformers.AutoProcessor.from_pretrained(out)
    texts = [proc.apply_chat_template([{"role": "user", "content": "<image>\n" + r["prompt"]}],
                                      add_generation_prompt=True) for r in rows]
    inputs = proc(images=[Image.open(r["image"]) for r in rows], text=texts, padding=True, return_tensors="pt")
    hf = transformers.LlavaForConditionalGeneration.from_pretrained(out).float().eval()
    made = hf.generate(**inputs, max_new_tokens=4, do_sample=False)[:, inputs["input_ids"].shape[1]:]
    theirs = proc.batch_decode(made, skip_special_tokens=True)
    assert ours == theirs
    assert len(set(ours)) > 1  # the answers depend on the image


def test_one_line_per_prompt_whatever_the_answers_hold(chat_run, capsys, tmp_path, monkeypatch):
    run, _, held_out = chat_run
    ask, rows, _ = questions(held_out[:2], tmp_path)
    answers = ["two\nlines", "a back\\slash", "", "cr\r"]
    monkeypatch.setattr("mimo.data.prompts.generate_text", lambda *args: answers)
    out = cli(capsys, "generate", "--run", run, "--prompts", ask)
    assert out == "two\\nlines\na back\\\\slash\n\ncr\\r\n"
    out = cli(capsys, "generate", "--run", run, "--prompts", ask, "--jsonl")
    assert [json.loads(line) for line in out.splitlines()] == [
        {"prompt": r["prompt"], "image": [r["image"]], "audio": None, "answer": a} for r, a in zip(rows, answers)]
