//! What `lethe.Model.generate` and `lethe.Decoder.generate` share: the checks of their
//! arguments, in the words of the keyword arguments, and the loop that collects the ids
//! a stream emits while Python's signals are watched, so that Ctrl-C stops it.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use lethe_data::Token;
use lethe_train::generate::Sampling;

use crate::{check_id_list, invalid};

/// What one generated id costs until Python holds it (the Rust list's and Python's int).
const BYTES_PER_ID: u64 = 48;

/// Tokens generated between two checks of Python's signals.
const SIGNAL_EVERY: usize = 64;

/// Refuses a `count` of ids whose list would not fit in half the machine's memory.
pub(crate) fn check_count(count: usize) -> PyResult<()> {
    let most = lethe_core::input::max_bytes() / BYTES_PER_ID;
    if count as u64 > most {
        return Err(invalid(format!(
            "count = {count}: the list of ids would not fit in half this machine's memory (at most {most} here)"
        )));
    }
    Ok(())
}

/// The prompt's ids as tokens, refused when empty or with an id outside `0..vocab`.
pub(crate) fn prompt_tokens(prompt: Vec<i64>, vocab: i64) -> PyResult<Vec<Token>> {
    if prompt.is_empty() {
        return Err(invalid("prompt: at least one token"));
    }
    check_id_list("prompt", &prompt, vocab)?;
    Ok(prompt.into_iter().map(|i| i as Token).collect())
}

/// `(temperature, top_k, top_p, seed)` as a [`Sampling`], checked.
pub(crate) fn sampling((temperature, top_k, top_p, seed): (f64, usize, f64, u64)) -> PyResult<Sampling> {
    let sampling = Sampling { temperature, top_k, top_p, seed };
    sampling.validate().map_err(|e| invalid(as_keywords(&e.to_string())))?;
    Ok(sampling)
}

/// The ids `stream` emits (at most `count`), Python's signals checked every
/// [`SIGNAL_EVERY`] ids: a signal's exception (`KeyboardInterrupt`) stops the stream and
/// is raised.
pub(crate) fn collect(
    count: usize,
    stream: impl FnOnce(&mut dyn FnMut(Token) -> lethe_core::error::Result<()>) -> lethe_core::error::Result<()>,
) -> PyResult<Vec<i64>> {
    let (mut out, mut signal) = (Vec::with_capacity(count.min(1 << 16)), None);
    let emitted = stream(&mut |t| {
        out.push(i64::from(t));
        if out.len() % SIGNAL_EVERY == 0 {
            if let Err(e) = Python::with_gil(|py| py.check_signals()) {
                signal = Some(e);
                return Err(lethe_core::error::LetheError::Invalid("interrupted".into()));
            }
        }
        Ok(())
    });
    match (signal, emitted) {
        (Some(e), _) => Err(e),
        (None, Err(e)) => Err(PyRuntimeError::new_err(e.to_string())),
        (None, Ok(())) => Ok(out),
    }
}

/// A message about `generate`'s flags in the words of its keyword arguments
/// (`--top-p` as `top_p`), the rest of it (a value of `-1`) as it is.
fn as_keywords(message: &str) -> String {
    [("--temperature", "temperature"), ("--top-k", "top_k"), ("--top-p", "top_p"), ("--seed", "seed")]
        .iter()
        .fold(message.to_string(), |text, (flag, keyword)| text.replace(flag, keyword))
}
