//! The full cache: every entry is kept, as the model was trained to read.

use super::{Chunk, Entry, Held, LayerPolicy};

pub const ENTRY: Entry = Entry {
    name: "full",
    about: "every entry (no budget)",
    options: &[],
    budgeted: false,
    check: |_, _| Ok(()),
    build: |_, _| Box::new(Full),
};

struct Full;

impl LayerPolicy for Full {
    fn fork(&self) -> Box<dyn LayerPolicy> {
        Box::new(Full)
    }

    fn update(&mut self, _: &mut Held, _: &Chunk) {}
}
