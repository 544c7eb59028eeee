//! A sliding window: the `budget` most recent entries, the keys at the positions they
//! were written at (what StreamingLLM (Xiao et al., 2023, Sec. 3.1) calls window
//! attention, which fails once the first tokens leave the cache).

use super::{Chunk, Entry, Held, LayerPolicy};

pub const ENTRY: Entry = Entry {
    name: "window",
    about: "the most recent entries",
    options: &[],
    budgeted: true,
    check: |_, _| Ok(()),
    build: |budget, _| Box::new(Window { budget }),
};

struct Window {
    budget: i64,
}

impl LayerPolicy for Window {
    fn fork(&self) -> Box<dyn LayerPolicy> {
        Box::new(Window { budget: self.budget })
    }

    fn update(&mut self, held: &mut Held, _: &Chunk) {
        let n = held.len();
        if n > self.budget {
            held.keep_ranges(&[(n - self.budget, self.budget)]);
        }
    }
}
