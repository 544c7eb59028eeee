//! TOVA, token omission via attention (Oren et al., 2024, "Transformers are Multi-State
//! RNNs", Sec. 4): when the cache is over its budget, drop the entries the newest query
//! attends to least, its attention weights averaged over every head of the layer, so
//! all key-value heads of a layer keep the same entries. The newest entry is always
//! kept (as kvpress's press does).

use tch::Kind;

use super::{top, Chunk, Entry, Held, LayerPolicy};

pub const ENTRY: Entry = Entry {
    name: "tova",
    about: "TOVA: the entries the newest query attends to most, averaged over the heads",
    options: &[],
    budgeted: true,
    check: |_, _| Ok(()),
    build: |budget, _| Box::new(Tova { budget }),
};

struct Tova {
    budget: i64,
}

impl LayerPolicy for Tova {
    fn fork(&self) -> Box<dyn LayerPolicy> {
        Box::new(Tova { budget: self.budget })
    }

    fn needs_weights(&self) -> bool {
        true
    }

    fn update(&mut self, held: &mut Held, chunk: &Chunk) {
        let (b, kv_heads, n) = held.positions.size3().expect("(b, kv_heads, n)");
        if n <= self.budget {
            return;
        }
        let Some(weights) = chunk.weights else { return };
        let newest = weights.select(2, -1); // (b, h, n)
        let scores = newest.mean_dim([1i64].as_slice(), true, Kind::Float); // (b, 1, n)
        let _ = scores.narrow(2, n - 1, 1).fill_(f64::INFINITY);
        held.keep(&top(&scores, self.budget).expand([b, kv_heads, -1], false));
    }
}
