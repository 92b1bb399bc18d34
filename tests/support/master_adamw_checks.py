"""MasterAdamW against torch's AdamW on a three-layer model, shared by the torch and Triton kernels' tests."""

import torch

from mimo.perf.master_adamw import MasterAdamW


def step_both(*optimizers) -> None:
    """One step of each optimizer, then its gradients cleared."""
    for opt in optimizers:
        opt.step()
        opt.zero_grad()


def _three_layer_twins(inputs: int = 8) -> tuple[torch.nn.Sequential, torch.nn.Sequential]:
    """Two copies of one seeded inputs-5-3-2 stack of linears: torch's AdamW trains one, MasterAdamW the other."""
    torch.manual_seed(0)

    def layers() -> torch.nn.Sequential:
        return torch.nn.Sequential(torch.nn.Linear(inputs, 5), torch.nn.Linear(5, 3), torch.nn.Linear(3, 2))

    ref, fast = layers(), layers()
    fast.load_state_dict(ref.state_dict())
    return ref, fast


def check_accumulated_hand_set_and_missing_gradients(inputs: int = 8, atol: float = 1e-5, **opt_kwargs) -> None:
    """Two backward passes before a step add up; a gradient assigned by hand counts (also a strided one, and
    one that starts off alignment in its storage); a parameter that had a gradient in the first step and
    none after is skipped, as torch's AdamW skips it (without fresh_grads its gradient is its zeroed view: it
    steps on zeros, as torch's AdamW after zero_grad(set_to_none=False)). Also run in Triton's interpreter with
    grad_table (tests/unit/test_adamw_triton.py)."""
    ref, fast = _three_layer_twins(inputs)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    opt = MasterAdamW(fast.parameters(), lr=1e-2, weight_decay=0.1, dtype=torch.float32, **opt_kwargs)
    for step in range(3):
        for _micro in range(2):  # micro-batches: the second backward adds into the first's gradients
            x = torch.randn(6, inputs)
            for model in (ref, fast):
                h = model[1](model[0](x))
                (model[2](h) if step == 0 else h).square().sum().backward()  # model[2]: first step only
        hand, shifted = torch.randn(5, 3), torch.randn(4)
        ref[1].weight.grad, fast[1].weight.grad = hand.t().contiguous(), hand.clone().t()
        ref[1].bias.grad, fast[1].bias.grad = shifted[1:].clone(), shifted.clone()[1:]
        if step > 0 and not opt.fresh_grads:  # layer 2's gradient is its zeroed view, as zero_grad(set_to_none=False)
            for p in ref[2].parameters():
                p.grad = torch.zeros_like(p)
        step_both(opt_ref, opt)
        assert all((p.grad is None) == opt.fresh_grads for p in fast[:2].parameters())
    for a, b in zip(ref.parameters(), fast.parameters()):
        torch.testing.assert_close(b, a, rtol=1.3e-6, atol=atol)


def check_parameters_without_gradients_are_skipped(inputs: int = 8, atol: float = 1e-5, **opt_kwargs) -> None:
    """Layers left out of some steps (layer 0 in step 1, layer 2 in step 2) keep their weights, moments and step
    counts there, exactly, as torch's AdamW keeps them; in step 3 every layer has taken a different number of
    updates, and each is bias-corrected by its own count, as torch's AdamW does. Also run in Triton's interpreter
    with grad_table (tests/unit/test_adamw_triton.py)."""
    ref, fast = _three_layer_twins(inputs)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, betas=(0.8, 0.9), weight_decay=0.1)
    opt = MasterAdamW(fast.parameters(), lr=1e-2, betas=(0.8, 0.9), weight_decay=0.1, dtype=torch.float32,
                      **opt_kwargs)
    used = [(0, 1, 2), (1, 2), (0, 1), (0, 1, 2)]  # consecutive layers, run in turn
    for step, layers in enumerate(used):
        x = torch.randn(6, inputs if layers[0] == 0 else 5)
        for model in (ref, fast):
            h = x
            for i in layers:
                h = model[i](h)
            h.square().sum().backward()
            for i in set(range(3)) - set(layers):  # as the trainer leaves an unfed module (fresh_grads=False: views)
                for p in model[i].parameters():
                    p.grad = None
        before = [p.detach().clone() for p in fast.parameters()]
        step_both(opt_ref, opt)
        for i in set(range(3)) - set(layers):
            assert all(torch.equal(p, b) for p, b in zip(fast[i].parameters(), before[2 * i:2 * i + 2])), (step, i)
        assert opt.steps.tolist() == [float(opt_ref.state[p]["step"]) for p in ref.parameters()], step
        for a, b in zip(ref.parameters(), fast.parameters()):
            torch.testing.assert_close(b, a, rtol=1.3e-6, atol=atol)
