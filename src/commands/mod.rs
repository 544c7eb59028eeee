//! The commands, one file per group: each function takes its parsed arguments, calls the
//! library and prints. `main` dispatches to them.

pub(crate) mod bench;
pub(crate) mod decoder;
pub(crate) mod dialogue;
pub(crate) mod inspect;
pub(crate) mod learned;
pub(crate) mod longeval;
pub(crate) mod plot;
pub(crate) mod tokenizer;
pub(crate) mod train;
