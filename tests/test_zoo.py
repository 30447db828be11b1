"""Every zoo model builds, trains, is deterministic for a seed, and captures as one graph."""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from remat import models as zoo

TRANSFORMERS_MODELS = {"gpt2", "distill", "bert", "vit", "llama", "t5"}
REQUIRED = ["mlp", "cnn_bn", "dropout_mlp", "inplace_views", "tied", "two_outputs", "resnet", "gpt2",
            "vgg11", "vgg16", "resnet18", "resnet50", "mobilenet", "unet"]


def tiny(name, seed=0):
    if name in TRANSFORMERS_MODELS:
        pytest.importorskip("transformers")
    return zoo.build(name, size="tiny", seed=seed)


def run(ex, model=None, rng_seed=123):
    """Forward+backward under a fixed RNG (dropout); returns the loss and the gradients."""
    model = ex.model if model is None else model
    ex.model.zero_grad(set_to_none=True)
    torch.manual_seed(rng_seed)
    loss = ex.loss(model(*ex.args, **ex.kwargs))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in ex.model.named_parameters() if p.grad is not None}
    ex.model.zero_grad(set_to_none=True)
    return loss.detach(), grads


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models gain nothing from threads, and lose a lot when other processes share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_names():
    got = zoo.names()
    assert len(got) == len(set(got))
    for name in REQUIRED:
        assert name in got


@pytest.mark.parametrize("name", zoo.names())
def test_tiny_trains(name):
    ex = tiny(name)
    assert ex.name == name and ex.model.training
    assert isinstance(ex.args, tuple) and isinstance(ex.kwargs, dict)
    loss, grads = run(ex)
    assert loss.dim() == 0 and torch.isfinite(loss)
    params = {n for n, p in ex.model.named_parameters() if p.requires_grad}  # tied weights are listed once
    assert set(grads) == params, f"parameters without a gradient: {params - set(grads)}"
    assert all(torch.isfinite(g).all() for g in grads.values())


@pytest.mark.parametrize("name", zoo.names())
def test_deterministic_for_a_seed(name):
    a, b, c = tiny(name), tiny(name), tiny(name, seed=1)
    sa, sb, sc = a.model.state_dict(), b.model.state_dict(), c.model.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert len(a.args) == len(b.args) and a.kwargs.keys() == b.kwargs.keys()
    assert all(torch.equal(x, y) for x, y in zip(a.args, b.args))
    assert all(torch.equal(a.kwargs[k], b.kwargs[k]) for k in a.kwargs)
    (la, ga), (lb, gb) = run(a), run(b)
    assert torch.equal(la, lb)
    assert all(torch.equal(ga[k], gb[k]) for k in ga)


def test_build_leaves_global_rng_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    zoo.build("mlp", size="tiny", seed=3)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("name", zoo.names())
def test_fullgraph_capture_aot(name):
    """Dynamo captures every model as one graph (``fullgraph``, one frame), and AOTAutograd, what
    remat's backend builds on, traces its joint graph: loss and gradients as eager's. (One trace per
    model: a capture with Dynamo's plain ``eager`` backend alone, which this implies, was a second
    test with a second trace.)"""
    ex = tiny(name)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(ex.model, backend=counter, fullgraph=True)
    loss, grads = run(ex, compiled)
    assert counter.frame_count == 1
    ref_loss, ref_grads = run(ex)
    torch.testing.assert_close(loss, ref_loss)
    assert set(grads) == set(ref_grads) == {n for n, p in ex.model.named_parameters() if p.requires_grad}
    for k in ref_grads:
        torch.testing.assert_close(grads[k], ref_grads[k])


def test_two_outputs_loss_is_weighted_sum():
    ex = zoo.build("two_outputs", size="tiny")
    logits, features = ex.model(*ex.args)
    torch.testing.assert_close(ex.loss((logits, features)), logits.sum() + 0.5 * features.sum())


def test_loss_of_scalar_and_tensor():
    ex = zoo.build("mlp", size="tiny")
    t = torch.arange(6.0).reshape(2, 3)
    assert ex.loss(t).item() == 15.0
    assert ex.loss(torch.tensor(2.5)).item() == 2.5


def test_tied_shares_one_parameter():
    model = zoo.build("tied", size="tiny").model
    assert model.lm_head.weight is model.embed.weight


def test_every_size_is_configured():
    for name in zoo.names():
        for size in ("tiny", "small", "medium"):
            assert size in zoo._CONFIGS[name]
    ex = zoo.build("mlp")  # default size is "small"
    assert ex.size == "small" and ex.args[0].shape[0] > zoo.build("mlp", size="tiny").args[0].shape[0]


def test_bad_arguments_say_what_is_allowed():
    with pytest.raises(ValueError, match="mlp"):
        zoo.build("nope")
    with pytest.raises(ValueError, match="tiny"):
        zoo.build("mlp", size="huge")
