//! SnapKV (Li et al., 2024, "SnapKV: LLM Knows What You are Looking for Before
//! Generation", Sec. 4.2, Listing 1): an observation window, the last `window` queries,
//! scores each older entry by the attention it gets from them (softmax over the cache,
//! averaged over the window's queries), the scores pooled along the cache (average,
//! `kernel` wide, zero-padded) so that neighbours of an important entry stay with it,
//! averaged over the query heads that share a key-value head; each key-value head keeps
//! its `budget - window` best and the window itself.
//!
//! The paper presses the cache once, at the end of the prompt. Here the cache is pressed
//! whenever `window` new tokens have come in and it is over its budget: at the end of
//! each block of the prompt (its last `window` queries the window) and every `window`
//! generated tokens, so a stream of any length holds at most `budget + window` entries.
//! The scoring follows kvpress's `SnapKVPress`.

use tch::{Kind, Tensor};

use super::{saved, saved_float, sized, top, Chunk, Entry, Held, LayerPolicy};

pub const ENTRY: Entry = Entry {
    name: "snapkv",
    about: "SnapKV: what an observation window of recent queries attends to, pooled",
    options: &[("window", 64.0, "queries in the observation window"), ("kernel", 5.0, "width of the pooling")],
    budgeted: true,
    check: |budget, options| {
        let (window, kernel) = (options.get("window", 64.0), options.get("kernel", 5.0));
        if window < 1.0 || window.fract() != 0.0 || window >= budget as f64 {
            return Err(format!(
                "window = {window}: a whole number of queries, 1 or more and below the budget of {budget}"
            ));
        }
        match kernel >= 1.0 && kernel.fract() == 0.0 && kernel as i64 % 2 == 1 {
            true => Ok(()),
            false => Err(format!("kernel = {kernel}: an odd whole number")),
        }
    },
    build: |budget, options| {
        let (window, kernel) = (options.get("window", 64.0) as i64, options.get("kernel", 5.0) as i64);
        Box::new(SnapKv { budget, window, kernel, queries: None, pending: 0 })
    },
};

struct SnapKv {
    budget: i64,
    window: i64,
    kernel: i64,
    /// The last `window` queries `(b, heads, ≤ window, head_dim)` and their positions.
    queries: Option<(Tensor, Tensor)>,
    /// Tokens come in since the last press.
    pending: i64,
}

impl LayerPolicy for SnapKv {
    fn fork(&self) -> Box<dyn LayerPolicy> {
        let queries = self.queries.as_ref().map(|(q, pos)| (q.copy(), pos.copy()));
        Box::new(SnapKv {
            budget: self.budget,
            window: self.window,
            kernel: self.kernel,
            queries,
            pending: self.pending,
        })
    }

    fn state(&self) -> Vec<(&'static str, Tensor)> {
        let mut state = vec![("pending", Tensor::from(self.pending))];
        if let Some((q, pos)) = &self.queries {
            state.extend([("queries", q.shallow_clone()), ("query_positions", pos.shallow_clone())]);
        }
        state
    }

    fn restore(&mut self, state: Vec<(String, Tensor)>) -> std::result::Result<(), String> {
        let (mut queries, mut positions) = (None, None);
        for (name, t) in state {
            match name.as_str() {
                "pending" => self.pending = saved(&name, t, 0, Kind::Int64)?.int64_value(&[]),
                "queries" => queries = Some(saved_float(&name, t, 4)?),
                "query_positions" => positions = Some(saved(&name, t, 1, Kind::Int64)?),
                _ => return Err(format!("`{name}`: SnapKV keeps pending, queries and query_positions")),
            }
        }
        self.queries = match (queries, positions) {
            (Some(q), Some(pos)) if q.size()[2] == pos.size()[0] => Some((q, pos)),
            (None, None) => None,
            _ => return Err("`queries` and `query_positions`: one of each, of the same length".into()),
        };
        Ok(())
    }

    fn fits(&self, held: Option<&Held>) -> std::result::Result<(), String> {
        if self.pending < 0 {
            return Err(format!("`pending`: {} is negative", self.pending));
        }
        let Some((q, _)) = &self.queries else { return Ok(()) };
        let Some(held) = held else { return sized("queries", Some(q), None) };
        let (size, keys) = (q.size(), held.keys.size());
        if size[0] != keys[0] || size[1] % keys[1] != 0 || size[2] > self.window || size[3] != keys[3] {
            return Err(format!(
                "`queries`: of shape {size:?}, where the keys held {keys:?} make ({}, a multiple of {}, at most {}, {})",
                keys[0], keys[1], self.window, keys[3]
            ));
        }
        Ok(())
    }

    fn same_entries_in_every_head(&self) -> bool {
        false
    }

    fn update(&mut self, held: &mut Held, chunk: &Chunk) {
        let t = chunk.queries.size()[2];
        let (q, pos) = match self.queries.take() {
            Some((q, pos)) => {
                let q = q.to_kind(chunk.queries.kind()); // a saved cache's, as the model computes
                (Tensor::cat(&[&q, chunk.queries], 2), Tensor::cat(&[&pos, chunk.query_positions], 0))
            }
            None => (chunk.queries.shallow_clone(), chunk.query_positions.shallow_clone()),
        };
        let m = q.size()[2].min(self.window);
        let (q, pos) = (q.narrow(2, q.size()[2] - m, m), pos.narrow(0, pos.size()[0] - m, m));
        self.pending += t;
        let n = held.len();
        if n > self.budget && (self.pending >= self.window || n > self.budget + self.window) {
            held.keep(&self.press(held, &q, &pos, chunk.scale));
            self.pending = 0;
            self.queries = None;
        } else {
            self.queries = Some((q, pos));
        }
    }
}

impl SnapKv {
    /// The entries to keep: the best `budget - m` older ones and the `m` newest, whose
    /// queries `q` `(b, heads, m, head_dim)` at `pos` `(m)` are the window.
    fn press(&self, held: &Held, q: &Tensor, pos: &Tensor, scale: f64) -> Tensor {
        let (b, kv_heads, n) = held.positions.size3().expect("(b, kv_heads, n)");
        let (heads, m) = (q.size()[1], q.size()[2]);
        let group = heads / kv_heads;
        let keys = held.keys.repeat_interleave_self_int(group, 1, None);
        let positions = held.positions.repeat_interleave_self_int(group, 1, None).unsqueeze(2); // (b, h, 1, n)
        let unseen = positions.gt_tensor(&pos.view([1, 1, m, 1]));
        let scores = (q.matmul(&keys.transpose(-2, -1)) * scale).masked_fill(&unseen, f64::NEG_INFINITY);
        let weights = scores.softmax(-1, Kind::Float).narrow(3, 0, n - m); // (b, h, m, n - m)
        let pad = self.kernel / 2;
        let pooled =
            weights.mean_dim([2i64].as_slice(), false, Kind::Float).avg_pool1d([self.kernel], [1], [pad], false, true);
        let pooled = pooled.view([b, kv_heads, group, n - m]).mean_dim([2i64].as_slice(), false, Kind::Float);
        let window = Tensor::arange_start(n - m, n, (Kind::Int64, pooled.device())).expand([b, kv_heads, -1], false);
        Tensor::cat(&[top(&pooled, self.budget - m), window], 2)
    }
}
