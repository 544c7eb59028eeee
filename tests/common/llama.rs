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

/// The logits `transformers` computed on the fixture `name` with the model read in
/// `precision` (`bf16`, `f16`; scripts/llama-precision-fixture.py), in float32: of its
/// eager attention (`logits`) and of its sdpa one (`logits_sdpa`).
pub fn expected_in(name: &str, precision: &str) -> HashMap<String, Tensor> {
    let path = fixture(name).join(format!("expected-{precision}.safetensors"));
    Tensor::read_safetensors(path).unwrap().into_iter().collect()
}

/// The mean absolute difference between two tensors of the same shape.
pub fn mean_gap(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a - b).abs().mean(tch::Kind::Double).double_value(&[])
}

/// The largest absolute difference between two tensors of the same shape.
pub fn gap(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a - b).abs().max().double_value(&[])
}
