"""The official Expire-Span model (facebookresearch/transformer-sequential) started from a
lethe checkpoint's weights and trained on lethe's streams, printing each step's loss and
gradient norm: the other half of scripts/vs-official-steps.sh.

usage: official-steps.py OFFICIAL_CHECKOUT CHECKPOINT CORPUS STEPS SPAN PRE_DIV [TORCH_SEED]

With TORCH_SEED, the official model keeps its own PyTorch initialisation (drawn after
`torch.manual_seed(TORCH_SEED)`) instead of the checkpoint's weights; the checkpoint then
only gives the vocabulary size.

CHECKPOINT is a lethe checkpoint (safetensors) of the comparison model of `scripts/vs-official.sh` (2 layers, d 256,
4 heads, FFN 1024, pre-norm, blocks of 256, batch 8, Expire-Span with ramp 64, loss 1e-6,
initial fraction 0.1). The streams are lethe's: the first 90% of CORPUS (the default
`data.split`), cut into 8 equal streams. The training step is the official trainer's:
NLL + the span loss, clip_grad_norm_ 0.3, Adam lr 3e-4.
"""
import argparse
import json
import struct
import sys

official, ckpt, corpus, steps, span, pre_div = sys.argv[1:7]
torch_seed = int(sys.argv[7]) if len(sys.argv) > 7 else None
sys.path.insert(0, official)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from models.expire_span import ExpireSpan  # noqa: E402

steps, span, pre_div = int(steps), int(span), float(pre_div)
B, M, D = 8, 256, 256
torch.set_num_threads(2)

raw = open(ckpt, "rb").read()
header_len = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + header_len])


def tensor(name):
    entry = header[name]
    assert entry["dtype"] == "F32", f"{name}: {entry['dtype']}"
    start, end = entry["data_offsets"]
    data = bytearray(raw[8 + header_len + start:8 + header_len + end])
    return torch.frombuffer(data, dtype=torch.float32).view(entry["shape"]).clone()


vocab = tensor("embed.weight").shape[0]
args = argparse.Namespace(
    hid_sz=D, inner_hid_sz=1024, nlayers=2, mem_sz=M, nheads=4, head_dim=D // 4, dropout=0.0, pre_norm=True,
    attn_lim=span, compress=False, feedback=False, staircase=False, adapt_span=False, share_proj_kv=False,
    expire_span=True, expire_span_loss=1e-6, expire_span_ramp=64, expire_span_init_percentage=0.1,
    expire_span_noisy=False, expire_span_pre_div=pre_div, expire_span_layerdrop=0.0,
    vocab_sz=vocab, device=torch.device("cpu"), out_drop=0, emb_drop=0)
if torch_seed is not None:
    torch.manual_seed(torch_seed)
model = ExpireSpan(args)

# lethe's names -> the official code's. lethe's key_pe row d is distance d (0..M); the
# official key_pe[:, :, j] is distance M - j (j = 0..M-1), shared by the layers.
weights = {
    "in_emb.weight": tensor("embed.weight"),
    "out.out_emb.weight": tensor("head.weight"), "out.out_emb.bias": tensor("head.bias"),
    "out_norm.weight": tensor("final_norm.weight"), "out_norm.bias": tensor("final_norm.bias"),
    "layers.0.attn.attn.key_pe": tensor("key_pe")[1:M + 1].flip(0).t().unsqueeze(0).contiguous(),
}
for i in range(2):
    lethe, off = f"layers.{i}.", f"layers.{i}."
    for ours, theirs in [("q", "proj_query"), ("k", "proj_key"), ("v", "proj_val"), ("o", "proj_out")]:
        weights[f"{off}attn.{theirs}.weight"] = tensor(f"{lethe}attn.{ours}.weight")
    weights[f"{off}attn.attn.expire_span.span_predictor.weight"] = tensor(f"{lethe}attn.expire.w").view(1, -1)
    weights[f"{off}attn.attn.expire_span.span_predictor.bias"] = tensor(f"{lethe}attn.expire.b")
    for ours, theirs in [("ff1", "ff.fc1"), ("ff2", "ff.fc2"), ("norm1", "norm1"), ("norm2", "norm2")]:
        weights[f"{off}{theirs}.weight"] = tensor(f"{lethe}{ours}.weight")
        weights[f"{off}{theirs}.bias"] = tensor(f"{lethe}{ours}.bias")
names = {name for name, _ in model.named_parameters()}
assert names <= set(weights), f"no lethe weight for {sorted(names - set(weights))}"
if torch_seed is None:
    model.load_state_dict({k: v for k, v in weights.items() if k in names}, strict=False)

data = torch.tensor(list(open(corpus, "rb").read()), dtype=torch.long)
train = data[:int(len(data) * 0.9)]
per = len(train) // B
streams = train[:per * B].view(B, per)
assert (steps * M + 1) <= per, "the corpus is too short for this many steps in one pass"

optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
model.train()
cache = model.init_hid_cache(B)
for step in range(1, steps + 1):
    pos = (step - 1) * M
    x, y = streams[:, pos:pos + M], streams[:, pos + 1:pos + M + 1]
    out, cache, aux = model(x, cache, y)
    cache = [c.detach() for c in cache]
    loss = F.nll_loss(out.reshape(-1, vocab), y.reshape(-1))
    (loss + aux.mean()).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.3)
    optimizer.step()
    optimizer.zero_grad()
    print(f"{step} {loss.item():.7f} {norm.item():.7f}", flush=True)
