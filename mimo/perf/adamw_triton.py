"""MasterAdamW's update reading each gradient where autograd left it, through a table of addresses.

With a flat gradient buffer, every fresh gradient is first copied into it, one copy kernel per parameter
(BENCHMARKS.md, `grad_table`, has their cost). Here one kernel walks all the parameters: each program takes
`BLOCK` elements of one parameter, reads its gradient through that parameter's entry in a table of
addresses, and updates the flat fp32 master weights and moments and the flat low-precision weights. Same
formula as `master_adamw.adamw_update`.

The block tables (which parameter, where in the flat buffers) are fixed when the optimizer is built; only
the addresses change from step to step. They are copied to the device with each launch (from pinned
memory, so a CUDA graph capture records the copy, and its replays read the addresses of the capture).
"""

from __future__ import annotations

import torch

from mimo.perf.triton_support import tl, triton

BLOCK = 1024  # elements per program, over 4 warps (measured best of 1024-8192 x 4-16 warps: benchmarks.bench_adamw)
_ALIGN_BYTES = 16  # what vectorised loads want; misaligned gradients (views into a larger buffer) are cloned

if triton is not None:

    @triton.jit
    def _rounded(x, dtype: tl.constexpr):
        """fp32 `x` in `dtype`; to bf16 rounded to nearest even by hand, as torch rounds (Triton's interpreter
        would truncate)."""
        if dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            top = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).to(tl.uint16)
            return tl.where(x != x, 0x7FC0, top).to(tl.uint16).to(tl.bfloat16, bitcast=True)  # NaN stays NaN
        return x.to(dtype)

    @triton.jit
    def _update(g_ptr, idx, flat, mask, master, exp_avg, exp_avg_sq, weight, decay, step_size, bc2_sqrt, beta1,
                beta2, eps):
        g = tl.load(g_ptr + idx, mask=mask).to(tl.float32)
        p = tl.load(master + flat, mask=mask)
        m = tl.load(exp_avg + flat, mask=mask)
        v = tl.load(exp_avg_sq + flat, mask=mask)
        p = p * decay
        m = m + (1 - beta1) * (g - m)
        v = v * beta2 + (1 - beta2) * (g * g)
        p = p - step_size * m / (tl.sqrt(v) / bc2_sqrt + eps)
        tl.store(master + flat, p, mask=mask)
        tl.store(exp_avg + flat, m, mask=mask)
        tl.store(exp_avg_sq + flat, v, mask=mask)
        tl.store(weight + flat, _rounded(p, weight.dtype.element_ty), mask=mask)

    @triton.jit
    def _adamw_blocks(grad_addrs, block_param, first_block, offsets, numels, master, exp_avg, exp_avg_sq,
                      weight, scalars, block_base, beta1, beta2, eps, BLOCK: tl.constexpr):
        pid = tl.program_id(0) + block_base
        i = tl.load(block_param + pid)
        start = tl.multiple_of((pid - tl.load(first_block + i)).to(tl.int64) * BLOCK, BLOCK)
        flat = tl.multiple_of(tl.load(offsets + i) + start, 64) + tl.arange(0, BLOCK)
        n = tl.load(numels + i)
        addr = tl.load(grad_addrs + i)
        decay, step_size, bc2_sqrt = tl.load(scalars), tl.load(scalars + 1), tl.load(scalars + 2)
        idx = start + tl.arange(0, BLOCK)
        g_ptr = tl.multiple_of(addr.to(tl.pointer_type(weight.dtype.element_ty)), 16)
        if start + BLOCK <= n:  # a whole block: no masks, vector loads
            _update(g_ptr, idx, flat, None, master, exp_avg, exp_avg_sq, weight, decay, step_size, bc2_sqrt,
                    beta1, beta2, eps)
        else:  # a parameter's last block
            _update(g_ptr, idx, flat, idx < n, master, exp_avg, exp_avg_sq, weight, decay, step_size, bc2_sqrt,
                    beta1, beta2, eps)


