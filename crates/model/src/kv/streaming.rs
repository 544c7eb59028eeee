//! StreamingLLM (Xiao et al., 2023, "Efficient Streaming Language Models with Attention
//! Sinks"): the first `sinks` entries (4 in the paper), on which attention piles up
//! whatever they hold, and a rolling window of the most recent ones, `budget` in all.
//!
//! Positions are re-assigned inside the cache (Sec. 3.2): the keys are held unrotated
//! and rotated at their place in the cache at every step, the queries at the places
//! after it. A cache holding the tokens `[0, 1, 2, 3, 6, 7, 8]` reads the 9th with the
//! positions `[0, 1, 2, 3, 4, 5, 6, 7]`, not `[0, 1, 2, 3, 6, 7, 8, 9]`, so the distances
//! the model sees never exceed the budget.

use super::{Chunk, Entry, Held, LayerPolicy, Positions};

pub const ENTRY: Entry = Entry {
    name: "streaming",
    about: "StreamingLLM: attention sinks and a window, positions re-assigned in the cache",
    options: &[("sinks", 4.0, "first entries always kept")],
    budgeted: true,
    check: |budget, options| {
        let sinks = options.get("sinks", 4.0);
        if sinks < 0.0 || sinks.fract() != 0.0 {
            return Err(format!("sinks = {sinks}: a whole number, 0 or more"));
        }
        match (sinks as i64) < budget {
            true => Ok(()),
            false => Err(format!("its {sinks} sinks leave no room for a window in a budget of {budget}")),
        }
    },
    build: |budget, options| Box::new(Streaming { budget, sinks: options.get("sinks", 4.0) as i64 }),
};

struct Streaming {
    budget: i64,
    sinks: i64,
}

impl LayerPolicy for Streaming {
    fn fork(&self) -> Box<dyn LayerPolicy> {
        Box::new(Streaming { budget: self.budget, sinks: self.sinks })
    }

    fn positions(&self) -> Positions {
        Positions::InCache
    }

    fn update(&mut self, held: &mut Held, _: &Chunk) {
        let n = held.len();
        if n > self.budget {
            let window = self.budget - self.sinks;
            held.keep_ranges(&[(0, self.sinks), (n - window, window)]);
        }
    }
}
