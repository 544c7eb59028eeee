//! The tiny Llama-family fixtures of `tests/fixtures/llama` (`scripts/llama-fixture.py`):
//! their folders, `transformers`' outputs on them, and the gap between two outputs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tch::Tensor;

/// The fixture folder `name` (`llama3`, `smollm2`, `qwen2`, `qwen3`, `mistral`).
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama").join(name)
}

/// What `transformers` computed on the fixture `name` (`ids`, `logits`, ...).
pub fn expected(name: &str) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(fixture(name).join("expected.safetensors")).unwrap().into_iter().collect()
}

/// The largest absolute difference between two tensors of the same shape.
pub fn gap(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a - b).abs().max().double_value(&[])
}
