//! The integration tests, one binary (one link against libtorch), each file a module.
//! Two stay binaries of their own: `tests/expire_threads.rs` changes libtorch's
//! process-wide thread count, which would change it for every test running beside it,
//! and `tests/gpu.rs` is packed alone for a GPU machine by `scripts/gpu-check.sh`.

#[path = "../common/mod.rs"]
mod common;

mod adaptive;
mod bad_input;
mod bench;
mod cli;
mod compressive;
mod dialogue;
mod dist;
mod docs;
mod episodes;
mod expire;
mod gpt2;
mod infinity;
mod kv_policies;
mod llama;
mod llama_backbone;
mod llama_expire;
mod llama_infinity;
mod llama_lora;
mod longeval;
mod messages;
mod model;
mod precision;
mod rl;
mod trace_summary;
mod train;
mod words;
