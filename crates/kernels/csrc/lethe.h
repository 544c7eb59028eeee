// lethe's C ABI: every entry point of its C++ (csrc/*.cpp), declared once. Each .cpp
// includes this header, so the compiler checks every definition against it; crates/kernels/src/lib.rs
// mirrors it for Rust (a test compares the two, name by name and argument by argument).
//
// Conventions:
// - A tensor crosses as `lethe_tensor`, an `at::Tensor*` (what tch's `Tensor::as_mut_ptr`
//   holds). A tensor an entry point writes to `out` is new, owned by the caller.
// - An entry point that can fail returns 0, or -1 with a malloc'ed message in `*error`
//   (csrc/guard.h turns any C++ exception into one, never an abort), which the caller
//   frees with lethe_free_error.
// - An entry point of more than a few arguments takes them in a struct.

#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void* lethe_tensor;

// ---- errors (guard.h) ------------------------------------------------------------------

void lethe_free_error(char* error);

// ---- the optimiser (adam.cpp) ----------------------------------------------------------

// One update of `count` parameters in place. `exp_avg` is unused by RMSProp. `steps` and
// `decays`, per parameter: Adam's `lr / bc1` (RMSProp: `lr`) and `1 - lr wd`;
// `constants`: beta1, 1 - beta1, beta2, 1 - beta2, sqrt(bc2), eps.
typedef struct lethe_optimiser_args {
  lethe_tensor* params;
  lethe_tensor* grads;
  lethe_tensor* exp_avg;
  lethe_tensor* exp_avg_sq;
  int64_t count;
  const double* steps;
  const double* decays;
  const double* constants;
  int rmsprop;       // 1 for RMSProp, 0 for Adam
  int decay;         // 1 when the weight decay is on
  int multi_tensor;  // 1 for libtorch's multi-tensor operations (a GPU's path)
} lethe_optimiser_args;

int lethe_optimiser_step(const lethe_optimiser_args* args, char** error);

// The global L2 norm of `count` gradients into `norm`; above `max` (> 0) every gradient is
// scaled by max / (norm + 1e-6).
int lethe_clip_foreach(lethe_tensor* grads, int64_t count, double max, double* norm, char** error);

// ---- the cache's gradient and the ragged projection (cache_grad.cpp) -------------------

// `k` and `v` (b, n, e) unchanged, with the gradient of their projections' last `m` rows
// to `block` (b, m, d); with `s` (b, n) and `ws` (d), else null, the span scores too.
// Writes two (or three) tensors to `out`.
typedef struct lethe_cache_tail_args {
  lethe_tensor k;
  lethe_tensor v;
  lethe_tensor s;  // or null
  lethe_tensor block;
  lethe_tensor wk;
  lethe_tensor wv;
  lethe_tensor ws;  // or null
} lethe_cache_tail_args;

int lethe_cache_tail_grad(const lethe_cache_tail_args* args, lethe_tensor* out, char** error);

// Keys, values and span scores of a ragged window: `states` (b, n, d) whose last rows
// were copied from `block` (b, m, d), `valid` (b, n) bool, weights `wk`, `wv` (e, d),
// biases `bk`, `bv` (e) or null, the score vector `ws` (d). Writes k, v (b, n, e) and
// s (b, n) to `out`.
typedef struct lethe_ragged_project_args {
  lethe_tensor states;
  lethe_tensor block;
  lethe_tensor valid;
  lethe_tensor wk;
  lethe_tensor bk;  // or null
  lethe_tensor wv;
  lethe_tensor bv;  // or null
  lethe_tensor ws;
  int blas;  // 0: libtorch's matrix products instead of the BLAS library's (tests)
} lethe_ragged_project_args;

int lethe_ragged_project(const lethe_ragged_project_args* args, lethe_tensor* out, char** error);

// ---- the attention chunks and the skew (chunks.cpp, skew.cpp) --------------------------

// The `count` narrows of `t` along `dim` at `starts` with lengths `lens`, as one autograd
// node; writes `count` tensors to `out`.
int lethe_chunks(lethe_tensor t, int64_t dim, const int64_t* starts, const int64_t* lens, int64_t count,
                 lethe_tensor* out, char** error);

