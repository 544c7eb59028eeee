//! One attention layer with its memory: `lethe._lethe.Layer`, which the Python class
//! `lethe.MemoryAttention` (python/lethe/layers.py) makes a `torch.nn.Module`.
//!
//! A [`Layer`] is what one layer of lethe's backbone does with its memory (the
//! projections of Eq. 1, the mechanism's `attend` and `update`, the output projection),
//! without the norms and the feed-forward around it.

use std::sync::Mutex;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3_tch::PyTensor;
use tch::{nn, Device, Tensor};

use lethe_core::config::{Arch, MemoryConfig};
use lethe_model::attention::{Attention, LinearInit};
use lethe_model::memory::{self, AttendInput, MemoryLayer};

use crate::{as_arguments, check_device, check_float, guarded, invalid, lock, restore, Named};

/// One attention layer and its memory mechanism. See the module documentation.
#[pyclass(module = "lethe._lethe")]
pub struct Layer {
    inner: Mutex<Inner>,
}

/// What a [`Layer`] owns; behind a lock, as a Python object may be shared by threads.
struct Inner {
    vs: nn::VarStore,
    attn: Attention,
    /// The memory with no state: each call restores the caller's state into a fresh one.
    memory: Box<dyn MemoryLayer>,
    /// Learned relative positions, `(rows, d_head)` (paper A.1).
    key_pe: Tensor,
    d_model: i64,
    block: i64,
}

impl Inner {
    /// Checks a block `x` against the layer: `(b, m, d_model)`, `1 <= m <= block`, the
    /// parameters' dtype and device.
    fn check_block(&self, x: &Tensor) -> PyResult<()> {
        let size = x.size();
        if size.len() != 3 || size[2] != self.d_model {
            return Err(invalid(format!(
                "x: expected a block of shape (batch, length, d_model = {}), got {size:?}",
                self.d_model
            )));
        }
        if size[0] == 0 || size[1] == 0 || size[1] > self.block {
            return Err(invalid(format!(
                "x: a block of {} streams of {} positions; the layer takes 1 to block = {} positions of at least one stream",
                size[0], size[1], self.block
            )));
        }
        check_float("x", x, self.key_pe.kind())?;
        check_device("x", x, self.key_pe.device())?;
        Ok(())
    }

    /// A fresh memory holding a copy of `state`, checked against the block `x`.
    fn restore(&self, state: &[(String, PyTensor)], x: &Tensor) -> PyResult<Box<dyn MemoryLayer>> {
        let mut memory = self.memory.fresh();
        let restored = restore(state, x.size()[0], self.d_model, x.device())?;
        memory.load_state(&restored).map_err(|e| invalid(format!("state: {e}")))?;
        Ok(memory)
    }
}

/// Refuses a layer whose parameters (the four maps and the relative positions, `rows`
/// of them) would take more than half the machine's memory, naming its sizes.
fn refuse_too_large(d_model: i64, heads: i64, rows: i64, span: usize) -> PyResult<()> {
    let floats = 4.0 * (d_model as f64).powi(2) + rows as f64 * (d_model / heads) as f64;
    let (bytes, most) = (4.0 * floats, lethe_core::input::max_bytes() as f64);
    if bytes > most {
        let gib = (1u64 << 30) as f64;
        return Err(invalid(format!(
            "d_model = {d_model} and span = {span}: the layer's parameters would take {:.1} GiB, more than half this machine's memory ({:.1} GiB)",
            bytes / gib,
            most / gib
        )));
    }
    Ok(())
}

