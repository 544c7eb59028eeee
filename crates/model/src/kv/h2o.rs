//! H2O, the heavy-hitter oracle (Zhang et al., 2023): each entry's score is the
//! attention it has received, accumulated over every query that has read it (Sec. 3.2,
//! Eq. 2's `o_i`, summed over steps); a layer keeps the `recent` share of its budget for
//! the most recent entries and the rest for the heavy hitters, the highest-scored among
//! the older ones (the paper's default: half and half).
//!
//! Scores are kept per key-value head, summed over the query heads that share it
//! (grouped-query attention), so each key-value head evicts its own entries.

use tch::{Kind, Tensor};

use super::{forked, per_kv_head, saved, sized, top, Chunk, Entry, Held, LayerPolicy};

pub const ENTRY: Entry = Entry {
    name: "h2o",
    about: "H2O: heavy hitters by accumulated attention and a recent window",
    options: &[("recent", 0.5, "share of the budget for the most recent entries")],
    budgeted: true,
    check: |_, options| match options.get("recent", 0.5) {
        recent if (0.0..=1.0).contains(&recent) => Ok(()),
        recent => Err(format!("recent = {recent}: a share in [0, 1]")),
    },
    build: |budget, options| {
        let recent = (budget as f64 * options.get("recent", 0.5)).round() as i64;
        Box::new(H2o { budget, recent, scores: None })
    },
};

struct H2o {
    budget: i64,
    /// Entries of the budget kept for the most recent.
    recent: i64,
    /// `(b, kv_heads, n)`: the attention each held entry has received.
    scores: Option<Tensor>,
}

impl LayerPolicy for H2o {
    fn fork(&self) -> Box<dyn LayerPolicy> {
        Box::new(H2o { budget: self.budget, recent: self.recent, scores: forked(&self.scores) })
    }

    fn state(&self) -> Vec<(&'static str, Tensor)> {
        self.scores.iter().map(|s| ("scores", s.shallow_clone())).collect()
    }

    fn restore(&mut self, state: Vec<(String, Tensor)>) -> std::result::Result<(), String> {
        for (name, t) in state {
            match name.as_str() {
                "scores" => self.scores = Some(saved(&name, t, 3, Kind::Float)?),
                _ => return Err(format!("`{name}`: H2O keeps its scores alone")),
            }
        }
        Ok(())
    }

    fn fits(&self, held: Option<&Held>) -> std::result::Result<(), String> {
        sized("scores", self.scores.as_ref(), held.map(|h| h.positions.size()).as_deref())
    }

    fn needs_weights(&self) -> bool {
        true
    }

    fn same_entries_in_every_head(&self) -> bool {
        false
    }

    fn update(&mut self, held: &mut Held, chunk: &Chunk) {
        let (b, kv_heads, n) = held.positions.size3().expect("(b, kv_heads, n)");
        let Some(weights) = chunk.weights else { return };
        let received = per_kv_head(weights, kv_heads);
        let scores = match self.scores.take() {
            Some(old) => {
                let fresh = Tensor::zeros([b, kv_heads, n - old.size()[2]], (Kind::Float, old.device()));
                Tensor::cat(&[old, fresh], 2) + received
            }
            None => received,
        };
        if n <= self.budget {
            self.scores = Some(scores);
            return;
        }
        let older = n - self.recent;
        let heavy = top(&scores.narrow(2, 0, older), self.budget - self.recent);
        let recent = Tensor::arange_start(older, n, (Kind::Int64, scores.device())).expand([b, kv_heads, -1], false);
        let keep = Tensor::cat(&[heavy, recent], 2);
        held.keep(&keep);
        self.scores = Some(scores.gather(2, &keep, false));
    }
}
