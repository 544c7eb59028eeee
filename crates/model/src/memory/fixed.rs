//! Transformer-XL memory with a fixed span (Dai et al., 2019; Expire-Span paper,
//! section 3): `C_t = {t-L, ..., t-1}`. Each layer caches its last `L` input states
//! (detached); keys and values are recomputed from them every block, and a query sees
//! itself and the `L` positions before it, with learned relative positions `key_pe`.
//!
//! lethe lets a query attend to itself (the official adaptive/expire-span code excludes
//! it); with that choice the first block of a stream needs no placeholder memories, so
//! the cache starts empty rather than with `M` zero vectors.
//!
//! When the rows are episodes that follow each other ([`AttendInput::episodes`]), the
//! cache keeps the episode of every state, and a query sees only its own episode's.

use tch::{nn, Tensor};

use super::descriptor::{Descriptor, LayerShape};
use super::layer::{AttendInput, AttendOutput, Carry, MemoryLayer, MemoryReport};
use super::window::{Joined, WindowCache};
use lethe_core::config::MemoryConfig;
use lethe_core::error::Result;

/// Transformer-XL's [`Descriptor`]: the defaults, a window of `L` states.
pub struct Fixed;

impl Descriptor for Fixed {
    fn build(&self, cfg: &MemoryConfig, _: nn::Path, _: LayerShape) -> Result<Box<dyn MemoryLayer>> {
        Ok(Box::new(FixedSpan::new(cfg.span)))
    }

    fn colour(&self) -> (u8, u8, u8) {
        (31, 119, 180)
    }
}

/// A fixed-span cache of the last `span` states.
pub struct FixedSpan {
    span: i64,
    window: WindowCache,
    /// Memory size per stream at the last block.
    last_mem_rows: Vec<f64>,
}

impl FixedSpan {
    /// An empty memory of `span` states.
    pub fn new(span: usize) -> Self {
        FixedSpan { span: span as i64, window: WindowCache::default(), last_mem_rows: vec![] }
    }
}

impl MemoryLayer for FixedSpan {
    fn name(&self) -> &'static str {
        "fixed"
    }

    fn attend(&mut self, input: &AttendInput) -> Result<AttendOutput> {
        let (context, mem_rows, joined) = self.window.attend(input, self.span)?;
        self.last_mem_rows = mem_rows;
        Ok(AttendOutput { context, aux_loss: None, added: None, carry: Carry::new(joined) })
    }

    fn update(&mut self, x: &Tensor, episodes: Option<&Tensor>, carry: Carry) -> Result<()> {
        self.window.append(x, episodes, self.span, carry.take::<Joined>());
        Ok(())
    }

    fn reset(&mut self) {
        self.window.reset();
    }

    fn report(&self) -> MemoryReport {
        MemoryReport::with_rows(self.last_mem_rows.clone(), self.window.len() as usize)
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        self.window.state()
    }

    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        self.window.load_state(state, self.span, "fixed-span")
    }

    fn fresh(&self) -> Box<dyn MemoryLayer> {
        Box::new(FixedSpan::new(self.span as usize))
    }
}