#[pymethods]
impl Layer {
    /// A layer of `d_model` split into `heads`, taking blocks of at most `block`
    /// positions, attention dropout `dropout`, its memory as `memory` says (a
    /// `[memory]` section of lethe's config as JSON). Parameters start as lethe's
    /// backbone starts them, from libtorch's generator (`torch.manual_seed`).
    #[new]
    #[pyo3(signature = (d_model, heads, block, dropout, memory))]
    fn new(d_model: i64, heads: i64, block: usize, dropout: f64, memory: &str) -> PyResult<Layer> {
        if d_model <= 0 || heads <= 0 || d_model % heads != 0 {
            return Err(invalid(format!("d_model = {d_model} must be a positive multiple of heads = {heads}")));
        }
        if block == 0 {
            return Err(invalid("block must be at least 1"));
        }
        if !(0.0..1.0).contains(&dropout) {
            return Err(invalid(format!("dropout = {dropout} must be in [0, 1)")));
        }
        let cfg: MemoryConfig = serde_json::from_str(memory).map_err(|e| {
            // The settings are keyword arguments, not a file: no line and column.
            let said = e.to_string();
            let said = said.split(" at line ").next().unwrap_or(&said).to_string();
            invalid(format!("settings: {said}"))
        })?;
        cfg.validate(block, Arch::Lethe).map_err(|e| invalid(as_arguments(&e.to_string())))?;
        refuse_too_large(d_model, heads, memory::position_rows(&cfg, block), cfg.span)?;
        if cfg.expire.as_official {
            return Err(invalid(
                "as_official caches a layer's raw input and normalises it with the layer's norm, which this layer does not hold",
            ));
        }
        guarded(|| {
            let vs = nn::VarStore::new(Device::Cpu);
            let root = vs.root();
            let attn = Attention::with_init(root.clone(), d_model, heads, dropout, false, LinearInit::KAIMING);
            let memory = memory::build(&cfg, root.clone(), memory::LayerShape::new(d_model, heads, block))
                .map_err(|e| invalid(e.to_string()))?;
            let d_head = d_model / heads;
            let rows = memory::position_rows(&cfg, block);
            let std = LinearInit::KAIMING.key_pe_std(d_head);
            let key_pe = root.var("key_pe", &[rows, d_head], nn::Init::Randn { mean: 0.0, stdev: std });
            let inner = Inner { vs, attn, memory, key_pe, d_model, block: block as i64 };
            Ok(Layer { inner: Mutex::new(inner) })
        })
    }

    /// The parameters by name (`q.weight`, `key_pe`, `expire.span.weight`, ...), sorted:
    /// the tensors this layer computes with, not copies.
    fn parameters(&self) -> PyResult<Named> {
        let inner = lock(&self.inner)?;
        Ok(lethe_model::sorted_parameters(&inner.vs).into_iter().map(|(n, t)| (n, PyTensor(t))).collect())
    }

    /// One block `x` `(b, m, d_model)` over the memory `state` (empty: no memory): the
    /// attention output `(b, m, d_model)`, the memory after the block, and the
    /// mechanism's auxiliary loss (Expire-Span's span loss), if any. `train` turns on
    /// dropout and the training-only regularisers.
    #[pyo3(signature = (x, state, train))]
    fn forward(
        &self,
        py: Python<'_>,
        x: PyTensor,
        state: Named,
        train: bool,
    ) -> PyResult<(PyTensor, Named, Option<PyTensor>)> {
        py.allow_threads(move || {
            let inner = lock(&self.inner)?;
            guarded(|| {
                inner.check_block(&x)?;
                let mut memory = inner.restore(&state, &x)?;
                let q = inner.attn.queries(&x);
                let input = AttendInput {
                    x: &x,
                    q: &q,
                    attn: &inner.attn,
                    key_pe: Some(&inner.key_pe),
                    train,
                    episodes: None,
                    norm: None,
                };
                let out = memory.attend(&input).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
                memory.update(&x.detach(), None, out.carry).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
                let mut y = inner.attn.output(&out.context);
                if let Some(added) = out.added {
                    y += added;
                }
                let state = memory.state().into_iter().map(|(n, t)| (n, PyTensor(t))).collect();
                Ok((PyTensor(y), state, out.aux_loss.map(PyTensor)))
            })
        })
    }
}
