//! The task registry: every task lethe knows, one line each in [`of`], and the
//! functions the commands call, which ask the task the config names.
//!
//! A new task is a file that implements [`Task`] (see [`spec`]), its settings in
//! [`lethe_core::config::tasks`] with a `data.source` name in [`Source`], and one line here.

pub mod spec;

pub use spec::{Metric, Task};

use crate::bytes::Corpus;
use crate::dialogue::Dialogue;
use crate::gridworld::corridor::CorridorSpec;
use crate::gridworld::portal::PortalSpec;
use crate::longctx::source::LongctxSpec;
use crate::seq::{Split, SplitData};
use crate::stream::TrainStreams;
use crate::tasks::collision::CollisionSpec;
use crate::tasks::copy::CopySpec;
use crate::tasks::instruction::InstructionSpec;
use crate::tasks::sorting::SortingSpec;
use crate::text::Wikitext;
use lethe_core::config::{Config, Source};
use lethe_core::error::{LetheError, Result};

/// The task `data.source` names.
pub fn of(source: Source) -> &'static dyn Task {
    match source {
        Source::Copy => &CopySpec,
        Source::Collision => &CollisionSpec,
        Source::Instruction => &InstructionSpec,
        Source::Sorting => &SortingSpec,
        Source::Longctx => &LongctxSpec,
        Source::File => &Corpus::File,
        Source::Folder => &Corpus::Folder,
        Source::Corridor => &CorridorSpec,
        Source::Portal => &PortalSpec,
        Source::Wikitext => &Wikitext,
        Source::Dialogue => &Dialogue,
    }
}

/// Every source, in the order messages list them.
pub const SOURCES: [Source; 11] = [
    Source::Copy,
    Source::Collision,
    Source::Instruction,
    Source::Sorting,
    Source::Longctx,
    Source::File,
    Source::Folder,
    Source::Wikitext,
    Source::Dialogue,
    Source::Corridor,
    Source::Portal,
];

/// Loads one split of the data the config names (see [`Task::load_split`]).
pub fn load_split(cfg: &Config, split: Split, batch: usize) -> Result<SplitData> {
    of(cfg.data.source).load_split(cfg, split, batch)
}

/// The training streams the config names, positioned at the start.
pub fn train_streams(cfg: &Config, batch: usize) -> Result<TrainStreams> {
    of(cfg.data.source).train_streams(cfg, batch)
}

/// One line on where the data comes from, for the training header.
pub fn describe(cfg: &Config) -> String {
    of(cfg.data.source).describe(&cfg.data)
}

/// The figure that says how well the config's task is solved.
pub fn metric(cfg: &Config) -> Metric {
    of(cfg.data.source).metric()
}

/// Applies the options every task may take, each in the task's own unit: `length`
/// (copy: most `A`s in a run; collision: steps per simulation; instruction: most
/// instructions per episode; sorting: symbols to sort; corridor: longest corridor;
/// portal: rooms) and `distance` (copy: filler tokens; instruction: distractor words;
/// corridor: corridor lengths), as `(min, max)`. A task without the option is an error
/// that names the tasks that take it.
pub fn apply_options(cfg: &mut Config, length: Option<usize>, distance: Option<(usize, usize)>) -> Result<()> {
    let task = of(cfg.data.source);
    if let Some(n) = length {
        if !task.set_length(&mut cfg.data, n) {
            let takers = takers(|t, d| t.set_length(d, 1));
            return Err(LetheError::config(
                "--length",
                n,
                format!("applies to the {takers} tasks, not to {}", task.name()),
            ));
        }
    }
    if let Some((lo, hi)) = distance {
        if !task.set_distance(&mut cfg.data, lo, hi) {
            let takers = takers(|t, d| t.set_distance(d, 1, 1));
            return Err(LetheError::config(
                "--distance",
                format!("{lo}-{hi}"),
                format!("applies to the {takers} tasks, not to {}", task.name()),
            ));
        }
    }
    Ok(())
}

/// The names of the tasks for which `accepts` (tried on a scratch config) is true.
fn takers(accepts: impl Fn(&dyn Task, &mut lethe_core::config::DataConfig) -> bool) -> String {
    let mut names: Vec<&str> =
        SOURCES.iter().map(|&s| of(s)).filter(|t| accepts(*t, &mut Default::default())).map(|t| t.name()).collect();
    names.dedup();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_has_its_task_under_the_same_name() {
        for s in SOURCES {
            assert_eq!(of(s).name(), s.name());
            assert_eq!(of(s).is_episodic(), s.is_rl(), "{s}");
        }
    }

    #[test]
    fn token_tasks_give_streams_and_splits_and_gridworlds_refuse_them() {
        for s in SOURCES.into_iter().filter(|s| !s.reads_text()) {
            let mut cfg = Config::default();
            cfg.data.source = s;
            let split = load_split(&cfg, Split::Valid, 2);
            if of(s).is_episodic() {
                assert!(split.unwrap_err().to_string().contains("not a token stream"), "{s}");
                assert!(train_streams(&cfg, 2).is_err(), "{s}");
            } else {
                assert_eq!(split.unwrap().docs.len(), 2, "{s}");
                assert!(train_streams(&cfg, 2).is_ok(), "{s}");
            }
        }
    }

    #[test]
    fn task_options_set_the_tasks_own_unit_and_others_are_refused_with_the_takers() {
        let mut cfg = Config::default();
        apply_options(&mut cfg, Some(5), Some((10, 20))).unwrap();
        assert_eq!((cfg.data.copy.count_max, cfg.data.copy.distance_min, cfg.data.copy.distance_max), (5, 10, 20));
        cfg.data.source = Source::Portal;
        apply_options(&mut cfg, Some(7), None).unwrap();
        assert_eq!(cfg.data.portal.rooms, 7);
        let msg = apply_options(&mut cfg, None, Some((1, 2))).unwrap_err().to_string();
        assert!(
            msg.contains("--distance")
                && msg.contains("copy, instruction and corridor")
                && msg.contains("not to portal"),
            "{msg}"
        );
        cfg.data.source = Source::File;
        let msg = apply_options(&mut cfg, Some(3), None).unwrap_err().to_string();
        assert!(msg.contains("--length") && msg.contains("sorting, corridor and portal tasks, not to file"), "{msg}");
    }
}
