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
    none after steps on zeros (weight decay and moments still move), as torch's AdamW does with zeros: its
    view in the flat buffer must not keep the first step's values. Also run in Triton's interpreter with
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
        if step > 0:
            for p in ref[2].parameters():
                p.grad = torch.zeros_like(p)
        step_both(opt_ref, opt)
        assert all((p.grad is None) == opt.fresh_grads for p in fast.parameters())
    for a, b in zip(ref.parameters(), fast.parameters()):
        torch.testing.assert_close(b, a, rtol=1.3e-6, atol=atol)


def check_first_parameters_updated_in_backward(inputs: int = 8, atol: float = 1e-5, **opt_kwargs) -> None:
    """The last two layers' gradients are complete before the first layer's: their update starts in the hook
    of the last of them (inside backward) and the result is torch's AdamW after backward. In the step where
    layer 2 is not used, the group never completes and step() updates it (layer 2 on zeros). Also run in
    Triton's interpreter with grad_table (tests/unit/test_adamw_triton.py)."""
    ref, fast = _three_layer_twins(inputs)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    opt = MasterAdamW(fast.parameters(), lr=1e-2, weight_decay=0.1, dtype=torch.float32,
                      first=[*fast[1].parameters(), *fast[2].parameters()], **opt_kwargs)
    assert opt.params[0] is fast[1].weight  # the first parameters lead the flat buffers
    for step in range(3):
        x = torch.randn(6, inputs)
        for model in (ref, fast):
            h = model[1](model[0](x))
            (model[2](h) if step != 1 else h).square().sum().backward()
        if step == 1:
            for p in ref[2].parameters():
                p.grad = torch.zeros_like(p)
        assert opt.launched == (step != 1)
        step_both(opt_ref, opt)
        for a, b in zip(ref.parameters(), fast.parameters()):
            torch.testing.assert_close(b, a, rtol=1.3e-6, atol=atol)
