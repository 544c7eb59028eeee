#!/usr/bin/env python3
"""Would a ragged attention pay at the enwik8-tiny size?  (README, Efficiency)

A trained Expire-Span keeps a different number of memories in each stream (44 to 113 of
layer 1's 16 streams, 81 on average, after 1500 steps on text), and lethe's batch pads
every stream's keys to the longest.  This times the attention's two products over those
keys on this CPU, in turns, three ways:

- padded:  one batched product over every stream's keys padded to the longest (lethe);
- ragged:  MKL's grouped batch product (`cblas_sgemm_batch`, one group per stream of its
           own length, the padding left out), which libtorch's CPU library exports;
- mean:    one batched product over as many keys as the mean stream keeps (what
           Transformer-XL pays at equal memory).

Run with the project's Python (`.venv/bin/python3 scripts/ragged-gemm.py`); it needs a
libtorch built with MKL (x86).  Prints the median microseconds of each over the rounds.
"""
import ctypes
import statistics
import sys
import time

import torch

ROUNDS, REPS = 7, 300
B, H, M, DH = 16, 4, 64, 32  # enwik8-tiny: batch 16, 4 heads of 32, blocks of 64
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


def mkl_batch():
    lib = ctypes.CDLL(torch.__file__.rsplit("/", 1)[0] + "/lib/libtorch_cpu.so", mode=ctypes.RTLD_GLOBAL)
    try:
        return lib.cblas_sgemm_batch
    except AttributeError:
        sys.exit("this libtorch has no MKL (cblas_sgemm_batch): nothing to compare")


def grouped(fn, a, b, c, pad, scores):
    """One grouped call: per stream s, its H products over its own keys from pad[s].

    scores: C (M, n_s) = A (M, DH) B (n_s, DH)^T; else C (M, DH) = A (M, n_s) B (n_s, DH).
    """
    n = b.shape[2]
    ints = lambda xs: (ctypes.c_int * B)(*xs)
    floats = lambda x: (ctypes.c_float * B)(*[x] * B)
    ptrs = lambda xs: (ctypes.c_void_p * (B * H))(*xs)
    keys = [n - int(p) for p in pad]
    at = lambda t, s, h, off: t.data_ptr() + 4 * (t[s, h].storage_offset() - t.storage_offset() + off)
    if scores:
        dims = (ints([M] * B), ints(keys), ints([DH] * B))
        lds = (ints([DH] * B), ints([DH] * B), ints([n] * B))
        pa = [at(a, s, h, 0) for s in range(B) for h in range(H)]
        pb = [at(b, s, h, int(pad[s]) * DH) for s in range(B) for h in range(H)]
        pc = [at(c, s, h, int(pad[s])) for s in range(B) for h in range(H)]
        trans = (ints([NO_TRANS] * B), ints([TRANS] * B))
    else:
        dims = (ints([M] * B), ints([DH] * B), ints(keys))
        lds = (ints([n] * B), ints([DH] * B), ints([DH] * B))
        pa = [at(a, s, h, int(pad[s])) for s in range(B) for h in range(H)]
        pb = [at(b, s, h, int(pad[s]) * DH) for s in range(B) for h in range(H)]
        pc = [at(c, s, h, 0) for s in range(B) for h in range(H)]
        trans = (ints([NO_TRANS] * B), ints([NO_TRANS] * B))
    args = (ctypes.c_int(ROW_MAJOR), *trans, *dims, floats(1.0), ptrs(pa), lds[0], ptrs(pb), lds[1],
            floats(0.0), ptrs(pc), lds[2], ctypes.c_int(B), ints([H] * B))
    return lambda: fn(*args)


def timed(fn):
    for _ in range(20):
        fn()
    t0 = time.perf_counter()
    for _ in range(REPS):
        fn()
    return (time.perf_counter() - t0) / REPS * 1e6


def main():
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(0)
    kept = torch.randint(44, 114, (B,), generator=gen)
    cache, mean = int(kept.max()), int(round(kept.float().mean().item()))
    n, n_mean = cache + M, mean + M
    pad = cache - kept
    q = torch.randn(B, H, M, DH, generator=gen)
    k, v = torch.randn(B, H, n, DH, generator=gen), torch.randn(B, H, n, DH, generator=gen)
    w = torch.randn(B, H, M, n, generator=gen)
    k_mean, v_mean = k[:, :, :n_mean].contiguous(), v[:, :, :n_mean].contiguous()
    w_mean = w[..., :n_mean].contiguous()
    fn = mkl_batch()
    scores, context = torch.zeros(B, H, M, n), torch.zeros(B, H, M, DH)
    ragged_scores = grouped(fn, q, k, scores, pad, True)
    ragged_context = grouped(fn, w, v, context, pad, False)
    # The grouped calls compute what the padded products compute over each stream's keys.
    ragged_scores()
    ragged_context()
    full = q @ k.transpose(-1, -2)
    wz = w.clone()
    for s in range(B):
        wz[s, :, :, : int(pad[s])] = 0
        assert torch.allclose(scores[s, :, :, int(pad[s]):], full[s, :, :, int(pad[s]):], atol=1e-4)
    assert torch.allclose(context, wz @ v, atol=1e-3)
    arms = {
        "scores padded": lambda: q @ k.transpose(-1, -2),
        "scores ragged": ragged_scores,
        "scores mean": lambda: q @ k_mean.transpose(-1, -2),
        "context padded": lambda: w @ v,
        "context ragged": ragged_context,
        "context mean": lambda: w_mean @ v_mean,
    }
    times = {name: [] for name in arms}
    for r in range(ROUNDS):
        for name, arm in arms.items():
            times[name].append(timed(arm))
        print(f"round {r + 1} of {ROUNDS}", file=sys.stderr)
    print(f"streams keep {int(kept.min())}-{int(kept.max())} memories (mean {kept.float().mean():.1f}); "
          f"keys a query reads: padded {n}, ragged {n_mean} on average; {torch.get_num_threads()} threads")
    for name, ts in times.items():
        print(f"{name:16s} {statistics.median(ts):7.1f} us   (rounds {min(ts):.0f}-{max(ts):.0f})")


if __name__ == "__main__":
    main()
