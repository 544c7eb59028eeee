"""The memory layers as PyTorch modules: gradients, state, optimisers, bad arguments."""

import copy
import io

import pytest
import torch

import lethe
from helpers import copies

D, HEADS, BLOCK = 8, 2, 4

# Each layer small enough for gradcheck, its memory full after BLOCKS blocks: the
# Compressive Transformer has compressed, the ∞-former absorbed into its long-term memory.
LAYERS = {
    "xl": lambda: lethe.TransformerXL(D, HEADS, span=8, block=BLOCK),
    "expire": lambda: lethe.ExpireSpan(D, HEADS, max_span=16, ramp=4, init_fraction=0.5, block=BLOCK),
    "adaptive": lambda: lethe.AdaptiveSpan(D, HEADS, max_span=8, ramp=4, block=BLOCK),
    "compressive": lambda: lethe.Compressive(D, HEADS, span=8, slots=4, rate=2, block=BLOCK),
    "infinity": lambda: lethe.InfinityFormer(D, HEADS, span=4, basis=8, threshold=4, block=BLOCK),
}
BLOCKS = 5


def make(kind, dtype=torch.float64, seed=0):
    """A layer whose learned spans sit between the soft masks' kinks: they start at a
    whole number of positions, where the mask (a clamp) has no derivative."""
    torch.manual_seed(seed)
    layer = LAYERS[kind]().to(dtype)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.startswith(("expire.", "adaptive.")):
                p.add_(0.05 * torch.rand_like(p))
    return layer


def warm(layer, dtype=torch.float64, seed=1, batch=2):
    """The layer's state after BLOCKS blocks of random input."""
    g = torch.Generator().manual_seed(seed)
    state = None
    for _ in range(BLOCKS):
        _, state = layer(torch.randn(batch, BLOCK, D, generator=g, dtype=dtype), state)
    return state


def test_the_guide_example_runs():
    torch.manual_seed(0)
    layer = lethe.ExpireSpan(d_model=64, heads=4, max_span=256)
    x = torch.randn(2, 16, 64, requires_grad=True)
    y, state = layer(x)
    y, state = layer(x, state)
    y.sum().backward()
    assert y.shape == (2, 16, 64)
    assert x.grad is not None and x.grad.abs().sum() > 0
    for name, p in layer.named_parameters():
        assert isinstance(p, torch.nn.Parameter)
        assert p.grad is not None, name
    # The second block saw the first: 32 memories held.
    assert dict(state.tensors)["cache"].shape[1] == 32


@pytest.mark.parametrize("kind", LAYERS)
def test_the_memory_is_full_after_the_warm_up(kind):
    state = warm(make(kind))
    held = dict(state.tensors)
    if kind == "compressive":
        assert held["compressed"].shape[1] > 0
    if kind == "infinity":
        assert int(held["absorbed"]) > 0


@pytest.mark.parametrize("kind", LAYERS)
def test_gradcheck_of_the_input(kind):
    layer = make(kind)
    state = warm(layer)
    x = torch.randn(2, BLOCK, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2), requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: layer(x, state)[0], (x,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", LAYERS)
def test_parameter_gradients_equal_central_differences(kind):
    layer = make(kind)
    state = warm(layer)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, BLOCK, D, dtype=torch.float64, generator=g)
    w = torch.randn(2, BLOCK, D, dtype=torch.float64, generator=g)
    layer.train()  # the auxiliary losses are training's

    def loss():
        y, _ = layer(x, state)
        return (y * w).sum() + layer.aux_loss

    layer.zero_grad()
    loss().backward()
    eps = 1e-6
    for name, p in layer.named_parameters():
        for at in torch.randint(0, p.numel(), (2,), generator=g).tolist():
            flat = p.data.view(-1)
            kept = flat[at].item()
            with torch.no_grad():
                flat[at] = kept + eps
                up = loss().item()
                flat[at] = kept - eps
                down = loss().item()
                flat[at] = kept
            numeric = (up - down) / (2 * eps)
            analytic = p.grad.view(-1)[at].item()
            assert abs(numeric - analytic) <= 1e-5 + 1e-4 * abs(numeric), f"{name}[{at}]: {analytic} vs {numeric}"