// The relative positions' skew of `flipped` for `cached` states before a block, over `n`
// keys; writes one tensor to `out`.
int lethe_skew(lethe_tensor flipped, int64_t cached, int64_t n, lethe_tensor* out, char** error);

// ---- the ∞-former's densities against its basis (expectation.cpp) ----------------------

// r = N(mu; centres, var + widths2) for densities `mu`, `var` (...) against a basis of
// `centres`, `widths2` (N), as one autograd node; writes one tensor (..., N) to `out`.
int lethe_expectation(lethe_tensor mu, lethe_tensor var, lethe_tensor centres, lethe_tensor widths2,
                      lethe_tensor* out, char** error);

// ---- decoding one token at a time (decode.cpp) -----------------------------------------

// x w^T + bias (bias may be null) for a few rows of x, each row of w read once; writes
// one tensor to `out`.
int lethe_decode_linear(lethe_tensor x, lethe_tensor w, lethe_tensor bias, lethe_tensor* out, char** error);

// One token's attention: queries q (b, kv, g, hd) over keys and values (b, kv, n, hd)
// held in place, with `bias` (b, 1 or kv, 1, n; may be null) added to the scaled scores;
// writes the context (b, kv, g, hd) and the weights (b, kv, g, n) to out[0] and out[1].
int lethe_decode_attention(lethe_tensor q, lethe_tensor keys, lethe_tensor values, lethe_tensor bias, double scale,
                           lethe_tensor* out, char** error);

// The sum of a float32 tensor's values, read once as a stream per thread (the read-rate
// probe); writes it to `sum`.
int lethe_read_sum(lethe_tensor x, double* sum, char** error);

// ---- Expire-Span's cache compaction (compact.cpp) --------------------------------------

// Compacts `count` tensors (b, n, ..) by the flags `keep` (b, n): each stream's kept
// slots right-aligned, with `room` free slots after them. Writes the new slots' validity
// (b, c), then each tensor (b, c + room, ..), to `out`.
int lethe_compact(lethe_tensor keep, lethe_tensor* tensors, int64_t count, int64_t room, lethe_tensor* out,
                  char** error);

// ---- Expire-Span's fused scores and ragged attention (expire_scores.cpp, expire_attend.cpp)

// The operands both take: the relative-position scores `pq` (b, h, m, P), the spans
// (b, n), the counter (b, n) and the usable keys (b, 1 or m, n), the ramp R, and the
// widest vector loops to run (0 plain, 8 AVX2, 16 AVX-512, each where the CPU has it).
typedef struct lethe_expire_operands {
  lethe_tensor pq;
  lethe_tensor spans;
  lethe_tensor counter;
  lethe_tensor usable;
  double ramp;
  int width;
} lethe_expire_operands;

// The fused scores over `scores` (b, h, m, n), or with `softmax` 1 their softmax; writes
// the scores, the ramp counts (b, n) and the ramp's distance sums (b) to `out`.
int lethe_expire_scores(lethe_tensor scores, const lethe_expire_operands* ops, int softmax, lethe_tensor* out,
                        char** error);

// The whole attention of a block, stream by stream over each stream's own keys: `q`
// (b, h, m, dh) divided by sqrt(dh), `k` and `v` (b, h, n, dh); the span loss scaled by
// `loss_scale` (0: none); `blas` 0 takes libtorch's products. Writes the context, the
// ramp counts, the distance sums and the span loss to `out`.
typedef struct lethe_expire_attend_args {
  lethe_tensor q;
  lethe_tensor k;
  lethe_tensor v;
  lethe_expire_operands ops;
  double loss_scale;
  int blas;
} lethe_expire_attend_args;

int lethe_expire_attend(const lethe_expire_attend_args* args, lethe_tensor* out, char** error);

// ---- Expire-Span's attention bias, the GPU's path (expire_bias.cpp) --------------------

// The bias (b, h, m, n) for scaled_dot_product_attention, `ln m` plus the positions where
// a query sees a key and -inf elsewhere, with gradient to `pq` and the spans; with
// `stats` 1 also the ramp counts (b, n) and each key's ramp distances (b, n, double), else
// two empty tensors; with `stats` 1 and `loss_scale` > 0 the span loss times it (one
// value, with gradient to the spans), else an empty tensor. Writes the four to `out`. On
// the CPU the GPU kernels' arithmetic runs in loops.
int lethe_expire_bias(const lethe_expire_operands* ops, int stats, double loss_scale, lethe_tensor* out, char** error);

