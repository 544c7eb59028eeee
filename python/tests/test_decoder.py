"""A pretrained decoder from Python: `lethe.Decoder` under each key-value cache policy and
`lethe.load` of a Hugging Face folder, against the logits `transformers` computed for
the fixtures (tests/fixtures/llama/*/expected.safetensors)."""

import io
import pickle
import json
import pathlib
import struct

import pytest
import torch

import lethe
from helpers import lethe_cli, needs_binary

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "llama"
FAMILIES = ["llama3", "mistral", "qwen2", "qwen3", "smollm2"]


def read_safetensors(path):
    """The tensors of a safetensors file (its format: a little-endian u64 header length,
    the JSON header, the raw data)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    dtypes = {"F32": torch.float32, "I64": torch.int64, "F64": torch.float64, "I32": torch.int32}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        data = bytearray(raw[8 + n + start : 8 + n + end])
        out[name] = torch.frombuffer(data, dtype=dtypes[info["dtype"]]).reshape(info["shape"])
    return out


def expected(family):
    return read_safetensors(FIXTURES / family / "expected.safetensors")


def close(got, want, family):
    scale = want.abs().max().item()
    gap = (got - want).abs().max().item()
    assert gap <= 1e-4 * scale, f"{family}: logits differ by {gap} (scale {scale})"


@pytest.mark.parametrize("family", FAMILIES)
def test_the_decoder_computes_what_transformers_computes(family):
    want = expected(family)
    decoder = lethe.Decoder(FIXTURES / family)
    close(decoder(want["ids"], decoder.cache()), want["logits"], family)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype, name", [(torch.bfloat16, "bf16"), (torch.float16, "f16")])
def test_in_half_precision_the_decoder_computes_what_transformers_computes_in_it(family, dtype, name):
    """Read in bfloat16 or float16 (``dtype=``), the decoder gives the logits
    ``transformers`` gives in that precision (tests/fixtures/llama/*/expected-bf16 and
    -f16, its sdpa attention for a prompt, its eager one token by token): on average
    within a quarter of the distance between its half-precision and float32 logits, the
    logits in float32."""
    want, theirs = expected(family), read_safetensors(FIXTURES / family / f"expected-{name}.safetensors")
    decoder = lethe.Decoder(FIXTURES / family, dtype=dtype)
    assert decoder.dtype == dtype
    prompt = decoder(want["ids"], decoder.cache())
    cache = decoder.cache()
    steps = torch.cat([decoder(want["ids"][:, t : t + 1], cache) for t in range(want["ids"].shape[1])], dim=1)
    for got, key in [(prompt, "logits_sdpa"), (steps, "logits")]:
        assert got.dtype == torch.float32
        rounding = (theirs[key] - want["logits"]).abs().mean().item()
        off = (got - theirs[key]).abs().mean().item()
        assert off < 0.25 * rounding, f"{family} in {name} ({key}): {off:.2e} from transformers, rounding {rounding:.2e}"


def test_a_bfloat16_cache_pickles_and_a_float32_decoder_refuses_it():
    """A decoder in bfloat16 holds its cache in bfloat16 (fewer bytes than float32's for
    the same entries); pickled and loaded, the cache reads on as the original; a decoder
    in float32 refuses it in one line naming the two precisions."""
    half, single = lethe.Decoder(FIXTURES / "llama3", dtype=torch.bfloat16), lethe.Decoder(FIXTURES / "llama3")
    ids = expected("llama3")["ids"]
    cache, same = half.cache("h2o", budget=8), single.cache("h2o", budget=8)
    half(ids[:, :12], cache)
    single(ids[:, :12], same)
    assert cache.entries() == same.entries() and cache.nbytes() < same.nbytes(), (cache.nbytes(), same.nbytes())
    loaded = pickle.loads(pickle.dumps(cache))
    for t in range(12, 20):
        assert torch.equal(half(ids[:, t : t + 1], loaded), half(ids[:, t : t + 1], cache)), t
    with pytest.raises(ValueError, match="holds `layers.0.keys` in bf16, the model computes in f32"):
        single(ids[:, :1], cache)


# Mistral's sliding window is the decoder's alone (lethe's trainable Llama refuses it).
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "mistral"])
def test_load_of_a_hugging_face_folder_computes_what_transformers_computes(family):
    want = expected(family)
    model = lethe.load(FIXTURES / family).eval()
    ids = want["ids"][:, : model.block]
    with torch.no_grad():
        logits, _ = model(ids)
    close(logits, want["logits"][:, : ids.shape[1]], family)


def test_a_copy_of_a_hugging_face_model_keeps_its_tokenizer_and_weights(tmp_path):
    """The copy is made from the model alone: the folder is gone when it is made."""
    import copy
    import shutil

    folder = tmp_path / "smollm2"
    shutil.copytree(FIXTURES / "smollm2", folder)
    model = lethe.load(folder).eval()
    shutil.rmtree(folder)
    twin = copy.deepcopy(model)
    text = "a stream of tokens, kept and forgotten"
    assert twin.encode(text) == model.encode(text) and len(model.encode(text)) < len(text.encode())
    ids = torch.tensor([model.encode(text)])
    with torch.no_grad():
        assert torch.equal(twin(ids)[0], model(ids)[0])


def test_load_refuses_mistrals_sliding_window_in_one_line():
    with pytest.raises(ValueError, match="sliding_window") as caught:
        lethe.load(FIXTURES / "mistral")
    assert "\n" not in str(caught.value)


def test_token_by_token_equals_one_block_on_the_full_cache():
    want = expected("llama3")
    decoder = lethe.Decoder(FIXTURES / "llama3")
    cache = decoder.cache()
    steps = [decoder(want["ids"][:, t : t + 1], cache) for t in range(want["ids"].shape[1])]
    close(torch.cat(steps, dim=1), want["logits"], "llama3")
    assert cache.position() == want["ids"].shape[1]


@pytest.mark.parametrize("policy", ["window", "streaming", "h2o", "tova", "snapkv:window=4"])
def test_a_policy_keeps_its_budget(policy):
    want = expected("llama3")
    decoder = lethe.Decoder(FIXTURES / "llama3")
    ids = want["ids"][:, :20]
    cache = decoder.cache(policy, budget=8)
    for t in range(ids.shape[1]):
        decoder(ids[:, t : t + 1], cache)
    held = cache.entries()
    most = 8 + (4 if policy.startswith("snapkv") else 0)  # SnapKV keeps its window besides
    assert len(held) == 2 and all(0 < n <= most for n in held), held
    # Under a budget that holds every token, the policy is the full cache.
    roomy = decoder.cache(policy, budget=ids.shape[1])
    full = decoder.cache()
    prompt = ids[0, :6].tolist()
    assert decoder.generate(prompt, 8, roomy) == decoder.generate(prompt, 8, full)


@pytest.mark.parametrize("policy", ["full", "window", "streaming", "h2o", "tova", "snapkv:window=6"])
def test_a_copied_cache_reads_on_as_a_cache_that_read_its_continuation_alone(policy):
    """A prompt read once, its cache copied (``copy()``, ``copy.copy``, ``copy.deepcopy``)
    and each copy continued its own way, in turns (a block of 4 each, the original's
    first, then a token each), gives each continuation the logits, the entries and the
    position of a cache that read the prompt and that continuation alone; the original's
    block leaves its copies as they were."""
    import copy

    decoder = lethe.Decoder(FIXTURES / "llama3")
    ids = expected("llama3")["ids"]  # (2, 20)
    budget = None if policy == "full" else 8
    prompt, continuations = ids[:, :10], [ids[:, 10:], ids[:, 2:12], ids[:, 5:15], ids[:, 7:17]]

    def read(cache, tokens):  # a block of 4, then token by token
        block = decoder(tokens[:, :4], cache)
        steps = [decoder(tokens[:, t : t + 1], cache) for t in range(4, tokens.shape[1])]
        return torch.cat([block] + steps, dim=1)

    cache = decoder.cache(policy, budget=budget)
    read(cache, prompt)
    copies = [cache, cache.copy(), copy.copy(cache), copy.deepcopy(cache)]
    held = cache.entries()
    got = [[decoder(continuations[0][:, :4], cache)]]
    assert all(c.entries() == held and c.position() == 10 for c in copies[1:]), policy
    got += [[decoder(tokens[:, :4], each)] for each, tokens in zip(copies[1:], continuations[1:])]
    for t in range(4, 10):
        for each, tokens, logits in zip(copies, continuations, got):
            logits.append(decoder(tokens[:, t : t + 1], each))
    for each, tokens, logits in zip(copies, continuations, got):
        alone = decoder.cache(policy, budget=budget)
        read(alone, prompt)
        assert torch.equal(torch.cat(logits, dim=1), read(alone, tokens)), policy
        assert each.entries() == alone.entries() and each.position() == alone.position() == 20, policy
    assert repr(copies[1]) == repr(cache), (repr(copies[1]), repr(cache))


@pytest.mark.parametrize("policy", ["full", "window", "streaming", "h2o", "tova", "snapkv:window=6"])
def test_a_pickled_cache_reads_on_as_the_original(policy):
    """A cache saved with ``torch.save`` (or ``pickle``) and loaded reads on as the
    original does, token by token, what its policy keeps about the entries included; the
    file holds the entries, not the spare room of the cache's buffers."""
    decoder = lethe.Decoder(FIXTURES / "llama3")
    ids = expected("llama3")["ids"]  # (2, 20)
    budget = None if policy == "full" else 8
    cache = decoder.cache(policy, budget=budget)
    decoder(ids[:, :6], cache)
    for t in range(6, 10):
        decoder(ids[:, t : t + 1], cache)
    buffer = io.BytesIO()
    torch.save(cache, buffer)
    assert len(buffer.getvalue()) < 2 * cache.nbytes() + 16384, (len(buffer.getvalue()), cache.nbytes())
    loaded = [torch.load(io.BytesIO(buffer.getvalue()), weights_only=False), pickle.loads(pickle.dumps(cache))]
    for each in loaded:
        assert repr(each) == repr(cache) and each.nbytes() == cache.nbytes(), (repr(each), repr(cache))
    for t in range(10, 20):
        want = decoder(ids[:, t : t + 1], cache)
        for each in loaded:
            assert torch.equal(decoder(ids[:, t : t + 1], each), want), (policy, t)
    assert all(each.entries() == cache.entries() for each in loaded), policy


def test_a_cache_of_another_model_is_refused():
    llama3, qwen3 = lethe.Decoder(FIXTURES / "llama3"), lethe.Decoder(FIXTURES / "qwen3")
    cache = llama3.cache("window", budget=4)
    llama3(torch.tensor([[1, 2, 3]]), cache)
    with pytest.raises(ValueError, match="width 8, the model 2 of width 16 \\(a cache of another model\\)"):
        qwen3(torch.tensor([[4]]), cache)
    # Another model of the very same shape (Mistral's fixture beside Llama 3's): before,
    # its keys and values were read on as if the model's own.
    mistral = lethe.Decoder(FIXTURES / "mistral")
    for each in (cache, cache.copy(), pickle.loads(pickle.dumps(cache))):
        with pytest.raises(ValueError, match="cache: holds what another model read .*a cache of another model"):
            mistral(torch.tensor([[4]]), each)
    # The same folder read again is the same model; an empty cache is anyone's.
    again = lethe.Decoder(FIXTURES / "llama3")
    assert torch.equal(again(torch.tensor([[4]]), cache.copy()), llama3(torch.tensor([[4]]), cache.copy()))
    assert mistral(torch.tensor([[4]]), mistral.cache("window", budget=4)).shape == (1, 1, mistral.vocab)


def test_bad_arguments_are_refused_with_one_line():
    decoder = lethe.Decoder(FIXTURES / "llama3")
    for call, kind, words in [
        (lambda: decoder.cache("lru", budget=8), ValueError, "unknown"),
        (lambda: decoder.cache("full", budget=8), ValueError, "keeps every entry"),
        (lambda: decoder.cache("h2o"), ValueError, "needs"),
        (lambda: decoder.cache("h2o", budget=0), ValueError, "at least one"),
        (lambda: decoder(torch.zeros(1, 4), decoder.cache()), ValueError, "int64"),
        (lambda: decoder(torch.zeros(1, 4, dtype=torch.int32), decoder.cache()), ValueError, "got torch.int32"),
        (lambda: decoder.cache("h2o", budget=True), TypeError, "budget: expected a whole number"),
        (lambda: decoder(torch.tensor([[decoder.vocab]]), decoder.cache()), ValueError, "vocabulary"),
        (lambda: decoder([[1, 2]], decoder.cache()), TypeError, "torch.Tensor"),
        (lambda: decoder(torch.tensor([[1, 2]]).to_sparse(), decoder.cache()), ValueError, "ids: a torch.sparse_coo"),
        (lambda: decoder(torch.tensor([[1, 2]], device="meta"), decoder.cache()), ValueError, "ids: on meta"),
        (lambda: decoder._decoder.forward(torch.tensor([[1, 2]]).to_sparse(), decoder.cache()), RuntimeError, "Sparse"),
        (lambda: lethe.Decoder(FIXTURES), ValueError, "config.json"),
        (lambda: lethe.Decoder(FIXTURES / "llama3", device="cuda:7"), ValueError, "no such GPU"),
        (lambda: lethe.Decoder(FIXTURES / "llama3", device="tpu"), ValueError, "device: "),
        (lambda: lethe.Decoder(FIXTURES / "llama3", dtype=torch.int8), ValueError, "dtype: torch.int8"),
        (lambda: lethe.Decoder(FIXTURES / "llama3", dtype="bfloat16"), ValueError, "dtype: 'bfloat16'"),
        (lambda: decoder.generate([1], -1, decoder.cache()), ValueError, "count must be a whole number"),
        (lambda: decoder.generate([], 2, decoder.cache()), ValueError, "at least one token"),
        (lambda: decoder.generate([decoder.vocab], 2, decoder.cache()), ValueError, "outside the vocabulary"),
        (lambda: decoder.generate([1], 2, decoder.cache(), temperature=-1.0), ValueError, "temperature"),
        (lambda: decoder.generate([1], 2, decoder.cache(), top_p=0.0), ValueError, "top_p"),
        (lambda: decoder.decode([decoder.vocab]), ValueError, "outside the vocabulary"),
        # Whole numbers out of range, named (before: Python's OverflowError, naming none).
        (lambda: decoder.cache("h2o", budget=2**63), ValueError, "budget = 9223372036854775808: must be from 0"),
        (lambda: decoder.generate([1], 2, decoder.cache(), top_k=-1), ValueError, "top_k = -1: must be from 0"),
        (lambda: decoder.generate([1], 2, decoder.cache(), seed=-1), ValueError, "seed = -1: must be from 0"),
        (lambda: decoder.generate([1], 2, decoder.cache(), seed=1.5), TypeError, "seed: expected a whole number"),
    ]:
        with pytest.raises(kind) as caught:
            call()
        message = str(caught.value)
        assert words in message and "\n" not in message.strip(), message
    cache = decoder.cache()
    decoder(torch.tensor([[1, 2, 3]]), cache)
    with pytest.raises(ValueError, match="streams"):
        decoder(torch.tensor([[1], [2]]), cache)
    two = decoder.cache()
    decoder(torch.tensor([[1], [2]]), two)
    with pytest.raises(ValueError, match="holds 2 streams"):
        decoder.generate([1], 2, two)


def test_a_decoder_is_on_the_cpu_unless_asked():
    decoder = lethe.Decoder(FIXTURES / "llama3", device="cpu")
    assert decoder.device == torch.device("cpu") == lethe.Decoder(FIXTURES / "llama3").device
    assert decoder.dtype == torch.float32
    assert decoder(torch.tensor([[1, 2, 3]]), decoder.cache()).device == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("policy", ["full", "h2o", "snapkv:window=6"])
def test_on_the_gpu_the_decoder_computes_what_it_computes_on_the_cpu(policy):
    """The decoder on a GPU gives the CPU's logits, a block then token by token; its cache
    pickles and loads there (``map_location``); ids or a cache on the CPU are refused."""
    on_cpu, on_gpu = lethe.Decoder(FIXTURES / "llama3"), lethe.Decoder(FIXTURES / "llama3", device="cuda")
    assert on_gpu.device.type == "cuda"
    ids = expected("llama3")["ids"]  # (2, 20)
    budget = None if policy == "full" else 8
    here, there = on_cpu.cache(policy, budget=budget), on_gpu.cache(policy, budget=budget)
    want = [on_cpu(ids[:, :6], here)] + [on_cpu(ids[:, t : t + 1], here) for t in range(6, 20)]
    got = [on_gpu(ids[:, :6].cuda(), there)] + [on_gpu(ids[:, t : t + 1].cuda(), there) for t in range(6, 20)]
    torch.testing.assert_close(torch.cat(got, 1).cpu(), torch.cat(want, 1), rtol=1e-4, atol=1e-4)
    assert there.entries() == here.entries()
    buffer = io.BytesIO()
    torch.save(there, buffer)
    loaded = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False, map_location="cuda")
    step = ids[:, :1].cuda()
    assert torch.equal(on_gpu(step, loaded), on_gpu(step, there))
    with pytest.raises(ValueError, match="on cpu, the model runs on cuda"):
        on_gpu(step, here)
    with pytest.raises(ValueError, match="ids: on cpu, the decoder runs on cuda"):
        on_gpu(ids[:, :1], on_gpu.cache())


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """An Expire-Span run fitted onto the llama3 fixture by ``lethe train --init-from``
    (3 steps, the base frozen, largest span 32), another of largest span 24, and a run of
    lethe's own backbone."""
    folder = tmp_path_factory.mktemp("fitted")
    (folder / "text.txt").write_text((FIXTURES / "llama3" / "sample.txt").read_text() * 6)
    sets = ["train.block=8", "train.batch=2", "train.eval_every=0", "train.eval_tokens=64", "train.warmup=1"]
    sets += ["train.freeze_base=true", 'memory.mechanism="expire"', "memory.span=32"]
    args = ["train", "--init-from", str(FIXTURES / "llama3"), "--data", "text.txt", "--steps", "3", "--name", "expire"]
    lethe_cli(*args, *[a for s in sets for a in ("--set", s)], "-q", cwd=folder)
    args[-1], sets[-1] = "wide", "memory.span=24"  # another learned memory on the same model
    lethe_cli(*args, *[a for s in sets for a in ("--set", s)], "-q", cwd=folder)
    lethe_cli("train", "-p", "copy-tiny", "--steps", "1", "--name", "own", "-q", cwd=folder)
    return folder / "runs"


@needs_binary
def test_a_run_s_learned_cache_reads_as_its_training_model(fitted):
    """The decoder of an Expire-Span run, its cache kept by the run's span predictors,
    gives the logits of ``lethe.load(run)`` (the training model, in blocks with its
    memory carried) token by token, and its greedy tokens; under a budget, each layer
    holds at most that many entries, and a copy of the cache reads on as it would."""
    decoder, model = lethe.Decoder(fitted / "expire"), lethe.load(fitted / "expire").eval()
    assert decoder.learned and not lethe.Decoder(FIXTURES / "llama3").learned
    ids = expected("llama3")["ids"][:1]  # (1, 20)
    state, want = None, []
    with torch.no_grad():
        for start in range(0, ids.shape[1], model.block):
            logits, state = model(ids[:, start : start + model.block], state)
            want.append(logits)
    cache = decoder.cache("learned")
    got = torch.cat([decoder(ids[:, t : t + 1], cache) for t in range(ids.shape[1])], dim=1)
    close(got, torch.cat(want, dim=1), "the fitted run")
    prompt = ids[0, :6].tolist()
    assert decoder.generate(prompt, 10, decoder.cache("learned")) == model.generate(prompt, 10)

    capped = decoder.cache("learned", budget=3)
    for t in range(12):
        decoder(ids[:, t : t + 1], capped)
        assert all(n <= 3 for n in capped.entries()), capped.entries()
    fork, rest = capped.copy(), ids[:, 12:]
    alone = decoder.cache("learned", budget=3)
    for t in range(12):
        decoder(ids[:, t : t + 1], alone)
    decoder(rest, capped)  # the original reads on first; the copy is its own
    assert torch.equal(decoder(rest, fork), decoder(rest, alone))
    assert "learned @ 3 entries" in repr(capped), repr(capped)

    # In bfloat16: the run's decoder and its learned cache, to bfloat16's rounding.
    half = lethe.Decoder(fitted / "expire", dtype=torch.bfloat16)
    cache = half.cache("learned")
    got_half = torch.cat([half(ids[:, t : t + 1], cache) for t in range(ids.shape[1])], dim=1)
    off, scale = (got_half - got).abs().max().item(), got.abs().max().item()
    assert 0 < off < 0.05 * scale, f"bf16 differs from f32 by {off} (scale {scale})"


@needs_binary
@pytest.mark.parametrize("budget", [None, 3])
def test_a_pickled_learned_cache_reads_on_as_the_original(fitted, budget):
    """A learned cache saved with ``torch.save`` (or ``pickle``) and loaded keeps the
    spans its run's predictors gave what it holds: read on by the decoder that made it,
    or by another decoder of the same run, it gives the logits and keeps the entries of
    the original, token by token, within the run's budget or one asked for; its copies
    too, before and after their first read."""
    decoder, again = lethe.Decoder(fitted / "expire"), lethe.Decoder(fitted / "expire")
    assert decoder.memory == again.memory and decoder.memory.startswith("crc32 "), (decoder.memory, again.memory)
    assert decoder.memory != lethe.Decoder(fitted / "wide").memory and lethe.Decoder(FIXTURES / "llama3").memory is None
    assert f"learned memory {decoder.memory}, vocab 320, cpu, torch.float32)" in repr(decoder), repr(decoder)
    ids = expected("llama3")["ids"]  # (2, 20)
    cache = decoder.cache("learned", budget=budget)
    decoder(ids[:, :6], cache)
    for t in range(6, 10):
        decoder(ids[:, t : t + 1], cache)
    buffer = io.BytesIO()
    torch.save(cache, buffer)
    loaded = [torch.load(io.BytesIO(buffer.getvalue()), weights_only=False), pickle.loads(pickle.dumps(cache))]
    loaded.append(loaded[0].copy())  # a copy made before the loaded cache is first read
    for each in loaded:
        assert repr(each) == repr(cache) and each.nbytes() == cache.nbytes(), (repr(each), repr(cache))
    readers = [decoder, again, decoder]
    for t in range(10, 20):
        want = decoder(ids[:, t : t + 1], cache)
        for each, reader in zip(loaded, readers):
            assert torch.equal(reader(ids[:, t : t + 1], each), want), (budget, t)
        assert all(each.entries() == cache.entries() for each in loaded), (budget, t, cache.entries())
    if budget is not None:
        assert max(cache.entries()) <= budget, cache.entries()
    again_saved = pickle.loads(pickle.dumps(loaded[1]))  # pickled again after its first read
    assert torch.equal(decoder(ids[:, :1], again_saved), decoder(ids[:, :1], cache))


def damaged(cache):
    """``cache`` pickled with the spans of its first layer cut to two entries, and loaded."""
    make, (policy, budget, state, *rest) = cache.__reduce__()
    state = [(n, t[..., :2] if n == "layers.0.policy.spans" else t) for n, t in state]
    return make(policy, budget, state, *rest)


@needs_binary
def test_a_learned_cache_is_refused_where_there_is_none(fitted):
    folder, run = lethe.Decoder(FIXTURES / "llama3"), lethe.Decoder(fitted / "expire")
    other, half = lethe.Decoder(fitted / "wide"), lethe.Decoder(fitted / "expire", dtype=torch.bfloat16)
    read = run.cache("learned")
    run(torch.tensor([[1, 2, 3]]), read)
    saved = pickle.dumps(read)
    for call, words in [
        (lambda: folder.cache("learned"), "Hugging Face folder"),
        (lambda: run.cache("learned", budget=0), "at least one"),
        (lambda: other(torch.tensor([[1, 2]]), run.cache("learned")), "another run's learned memory (crc32 "),
        (lambda: other(torch.tensor([[4]]), pickle.loads(saved)), "another run's learned memory"),
        (lambda: folder(torch.tensor([[4]]), pickle.loads(saved)), "this decoder reads a Hugging Face folder"),
        (lambda: half(torch.tensor([[4]]), pickle.loads(saved)), "in f32, the model computes in bf16"),
        (lambda: run(torch.tensor([[4]]), damaged(read)), "`layers.0.policy`: `spans`: of shape [1, 1, 2]"),
        (lambda: lethe.Decoder(fitted / "own"), 'model.arch = "lethe"'),
        (lambda: lethe.Decoder(fitted / "nowhere"), "does not exist"),
    ]:
        with pytest.raises(ValueError) as caught:
            call()
        message = str(caught.value)
        assert words in message and "\n" not in message.strip(), message
    # The policies without training read the run's decoder as they read a folder's.
    cache = run.cache("window", budget=4)
    run(torch.tensor([[1, 2, 3, 4, 5, 6]]), cache)
    assert cache.entries() == [4, 4]


def cli_ids(*args):
    """The ids `lethe generate ARGS --print-ids` printed."""
    said = lethe_cli("generate", *args, "--print-ids", cwd=FIXTURES).decode().strip()
    return [int(i) for i in said.split(",")]


@needs_binary
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("policy", ["full", "h2o", "streaming:sinks=2", "snapkv:window=4"])
def test_generate_gives_the_ids_of_lethe_generate(policy, temperature):
    """``Decoder.generate`` under a policy gives the ids ``lethe generate --init-from``
    gives with that policy and budget, greedy and sampled; the cache then holds the
    prompt and every generated token."""
    decoder = lethe.Decoder(FIXTURES / "llama3")
    prompt = [(i * 7 + 3) % 300 for i in range(30)]
    budget = None if policy == "full" else 12
    cache = decoder.cache(policy, budget=budget)
    got = decoder.generate(prompt, 10, cache, temperature=temperature, seed=3)
    args = ["--init-from", "llama3", "--prompt-ids", ",".join(map(str, prompt)), "--tokens", "10"]
    args += ["--temperature", str(temperature), "--seed", "3", "--policy", policy]
    args += [] if budget is None else ["--budget", str(budget)]
    assert got == cli_ids(*args), policy
    most = 40 if budget is None else budget + (4 if policy.startswith("snapkv") else 0)  # SnapKV's window besides
    assert cache.position() == 40 and 0 < max(cache.entries()) <= most, cache


@needs_binary
def test_a_text_prompt_reads_through_the_folder_s_tokenizer():
    decoder = lethe.Decoder(FIXTURES / "llama3")
    text = (FIXTURES / "llama3" / "sample.txt").read_text()
    ids = decoder.encode(text)
    assert decoder.decode(ids) == text
    got = decoder.generate(text, 6, decoder.cache("window", budget=16))
    assert got == decoder.generate(ids, 6, decoder.cache("window", budget=16))
    args = ["--init-from", "llama3", "--prompt", text, "--tokens", "6", "--temperature", "0"]
    assert got == cli_ids(*args, "--policy", "window", "--budget", "16")


def test_a_long_text_reads_as_hugging_face_tokenizers_reads_it_whole():
    tokenizers = pytest.importorskip("tokenizers")
    reference = tokenizers.Tokenizer.from_file(str(FIXTURES / "llama3" / "tokenizer.json"))
    sample = (FIXTURES / "llama3" / "sample.txt").read_text()
    # About 2.3 MB, in lines and in one line: lethe tokenises it in pieces.
    text = (sample + "\n") * (2_300_000 // len(sample))
    decoder = lethe.Decoder(FIXTURES / "llama3")
    for text in [text, text.replace("\n", " ")]:
        assert decoder.encode(text) == reference.encode(text, add_special_tokens=False).ids


def test_a_folder_without_a_tokenizer_takes_ids(tmp_path):
    for name in ["config.json", "model.safetensors"]:
        (tmp_path / name).symlink_to(FIXTURES / "llama3" / name)
    decoder = lethe.Decoder(tmp_path)
    for call in [lambda: decoder.encode("a"), lambda: decoder.generate("a", 2, decoder.cache())]:
        with pytest.raises(ValueError, match="has no tokenizer.json: give the prompt as token ids"):
            call()
    assert len(decoder.generate([1, 2, 3], 2, decoder.cache())) == 2


@needs_binary
def test_a_run_s_decoder_generates_as_lethe_generate_from_the_run(fitted):
    decoder = lethe.Decoder(fitted / "expire")
    prompt = [(i * 5 + 1) % 300 for i in range(20)]
    got = decoder.generate(prompt, 8, decoder.cache("learned"), temperature=1.0, seed=2)
    args = ["--checkpoint", str(fitted / "expire"), "--prompt-ids", ",".join(map(str, prompt)), "--tokens", "8"]
    assert got == cli_ids(*args, "--temperature", "1", "--seed", "2")
    text = "The cache keeps"
    assert decoder.decode(decoder.encode(text)) == text  # the run's tokenizer