@pytest.mark.parametrize("kind", LAYERS)
def test_a_state_is_a_value(kind):
    layer = make(kind, torch.float32)
    state = warm(layer, torch.float32)
    x = torch.randn(2, BLOCK, D, generator=torch.Generator().manual_seed(4))
    y1, after1 = layer(x, state)
    y2, after2 = layer(x, state)  # the same state again: untouched by the first call
    assert torch.equal(y1, y2) and after1 == after2
    y0, _ = layer(x)
    assert not torch.allclose(y0, y1), "the memory changed nothing"


@pytest.mark.parametrize("kind", LAYERS)
def test_the_state_round_trips_through_torch_save(kind):
    layer = make(kind, torch.float32)
    state = warm(layer, torch.float32)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)  # weights_only, torch's default
    assert loaded == state
    x = torch.randn(2, BLOCK, D, generator=torch.Generator().manual_seed(5))
    assert torch.equal(layer(x, loaded)[0], layer(x, state)[0])


@pytest.mark.parametrize("kind", LAYERS)
def test_an_optimiser_step_changes_what_the_layer_computes(kind):
    layer = make(kind, torch.float32)
    state = warm(layer, torch.float32)
    x = torch.randn(2, BLOCK, D, generator=torch.Generator().manual_seed(6))
    before, _ = layer(x, state)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    (before.square().sum() + layer.aux_loss).backward()
    opt.step()
    after, _ = layer(x, state)
    assert not torch.allclose(before, after)
    # A second layer given the stepped weights computes the same.
    twin = make(kind, torch.float32, seed=99)
    twin.load_state_dict(layer.state_dict())
    assert torch.equal(twin(x, state)[0], after)


@pytest.mark.parametrize("kind", LAYERS)
def test_a_copy_computes_what_the_layer_computes_and_learns_apart(kind):
    layer = make(kind, torch.float32)
    state = warm(layer, torch.float32)
    x = torch.randn(2, BLOCK, D, generator=torch.Generator().manual_seed(7))
    want, _ = layer(x, state)
    for how, twin in copies(layer).items():
        assert type(twin) is type(layer), how
        got, after = twin(x, state)  # the layer's state: a copy is the same kind of layer
        assert torch.equal(got, want), how
        # The copy's parameters are its own, and the very tensors it computes with:
        # a step on them changes what the copy computes and leaves the layer as it was.
        opt = torch.optim.SGD(twin.parameters(), lr=0.1)
        (got.square().sum() + twin.aux_loss).backward()
        assert all(p.grad is not None for p in twin.parameters()), how
        assert all(p.grad is None for p in layer.parameters()), how
        opt.step()
        assert not torch.allclose(twin(x, state)[0], want), how
        assert torch.equal(layer(x, state)[0], want), how


def test_a_copy_keeps_the_dtype_mode_and_frozen_parameters():
    layer = make("expire", torch.float64).eval()
    layer.key_pe.requires_grad_(False)
    state = warm(layer)
    x = torch.randn(2, BLOCK, D, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    for how, twin in copies(layer).items():
        assert not twin.training, how
        assert twin.key_pe.dtype == torch.float64 and not twin.key_pe.requires_grad, how
        assert twin.q.weight.requires_grad, how
        assert torch.equal(twin(x, state)[0], layer(x, state)[0]), how


def test_copying_a_layer_leaves_the_random_stream_where_it_was():
    layer = make("infinity", torch.float32)
    torch.manual_seed(3)
    want = torch.rand(4)
    torch.manual_seed(3)
    copies(layer)
    assert torch.equal(torch.rand(4), want)


def test_state_dict_keys_are_lethes_parameter_names():
    keys = set(make("expire").state_dict())
    assert {"q.weight", "k.weight", "v.weight", "o.weight", "key_pe", "expire.w", "expire.b"} == keys


def test_a_state_moves_and_keeps_its_integers():
    state = warm(make("expire"))
    single = state.to(torch.float32)
    held = dict(single.tensors)
    assert held["cache"].dtype == torch.float32
    assert held["valid"].dtype == torch.int64
    assert single.device == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("kind", LAYERS)
def test_on_the_gpu_the_layer_computes_what_it_computes_on_the_cpu(kind):
    layer = make(kind, torch.float32)
    state = warm(layer, torch.float32)
    x = torch.randn(2, BLOCK, D, generator=torch.Generator().manual_seed(7))
    on_cpu, _ = layer(x, state)
    layer.cuda()
    on_gpu, _ = layer(x.cuda(), state.to("cuda"))
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, rtol=1e-4, atol=1e-5)