class TableUpdate:
    """AdamW over parameters laid out in flat buffers at `offsets` (multiples of 64 elements), reading their
    gradients from wherever they are. `launch(lo, hi, grads, ...)` updates parameters lo..hi-1 with one
    kernel, on the current stream: programs of `block` elements (a power of two, at least 64, so that every
    program starts aligned in the flat buffers) and `warps` warps."""

    def __init__(self, numels: list[int], offsets: list[int], device: torch.device, block: int = BLOCK,
                 warps: int = 4):
        if block < 64 or block & (block - 1) or any(off % 64 for off in offsets):
            raise ValueError(f"TableUpdate needs a block that is a power of two >= 64 (got {block}) and offsets that "
                             f"are multiples of 64 elements")
        self.block, self.warps = block, warps
        blocks = [-(-n // block) for n in numels]
        first = [0]
        for b in blocks:
            first.append(first[-1] + b)
        self.first = first  # block index where each parameter's blocks begin; first[-1] = all of them
        self.block_param = torch.repeat_interleave(torch.arange(len(numels), dtype=torch.int32),
                                                   torch.tensor(blocks)).to(device)
        self.first_block = torch.tensor(first[:-1], dtype=torch.int64, device=device)
        self.offsets = torch.tensor(offsets, dtype=torch.int64, device=device)
        self.numels = torch.tensor(numels, dtype=torch.int64, device=device)
        self.n_params = len(numels)
        self.device = device
        self.captured_tables: list[torch.Tensor] = []  # host tables a CUDA graph reads at each replay

    def addresses(self, lo: int, hi: int, grads: list[torch.Tensor | None], dtype: torch.dtype) -> torch.Tensor:
        """The device table of the gradient addresses of parameters lo..hi-1 (each has one; the others' are 0)."""
        table = [0] * self.n_params
        for i in range(lo, hi):
            if grads[i] is None or not _readable(grads[i], dtype):
                raise ValueError(f"gradient {i} must be a tensor, contiguous, {dtype} and start {_ALIGN_BYTES}-byte "
                                 f"aligned for the table kernel: pass it through aligned_grad")
            table[i] = grads[i].data_ptr()
        cuda = self.device.type == "cuda"
        host = torch.tensor(table, dtype=torch.int64, pin_memory=cuda)
        if cuda and torch.cuda.is_current_stream_capturing():
            self.captured_tables.append(host)  # the captured copy reads this memory at every replay
        return host.to(self.device, non_blocking=cuda)

    def launch(self, lo: int, hi: int, grads: list[torch.Tensor | None], master: torch.Tensor,
               exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, weight: torch.Tensor, step: torch.Tensor,
               lr: torch.Tensor, beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
        """`grads[i]`: parameter i's gradient (contiguous, `weight`'s dtype, 16-byte aligned; see
        `aligned_grad`), for every i in lo..hi-1 (a parameter without one is not launched)."""
        count = self.first[hi] - self.first[lo]
        if count == 0:
            return
        scalars = torch.stack([1 - lr * weight_decay, lr / (1 - beta1 ** step), (1 - beta2 ** step).sqrt()])
        table = self.addresses(lo, hi, grads, weight.dtype)
        _adamw_blocks[(count,)](table, self.block_param, self.first_block, self.offsets, self.numels, master,
                                exp_avg, exp_avg_sq, weight, scalars, self.first[lo], beta1, beta2, eps,
                                BLOCK=self.block, num_warps=self.warps)


def aligned_grad(p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`p.grad` as the table kernel reads it: contiguous, of `dtype`, starting 16-byte aligned (autograd may
    hand over a view into a larger buffer; such a gradient is copied once, which is rare)."""
    g = p.grad
    if not _readable(g, dtype):
        g = g.to(dtype=dtype, memory_format=torch.contiguous_format, copy=True)
        p.grad = g
    return g


def _readable(g: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether the kernel's vector loads can read `g` as it is."""
    return g.dtype == dtype and g.is_contiguous() and g.data_ptr() % _ALIGN_BYTES == 0
