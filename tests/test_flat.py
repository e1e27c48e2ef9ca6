"""Flat parameter buffers on real torch models (CPU; CUDA when a device exists)."""

import copy

import pytest
import torch

from wagma.flat import FlatParameters


class MixedNet(torch.nn.Module):
    """Linear layers, a BatchNorm, a tied weight and a float64 parameter."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 6)
        self.hidden = torch.nn.Linear(6, 8)
        self.norm = torch.nn.BatchNorm1d(8)
        self.out = torch.nn.Linear(8, 10, bias=False)
        self.out.weight = torch.nn.Parameter(torch.randn(10, 8))
        self.scale = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
        self.tied = self.hidden  # the same parameters reachable twice

    def forward(self, tokens):
        x = torch.relu(self.norm(self.hidden(self.embed(tokens))))
        return self.out(x) * self.scale.sum().float()


def _model(device="cpu"):
    torch.manual_seed(0)
    return MixedNet().to(device)


def test_parameters_become_views_with_their_values():
    model = _model()
    before = copy.deepcopy(model.state_dict())
    flat = FlatParameters(model)
    # dtypes in order of first appearance; a module's own parameters come
    # before its children's, so the root's float64 ``scale`` is first.
    assert list(flat.params) == [torch.float64, torch.float32]
    assert flat.numel == sum(p.numel() for p in model.parameters())
    for name, value in before.items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=0)
    flat.check_views()
    # Writing the flat buffer is writing the model.
    flat.params[torch.float64].fill_(2.0)
    assert torch.equal(model.scale, torch.full((3,), 2.0, dtype=torch.float64))
    assert "float32" in repr(flat) and "BatchNorm" not in repr(flat)
    assert set(flat.buffers) == {"norm.running_mean", "norm.running_var", "norm.num_batches_tracked"}


def test_backward_fills_the_flat_gradients_and_training_works():
    model, reference = _model(), _model()
    flat = FlatParameters(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    tokens = torch.randint(0, 10, (16,))
    target = torch.randint(0, 10, (16,))
    for _ in range(3):
        for net, opt in ((model, optimizer), (reference, reference_optimizer)):
            loss = torch.nn.functional.cross_entropy(net(tokens), target)
            loss.backward()
            opt.step()
        flat.check_views()
        assert flat.grads[torch.float32].abs().sum() > 0
        flat.zero_grad()
        reference_optimizer.zero_grad()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, msg=name)
    flat.check_views()


def test_rebind_moves_the_model_and_keeps_training_equal():
    # Rebinding to a copy of the buffers every step (what the wait-avoiding
    # collective's double buffering does) trains exactly like not rebinding.
    model, reference = _model(), _model()
    flat = FlatParameters(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    tokens, target = torch.randint(0, 10, (16,)), torch.randint(0, 10, (16,))
    for _ in range(3):
        for net, opt in ((model, optimizer), (reference, reference_optimizer)):
            torch.nn.functional.cross_entropy(net(tokens), target).backward()
            opt.step()
        old = flat.params[torch.float32]
        flat.rebind(torch.float32, params=old.clone(), grads=flat.grads[torch.float32].clone())
        old.fill_(float("nan"))  # the old buffer is no longer the model
        flat.check_views()
        flat.zero_grad()
        reference_optimizer.zero_grad()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, msg=name)
    with pytest.raises(ValueError, match="rebind needs a contiguous torch.float32 tensor of"):
        flat.rebind(torch.float32, params=torch.zeros(3))
    with pytest.raises(ValueError, match="rebind needs"):
        flat.rebind(torch.float64, params=torch.zeros(3, dtype=torch.float32))


def test_gradients_set_to_none_are_caught_and_reattached():
    model = _model()
    flat = FlatParameters(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens = torch.randint(0, 10, (8,))
    model(tokens).sum().backward()
    optimizer.zero_grad()  # set_to_none=True: views are gone
    model(tokens).sum().backward()  # fresh tensors, not views
    with pytest.raises(RuntimeError, match="is not a view of the flat buffer"):
        flat.check_views()
    expected = [p.grad.clone() for p in model.parameters()]
    flat.attach_grads()
    flat.check_views()
    for p, g in zip(model.parameters(), expected):
        assert torch.equal(p.grad, g)


def test_replaced_parameter_is_named():
    model = _model()
    flat = FlatParameters(model)
    model.hidden.bias.data = torch.zeros(8)
    with pytest.raises(RuntimeError, match="parameter hidden.bias no longer views"):
        flat.check_views()


def test_frozen_parameters_stay_out_of_the_flat_buffers():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model[0].requires_grad_(False)
    frozen = [p.detach().clone() for p in model[0].parameters()]
    storage = [p.data_ptr() for p in model[0].parameters()]
    flat = FlatParameters(model)
    assert flat.numel == 4 * 2 + 2 and len(flat.parameters) == 2
    assert [p.data_ptr() for p in model[0].parameters()] == storage  # their own storage
    model(torch.randn(5, 3)).sum().backward()
    flat.attach_grads()
    flat.zero_grad()
    assert all(p.grad is None for p in model[0].parameters())
    assert all(torch.equal(p, q) for p, q in zip(model[0].parameters(), frozen))


def test_bad_modules_are_refused():
    with pytest.raises(ValueError, match="module has no trainable parameters"):
        FlatParameters(torch.nn.ReLU())
    with pytest.raises(ValueError, match="module has no trainable parameters"):
        FlatParameters(torch.nn.Linear(2, 2).requires_grad_(False))
    two = torch.nn.ParameterList([torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2, device="meta"))])
    with pytest.raises(ValueError, match="parameters must all be on one device, got cpu, meta"):
        FlatParameters(two)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_flat_buffers_stay_on_the_device():
    model = _model("cuda")
    flat = FlatParameters(model)
    assert all(t.is_cuda for t in flat.params.values())
    model(torch.randint(0, 10, (8,), device="cuda")).sum().backward()
    flat.check_views()
    assert all(t.is_cuda and t.abs().sum() > 0 for t in flat.grads.values())