def raises(kind, call, *words):
    with pytest.raises(kind) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message.strip(), message
    for w in words:
        assert w in message, message


def test_bad_blocks_are_refused_with_one_line():
    layer = make("xl", torch.float32)
    raises(ValueError, lambda: layer(torch.randn(2, BLOCK, D + 1)), "d_model = 8")
    raises(ValueError, lambda: layer(torch.randn(BLOCK, D)), "(batch, length, d_model")
    raises(ValueError, lambda: layer(torch.randn(2, BLOCK + 1, D)), "block = 4")
    raises(ValueError, lambda: layer(torch.randn(2, 0, D)), "block = 4")
    raises(ValueError, lambda: layer(torch.randn(2, BLOCK, D, dtype=torch.float64)), "dtype")
    raises(TypeError, lambda: layer([[1.0]]), "torch.Tensor")
    raises(ValueError, lambda: layer(torch.randn(2, BLOCK, D, device="meta")), "x: on meta", "CPU or a CUDA GPU")
    raises(ValueError, lambda: layer(torch.randn(2, BLOCK, D).to_sparse()), "x: a torch.sparse_coo", "to_dense")
    on_meta = copy.deepcopy(layer).to("meta")
    raises(ValueError, lambda: on_meta(torch.randn(2, BLOCK, D, device="meta")), "x: on meta")
    y, _ = layer(torch.randn(2, BLOCK, D))  # still usable after every refusal
    assert y.shape == (2, BLOCK, D)


def test_bad_states_are_refused_with_one_line():
    xl, expire = make("xl", torch.float32), make("expire", torch.float32)
    x = torch.randn(2, BLOCK, D)
    _, from_xl = xl(x)
    raises(ValueError, lambda: expire(x, from_xl), "made by TransformerXL")
    raises(ValueError, lambda: xl(torch.randn(3, BLOCK, D), from_xl), "3")
    raises(TypeError, lambda: xl(x, {"cache": x}), "lethe.State")
    other = lethe.TransformerXL(D, HEADS, span=16, block=BLOCK)
    raises(ValueError, lambda: other(x, from_xl), "made by")
    # A state converted or moved away from the block is named, in torch's words.
    raises(ValueError, lambda: xl(x, from_xl.to(torch.float64)), "`cache` is torch.float64", "as torch.float32")
    raises(ValueError, lambda: xl(x, from_xl.to("meta")), "`cache` is on meta, the block on cpu")
    raises(ValueError, lambda: from_xl.to(torch.int32), "State.to", "torch.int32", "floating-point")
    # Tensors of another width, in a state put together by hand (before: libtorch's
    # "Sizes of tensors must match" from inside the concatenation).
    for layer, (_, made) in ((xl, xl(x)), (expire, expire(x))):
        wider = lethe.State(made.owner, [(n, torch.zeros(*t.shape[:2], D + 1) if t.dim() == 3 else t) for n, t in made.tensors])
        raises(ValueError, lambda: layer(x, wider), "`cache` holds states of width %d" % (D + 1), "d_model is %d" % D)
    # Whole numbers as states, to a module that has made none yet (before: accepted).
    integers = lethe.State(from_xl.owner, [("cache", torch.zeros(2, 4, D, dtype=torch.long))])
    raises(ValueError, lambda: make("xl", torch.float32)(x, integers), "`cache` is Int64", "floating point")


def test_bad_settings_are_refused_with_one_line():
    raises(ValueError, lambda: lethe.TransformerXL(D, 3, span=8), "heads = 3")
    raises(ValueError, lambda: lethe.TransformerXL(D, HEADS, span=0), "span")
    raises(ValueError, lambda: lethe.ExpireSpan(D, HEADS, max_span=8, ramp=4, colour="red"), "colour")
    raises(ValueError, lambda: lethe.ExpireSpan(D, HEADS, max_span=8, alpha=-1.0), "alpha")
    raises(ValueError, lambda: lethe.TransformerXL(D, HEADS, span=8, dropout=1.5), "dropout")
    raises(ValueError, lambda: lethe.ExpireSpan(D, HEADS, max_span=8, alpha=float("nan")), "alpha = nan", "finite")
    raises(ValueError, lambda: lethe.TransformerXL(10**9, 1, span=8), "d_model = 1000000000", "GiB")
    raises(ValueError, lambda: lethe.TransformerXL(D, HEADS, span=10**12), "span = 1000000000000", "GiB")
