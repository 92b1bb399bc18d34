"""Imports onto a CUDA device: the tensors are the CPU import's, bit for bit, in the checkpoint's dtype or the
chosen one, and each is read straight onto the device (the device holds the model's bytes, no second copy);
the imported LM's logits on the device match transformers'. Marked `gpu`: skipped without a CUDA device.

    python3 -m pytest -q tests/gpu/test_hf_import_gpu.py      # on the GPU machine
"""

import pytest
import torch

from mimo.hf import import_llava, import_llm
from tests.support.hf_helpers import (
    TOL,
    perturb,
    rel_diff,
    save,
    tiny_causal_lm,
    tiny_llava,
    transformers,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def _full_fp32_matmuls():
    """fp32 matmuls without TF32 (another test may have allowed it process-wide), as on the CPU reference."""
    was = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(was)


def same_tensors_on_cuda(on_device: torch.nn.Module, on_cpu: torch.nn.Module) -> None:
    cpu = on_cpu.state_dict()
    for name, x in on_device.state_dict().items():
        assert x.device.type == "cuda" and x.dtype == cpu[name].dtype, name
        assert torch.equal(x.cpu(), cpu[name]), name


def test_a_bf16_checkpoint_lands_on_the_device_as_it_is(tmp_path):
    directory = save(perturb(tiny_causal_lm("qwen2")).to(torch.bfloat16), tmp_path / "bf16")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    lm = import_llm(directory, device="cuda")
    # The caching allocator hands out blocks of 512 bytes and more: each tensor's block.
    tensors = {t.data_ptr(): t for t in lm.state_dict().values()}  # a tied head once
    held = sum(-(-t.numel() * t.element_size() // 512) * 512 for t in tensors.values())
    peak = torch.cuda.max_memory_allocated() - start
    assert peak <= 1.1 * held, (peak, held)  # read straight onto the device: no fp32 or staging copy
    same_tensors_on_cuda(lm, import_llm(directory))


def test_a_chosen_dtype_on_the_device_gives_transformers_logits(tmp_path):
    directory = save(perturb(tiny_causal_lm("llama")), tmp_path / "llama")
    lm = import_llm(directory, device=CUDA, dtype=torch.float32)
    same_tensors_on_cuda(lm, import_llm(directory, dtype=torch.float32))
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        ref = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)(input_ids=ids).logits
        on = ids.to(CUDA)
        ours = lm.logits(lm(lm.embed(on), torch.arange(9, device=CUDA).expand(2, 9)))
    assert rel_diff(ours.cpu(), ref) <= TOL


def test_llava_lands_on_the_device(tmp_path):
    directory = save(perturb(tiny_llava("siglip", layer=-1, strategy="full")), tmp_path / "llava")
    _, model = import_llava(directory, device="cuda", dtype=torch.bfloat16)
    _, on_cpu = import_llava(directory, dtype=torch.bfloat16)
    same_tensors_on_cuda(model, on_cpu)
