"""A global batch whose placeholders or counts do not fit its inputs is refused as a whole, by every rank
that holds it, before anything runs: which data lane the bad sample would land in does not matter."""

import pytest
import torch

from mimo.config.load import load_config
from mimo.data.batching import COUNTS
from mimo.data.checks import check_batch, check_counts, check_placeholders, check_token_ids
from mimo.models.sample_rows import OUTPUT_LENGTHS
from mimo.train.trainer import Trainer
from tests.support.configs import AVLM
from tests.support.configs import TINY_AVLM as TINY

IMG = 9


def image_batch(placeholders: list[int], images: list[int]) -> dict:
    ids = torch.ones(len(placeholders), 12, dtype=torch.long)
    for s, k in enumerate(placeholders):
        ids[s, 1:1 + k] = IMG
    pixels = torch.zeros(sum(images), 3, 8, 8)
    return {"input_ids": ids, "modality_inputs": {"images": {"vit": {"pixel_values": pixels}}},
            COUNTS: {"images": torch.tensor(images)}}


def test_placeholders_match_fixed_rows_per_image():
    check_placeholders(image_batch([4, 0, 8], [1, 0, 2]), "images", IMG, rows_per_input=4)
    with pytest.raises(ValueError, match=r"Number of images tokens \(7\) does not match number of images "
                                         r"embeddings \(8\) in sample 2 of the global batch"):
        check_placeholders(image_batch([4, 0, 7], [1, 0, 2]), "images", IMG, rows_per_input=4)


def test_placeholders_match_each_clips_output_length():
    # sample 0 holds clip 0 (3 rows), sample 1 none, sample 2 clips 1 and 2 (1 + 3 rows)
    batch = {"input_ids": torch.tensor([[5, 5, 5, 1], [1, 1, 1, 1], [5, 5, 5, 5]]),
             "modality_inputs": {"audio": {"whisper": {"input_features": torch.zeros(3, 2, 8),
                                                       OUTPUT_LENGTHS: torch.tensor([3, 1, 3])}}},
             COUNTS: {"audio": torch.tensor([1, 0, 2])}}
    check_placeholders(batch, "audio", 5, rows_per_input=None)
    batch["input_ids"][2, 3] = 1
    with pytest.raises(ValueError, match=r"Number of audio tokens \(3\) does not match number of audio embeddings "
                                         r"\(4\) in sample 2"):
        check_placeholders(batch, "audio", 5, rows_per_input=None)


def test_counts_must_account_for_every_input():
    check_counts(image_batch([4, 0, 8], [1, 0, 2]))
    batch = image_batch([4, 0, 8], [1, 0, 2])
    batch[COUNTS]["images"] = torch.tensor([1, 0, 1])
    with pytest.raises(ValueError, match=r"modality_counts\['images'\] sums to 2 but input "
                                         r"'images.vit.pixel_values' holds 3 items"):
        check_counts(batch)


def test_trainer_checks_the_whole_global_batch(tmp_path):
    trainer = Trainer(load_config(AVLM, [*TINY, f"--run.out_dir={tmp_path}"]))
    batch = trainer.data.global_batch(0, 8, 1)
    check_batch(trainer.model, batch)
    ids = batch["input_ids"]
    s = int((ids == 260).sum(1).argmax())  # a sample with a clip: drop one of its audio placeholders
    first = int((ids[s] == 260).nonzero()[0])
    ids[s, first] = 32
    with pytest.raises(ValueError, match=f"Number of audio tokens .* in sample {s} of the global batch"):
        check_batch(trainer.model, batch)


def test_token_ids_and_labels_must_lie_in_the_vocabulary(tmp_path):
    """Placeholders and IGNORE_INDEX labels pass; an id or label past model.llm.vocab is named with its
    place and the vocabulary size that would hold it, before anything runs."""
    trainer = Trainer(load_config(AVLM, [*TINY, f"--run.out_dir={tmp_path}"]))
    vocab = trainer.model.language_model.cfg.vocab
    batch = trainer.data.global_batch(0, 8, 1)
    check_batch(trainer.model, batch)  # placeholders and ignored labels included
    batch["labels"][3, 5] = vocab + 6
    with pytest.raises(ValueError, match=rf"labels\[3, 5\] = {vocab + 6} lies outside the LM's vocabulary "
                                         rf"\[0, {vocab}\); set model.llm.vocab to at least {vocab + 7}"):
        check_batch(trainer.model, batch)
    batch = trainer.data.global_batch(0, 8, 1)
    batch["input_ids"][0, 2] = -4
    with pytest.raises(ValueError, match=r"input_ids\[0, 2\] = -4 lies outside"):
        check_batch(trainer.model, batch)


def test_placeholder_ids_outside_the_vocabulary_pass_as_inputs_but_not_as_labels():
    """A Hugging Face model's image placeholder may lie past its vocabulary: it is replaced before the
    embedding, but as a label it would index past the head."""
    batch = {"input_ids": torch.tensor([[1, 300, 300, 2]]), "labels": torch.tensor([[-100, -100, 2, 3]])}
    check_token_ids(batch, 272, [300])
    batch["labels"][0, 3] = 300
    with pytest.raises(ValueError, match=r"labels\[0, 3\] = 300 lies outside"):
        check_token_ids(batch, 272, [300])


def test_the_vocabulary_check_holds_under_any_default_device():
    """The check reads the batch on the CPU; its exemptions must sit there too, not on whatever device
    tensors are made on by default (the NCCL test harness's CUDA default made it fail with a device mismatch)."""
    batch = {"input_ids": torch.tensor([[1, 300, 2]]), "labels": torch.tensor([[-100, 2, 300]])}
    with torch.device("meta"), pytest.raises(ValueError, match=r"labels\[0, 2\] = 300 lies outside"):
        check_token_ids(batch, 272, [300])
