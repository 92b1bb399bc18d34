"""The audio-visual model on 2 gloo ranks, with lanes that hold no clip or no image, gives one process's
gradients, FSDP-sharded or replicated."""

import copy

import pytest
import torch
import torch.distributed as dist

from mimo.config.load import load_config
from mimo.data.audio_demo import AVLMData
from mimo.data.batching import split_microbatches
from mimo.data.text_to_image import TextToImageData
from mimo.models.build import build_model
from mimo.models.multimodal import modules_by_name
from mimo.models.out_loss import OutPathLoss
from mimo.models.step_hints import forward_args
from mimo.parallel.data import GradReducer, apply_fsdp
from mimo.parallel.grid import Grid
from tests.support.configs import AVLM, T2I, TINY_T2I
from tests.support.configs import TINY_AVLM as TINY
from tests.support.dist import run_distributed

pytestmark = pytest.mark.usefixtures("one_thread")


def _lane_grads(mode: str, rank: int, world: int, model, batch: dict, out_path: bool) -> dict[str, torch.Tensor]:
    """This rank's share of `batch` in two microbatches, FSDP-sharded or replicated, reduced over DP."""
    groups = Grid(dp=world).build("dp")
    group = groups.group("dp")
    subs = dict(model.modality_submodules.items())
    if mode == "fsdp":
        apply_fsdp(model.language_model, groups.device_mesh("dp"), entry_methods=("embed", "logits"))
        for sub in subs.values():
            apply_fsdp(sub, groups.device_mesh("dp"), entry_methods=("decode",) if out_path else ())
    else:
        reducers = [GradReducer(m, group) for m in modules_by_name(model).values()]
    lanes = {name: (rank, world) for name in ("language", *subs)}
    micro = split_microbatches(batch, 2, lanes)
    n_text = sum((mb["labels"] != -100).sum() for mb in micro).float()
    dist.all_reduce(n_text, group=group)
    out_loss = OutPathLoss(model_cfg(out_path))
    out_loss.begin(micro, lambda t: dist.all_reduce(t, group=group) or t, torch.device("cpu"))
    for mb in micro:
        out = model(**forward_args(mb))
        (out.loss_sum / n_text + out_loss.term(out)).backward()
    if mode != "fsdp":
        for r in reducers:
            r.reduce()
    full = {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            for n, p in model.named_parameters() if p.grad is not None}
    return full


def model_cfg(out_path: bool):
    return load_config(T2I if out_path else AVLM, TINY_T2I if out_path else TINY).model


def _participation(rank: int, world: int) -> None:
    """AV: rank 1 never sees a clip and rank 0's first microbatch has no image. Out path: rank 1 generates
    nothing. Replicated and FSDP-sharded, each must match one process on the whole batch (and not hang)."""
    for out_path in (False, True):
        for mode in ("replicated", "fsdp"):
            torch.manual_seed(0)
            model = build_model(model_cfg(out_path))
            ref = copy.deepcopy(model)
            if out_path:
                data = TextToImageData(8, 1, seed=2, decoder=model_cfg(True).modalities["images"].decoder,
                                       output_token_id=261)
                batch = data.collate(data.train)
                keep = torch.tensor([1, 1, 0, 0, 1, 1, 0, 0], dtype=torch.bool)  # rank 1's samples draw nothing
                batch["input_ids"] = torch.where(keep[:, None] | (batch["input_ids"] != 261), batch["input_ids"],
                                                 torch.full_like(batch["input_ids"], data.tok.PAD))
                batch["labels"] = torch.where(keep[:, None] | (batch["labels"] != 261), batch["labels"],
                                              torch.full_like(batch["labels"], data.tok.EOS))
            else:
                data = AVLMData(16, 1, seed=1, image_tokens=4, image_token_id=259, audio_token_id=260, n_mels=16)
                by_layout: dict = {}
                for s in data.train:
                    by_layout.setdefault((s.image is not None, s.audio is not None), []).append(s)
                audio, image, both = by_layout[(False, True)], by_layout[(True, False)], by_layout[(True, True)]
                # microbatch t holds samples 4t..4t+3, rank r the pair 4t+2r, 4t+2r+1 of it
                batch = data.collate(audio[:2] + image[:2] + [both[0], audio[2]] + image[2:4])
            ref_loss = OutPathLoss(model_cfg(out_path))
            ref_loss.begin([batch], lambda t: t, torch.device("cpu"))
            whole = ref(**forward_args(split_microbatches(batch, 1)[0]))
            (whole.loss_sum / (batch["labels"] != -100).sum() + ref_loss.term(whole)).backward()
            mine = split_microbatches(batch, 2, dict.fromkeys(("language", "images", "audio"), (rank, world)))
            if rank == 1:
                absent = [mb["input_ids"].eq(261).sum() for mb in mine] if out_path else \
                    [mb["modality_inputs"]["audio"]["whisper"]["input_features"].shape[0] for mb in mine]
                assert absent == [0, 0]
            got = _lane_grads(mode, rank, world, model, batch, out_path)
            for name, p in ref.named_parameters():
                # FSDP reduce-scatters zeros for parameters its unit never used; one process leaves None.
                expect = p.grad if p.grad is not None else torch.zeros_like(p)
                torch.testing.assert_close(got.get(name, torch.zeros_like(p)), expect, rtol=1e-5, atol=1e-8,
                                           msg=f"{mode} out_path={out_path} {name}")


def test_two_ranks_with_absent_modalities_match_one_process():
    run_distributed(_participation, 2, timeout=240)