// ---- Expire-Span's deletion after a block, the GPU's path (expire_forget.cpp) ----------

// `states` (b, n, d) of [cache, block] without gradient, the spans its memories were
// given, their counters and validity (b, n), blocks of `m`: writes the new cache to
// `out`, states (b, c, d), counters and validity (b, c + m) (the last m the next block's). On the CPU the GPU kernels'
// arithmetic runs in loops.
int lethe_expire_forget(lethe_tensor states, lethe_tensor spans, lethe_tensor counter, lethe_tensor valid, double ramp,
                        int64_t m, lethe_tensor* out, char** error);

// Loads the GPU kernels (liblethe_cuda.so at `path`); 0, or -1 with the reason.
int lethe_cuda_kernels_load(const char* path, char** error);

// 1 once the GPU kernels are loaded, else 0.
int lethe_cuda_kernels_ready(void);

// How many threads `at::parallel_for` spreads 64 items over, and libtorch's thread count
// (equal only where the C++ is compiled with OpenMP, as libtorch is).
void lethe_parallel_threads(int64_t* seen, int64_t* threads);

// ---- libtorch's settings (context.cpp) and profiler (trace.cpp) ------------------------

int lethe_set_tf32(int tf32, char** error);
int lethe_tf32(void);
void lethe_set_cpp_log_level(int level);
int lethe_autocast_enter(int device_type, int enabled, int dtype, int* saved, char** error);
int lethe_autocast_exit(int device_type, const int* saved, char** error);
// csrc/widened.cpp: autocast's products on the CPU computed widened to float32, for the process.
int lethe_autocast_widen_products(char** error);

// The bytes the caching allocator has handed out on GPU `device`, now and at most since
// the last reset; `reset` 1 restarts the peak from now.
int lethe_gpu_memory(int device, int reset, int64_t* current, int64_t* peak, char** error);

// Starts recording libtorch's profiler into a Chrome trace at `path`; `out` receives a
// handle for lethe_trace_stop, which writes the file.
int lethe_trace_start(const char* path, void** out, char** error);
int lethe_trace_stop(void* handle, char** error);

// ---- c10d process groups (dist.cpp) ----------------------------------------------------

typedef struct lethe_pg lethe_pg;

// Where and how to join: the TCPStore at host:port (hosted when `store_server` is 1),
// under `prefix`; collectives give up after `timeout_ms`; Gloo's when `device` is -1,
// else NCCL's on that CUDA device.
typedef struct lethe_dist_options {
  const char* host;
  int port;
  int rank;
  int world;
  int store_server;
  const char* prefix;
  int64_t timeout_ms;
  int device;
} lethe_dist_options;

// Loads liblethe_nccl.so (csrc/nccl/), which NCCL groups need.
int lethe_dist_nccl_load(const char* path, char** error);

// Joins the group; null (and `error` set) on failure.
lethe_pg* lethe_dist_init(const lethe_dist_options* options, char** error);
int lethe_dist_all_reduce(lethe_pg* pg, lethe_tensor tensor, int max, char** error);
int lethe_dist_broadcast(lethe_pg* pg, lethe_tensor tensor, int root, char** error);
int lethe_dist_barrier(lethe_pg* pg, char** error);

// c10d's Reducer over a group's trainable parameters: the gradients' all-reduce in
// buckets during the backward pass of a loss prepared for it.
typedef struct lethe_reducer lethe_reducer;
lethe_reducer* lethe_dist_reducer_new(lethe_pg* pg, lethe_tensor const* params, int n, int64_t first_bytes,
                                      int64_t bucket_bytes, char** error);
int lethe_dist_reducer_prepare(lethe_reducer* reducer, lethe_tensor loss, char** error);
void lethe_dist_reducer_free(lethe_reducer* reducer);
void lethe_dist_free(lethe_pg* pg);

#ifdef __cplusplus
}  // extern "C"
#endif
