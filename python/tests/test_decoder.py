"""A pretrained decoder from Python: `lethe.Decoder` under each key-value cache policy and
`lethe.load` of a Hugging Face folder, against the logits `transformers` computed for
the fixtures (tests/fixtures/llama/*/expected.safetensors)."""

import json
import pathlib
import struct

import pytest
import torch

import lethe

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
    assert decoder.greedy(prompt, 8, roomy) == decoder.greedy(prompt, 8, full)


def test_bad_arguments_are_refused_with_one_line():
    decoder = lethe.Decoder(FIXTURES / "llama3")
    for call, kind, words in [
        (lambda: decoder.cache("lru", budget=8), ValueError, "unknown"),
        (lambda: decoder.cache("full", budget=8), ValueError, "keeps every entry"),
        (lambda: decoder.cache("h2o"), ValueError, "needs"),
        (lambda: decoder.cache("h2o", budget=0), ValueError, "at least one"),
        (lambda: decoder(torch.zeros(1, 4), decoder.cache()), ValueError, "int64"),
        (lambda: decoder(torch.tensor([[decoder.vocab]]), decoder.cache()), ValueError, "vocabulary"),
        (lambda: decoder([[1, 2]], decoder.cache()), TypeError, "torch.Tensor"),
        (lambda: lethe.Decoder(FIXTURES), ValueError, "config.json"),
        (lambda: decoder.greedy([1], -1, decoder.cache()), ValueError, "count must be a whole number"),
    ]:
        with pytest.raises(kind) as caught:
            call()
        message = str(caught.value)
        assert words in message and "\n" not in message.strip(), message
    cache = decoder.cache()
    decoder(torch.tensor([[1, 2, 3]]), cache)
    with pytest.raises(ValueError, match="streams"):
        decoder(torch.tensor([[1], [2]]), cache)
