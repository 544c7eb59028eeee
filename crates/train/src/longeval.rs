//! Long-context evaluation of a trained model: each sample of lethe-data's
//! [`longctx`](lethe_data::longctx) tasks is streamed through the model block by block
//! with its memory carried (as [`crate::eval`] streams a corpus), the answer decoded
//! greedily after the sample's answer prefix and scored by string match, cell by cell
//! over a grid of tasks, lengths and depths. A task without a depth (the word-extraction
//! and reasoning tasks, whose facts are spread over the whole context) has one cell per
//! length, its depth left empty.
//!
//! A cell's figures are written as soon as it is done, to `longeval.csv` (atomically,
//! the whole table each time), so an interrupted run keeps every finished cell and a
//! rerun with the same grid skips them; the rows of another grid (other samples, seed or
//! haystack) in the same file are kept. Each row names what was evaluated (its
//! [`Cell::subject`]: the model's files' checksum, with a decoder's policy, budget and
//! block), and a table of another subject is refused rather than resumed or mixed. A
//! folder's table is locked while it is written ([`LOCK_FILE`]): a second evaluation
//! into the same folder is refused until the first ends.
//! `longeval.json` holds this grid's table when it is complete.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use lethe_core::error::{LetheError, Result};
use lethe_core::rng::Rng;
use lethe_data::longctx::{check_length, generate, score, takes_depth, Haystack, Spec, Units};
use lethe_data::Token;
use lethe_model::kv::{Budget, Policy};
use lethe_model::llama::{KvCache, Llama};
use lethe_model::Lm;

use crate::generate::{DecoderGenerator, Generator, Sampling};

/// What the suite is run on: a model that reads each sample's input and then answers,
/// one greedy token at a time.
pub trait Subject {
    /// A reader that has read `input`, a sample of `length` units (what a budget given
    /// as a fraction is a fraction of), calling `progress(units read, input length)` as
    /// it goes.
    fn read<'s>(
        &'s self,
        input: &[Token],
        length: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Box<dyn Reader + 's>>;
}

/// A model that has read a sample's input.
pub trait Reader {
    /// The most likely next token, fed back as the next input.
    fn next_token(&mut self) -> Result<Token>;
    /// What each layer's memory holds now (states, or entries a key-value head).
    fn memory_held(&self) -> Vec<usize>;
}

impl Subject for Lm {
    fn read<'s>(
        &'s self,
        input: &[Token],
        _length: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Box<dyn Reader + 's>> {
        let greedy = Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 };
        Ok(Box::new(Generator::with_progress(self, input, &greedy, progress)?))
    }
}

impl Reader for Generator<'_> {
    fn next_token(&mut self) -> Result<Token> {
        Generator::next_token(self)
    }
    fn memory_held(&self) -> Vec<usize> {
        Generator::memory_held(self)
    }
}

impl Reader for DecoderGenerator<'_> {
    fn next_token(&mut self) -> Result<Token> {
        DecoderGenerator::next_token(self)
    }
    fn memory_held(&self) -> Vec<usize> {
        DecoderGenerator::memory_held(self)
    }
}

/// A pretrained decoder under a key-value cache policy: each sample read `block` tokens
/// at a time into a cache that keeps what the policy says within the budget, resolved
/// against the sample's length (a fraction keeps that share of each sample).
pub struct Decoder<'a> {
    pub model: &'a Llama,
    /// The policy as `--policy` takes it (`snapkv:window=16`).
    pub policy: String,
    pub budget: Option<Budget>,
    pub block: usize,
}

impl Decoder<'_> {
    /// The policy for a sample of `length` tokens.
    pub fn policy_for(&self, length: usize) -> Result<Policy> {
        Policy::parse(&self.policy, self.budget, length as i64)
    }
}

impl Subject for Decoder<'_> {
    fn read<'s>(
        &'s self,
        input: &[Token],
        length: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Box<dyn Reader + 's>> {
        let cache = KvCache::new(self.policy_for(length)?);
        Ok(Box::new(DecoderGenerator::with_progress(self.model, cache, input, self.block, progress)?))
    }
}

/// The cells to evaluate: every task at every length and depth.
#[derive(Clone, Debug)]
pub struct Grid {
    /// Task names, as [`lethe_data::longctx::TASKS`] lists them.
    pub tasks: Vec<&'static str>,
    /// Sample lengths, in the model's units.
    pub lengths: Vec<usize>,
    /// Depths of the asked needles, in [0, 1].
    pub depths: Vec<f64>,
    /// Samples per cell.
    pub samples: usize,
    /// Seed of the samples (each cell's samples are the same whatever the grid).
    pub seed: u64,
    /// The text haystack for the tasks that take one.
    pub text: Option<Haystack>,
    /// How often a cell under way reports its samples, and a long sample its reading
    /// ([`REPORT_EVERY`]).
    pub report_every: std::time::Duration,
}

/// The most samples a cell may take (RULER scores 500 a cell).
pub const MAX_SAMPLES: usize = 100_000;

/// What [`run`] reports as it goes.
pub enum Progress<'a> {
    /// A cell is done: the cell, the cells done and the grid's total.
    Cell(&'a Cell, usize, usize),
    /// A long cell is under way: its task, length and depth, and the samples done of its total.
    Samples(&'a str, usize, Option<f64>, usize, usize),
    /// A long sample is being read: its cell's task, length and depth, which sample of
    /// how many, and the units of its input read so far and in all.
    Reading { task: &'a str, length: usize, depth: Option<f64>, sample: (usize, usize), read: (usize, usize) },
}

/// How often a cell under way reports its samples, and a long sample its reading:
/// [`Grid::report_every`] as `lethe longeval` runs it.
pub const REPORT_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// One cell's figures: a row of `longeval.csv`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// The task.
    pub task: String,
    /// The samples' length, in the model's units.
    pub length: usize,
    /// The asked needles' depth, in percent; none for a task without one.
    pub depth: Option<f64>,
    /// Samples scored.
    pub samples: usize,
    /// Seed of the samples.
    pub seed: u64,
    /// Mean score in [0, 1] (RULER's string match).
    pub accuracy: f64,
    /// States held per layer when the answer begins, averaged over layers and samples.
    pub memory: f64,
    /// Wall-clock seconds the cell took.
    pub seconds: f64,
    /// The haystack of the tasks whose haystack is text (`noise`, `digits`, or a text
    /// file's checksum): part of the grid.
    #[serde(default)]
    pub haystack: String,
    /// What was evaluated (see [`run`]); empty in a table written before rows named it.
    #[serde(default)]
    pub subject: String,
}

impl Cell {
    /// Whether this row is the cell `(task, length, depth)` of `grid`.
    fn is(&self, task: &str, length: usize, depth: Option<f64>, grid: &Grid) -> bool {
        self.task == task
            && self.length == length
            && self.at(depth)
            && self.samples == grid.samples
            && self.seed == grid.seed
            && self.haystack == grid.haystack_label()
    }

    /// Whether this row is at `depth` (in [0, 1]; none for a task without one).
    pub fn at(&self, depth: Option<f64>) -> bool {
        match (self.depth, depth) {
            (Some(percent), Some(d)) => (percent - 100.0 * d).abs() < 1e-9,
            (None, None) => true,
            _ => false,
        }
    }
}

impl Grid {
    /// The depths `task` is evaluated at: the grid's, or one empty depth for a task
    /// without one.
    pub fn depths_of(&self, task: &str) -> Vec<Option<f64>> {
        if takes_depth(task) {
            self.depths.iter().copied().map(Some).collect()
        } else {
            vec![None]
        }
    }

    /// How many cells the grid has.
    pub fn cells(&self) -> usize {
        self.tasks.iter().map(|t| self.depths_of(t).len() * self.lengths.len()).sum()
    }

    /// The haystack as a row names it: `noise` (the default), `digits`, or a text's
    /// length and checksum.
    pub fn haystack_label(&self) -> String {
        match &self.text {
            None | Some(Haystack::Noise) => "noise".into(),
            Some(Haystack::Digits) => "digits".into(),
            Some(Haystack::Text(text)) => {
                format!("text of {} bytes, crc32 {:08x}", text.len(), crc32fast::hash(text.as_bytes()))
            }
            Some(Haystack::Needles { .. }) => "needles".into(),
        }
    }
}

/// Evaluates every cell of `grid` that `out/longeval.csv` does not already hold, writing
/// the table after each; `progress` is told of each cell done (with the number done
/// and the total) and, every [`Grid::report_every`], of the samples of a long cell or
/// the reading of a long sample. `who` names the subject in each row (a [`fingerprint`]
/// of its files, with its settings): a table that names another is refused before
/// anything is evaluated. Returns the whole table, in the grid's order.
pub fn run(
    subject: &dyn Subject,
    units: &dyn Units,
    grid: &Grid,
    (out, who): (&Path, &str),
    mut progress: impl FnMut(Progress),
) -> Result<Vec<Cell>> {
    check(grid, units)?;
    let _lock = lock_table(out)?;
    let csv_path = out.join("longeval.csv");
    let mut done = read_table(&csv_path)?;
    refuse_another_subject(&csv_path, &done, who)?;
    let total = grid.cells();
    let mut table = Vec::with_capacity(total);
    for &task in &grid.tasks {
        for &length in &grid.lengths {
            for depth in grid.depths_of(task) {
                let cell = match done.iter().position(|c| c.is(task, length, depth, grid)) {
                    Some(i) => done.swap_remove(i),
                    None => {
                        let mut cell = evaluate(subject, units, grid, (task, length, depth), &mut progress)?;
                        cell.subject = who.to_string();
                        let mut rows = table.clone();
                        rows.push(cell.clone());
                        rows.extend(done.iter().cloned());
                        write_table(&csv_path, &rows)?;
                        cell
                    }
                };
                table.push(cell);
                progress(Progress::Cell(table.last().expect("a cell was pushed"), table.len(), total));
            }
        }
    }
    // The rows of other grids (other lengths, seeds or sample counts) stay after this one's.
    write_table(&csv_path, &[table.as_slice(), done.as_slice()].concat())?;
    let json = serde_json::to_vec_pretty(&table)?;
    lethe_core::output::write("--out", &out.join("longeval.json"), &json, &[])?;
    Ok(table)
}

/// The lock file of a folder's table: a second `lethe longeval` writing into the same
/// folder would write the table over with its own cells, the first one's lost.
pub const LOCK_FILE: &str = ".longeval.lock";

/// Locks `out`'s table for this process, refusing one another process is writing.
fn lock_table(out: &Path) -> Result<std::fs::File> {
    lethe_core::lock::lock(&out.join(LOCK_FILE))?.map_err(|holder| {
        LetheError::Invalid(format!(
            "--out `{}`: its longeval.csv is being written by another lethe longeval{holder}: wait for it to finish, or give another --out",
            out.display()
        ))
    })
}

/// Refuses a table whose rows name another subject than `who` (or none: a table written
/// before rows named it), so that one model's figures are never resumed as another's.
fn refuse_another_subject(path: &Path, rows: &[Cell], who: &str) -> Result<()> {
    let Some(other) = rows.iter().find(|c| c.subject != who) else { return Ok(()) };
    let theirs = if other.subject.is_empty() { "a model it does not name".to_string() } else { other.subject.clone() };
    Err(LetheError::Invalid(format!(
        "--out: `{}` holds the results of {theirs}, not of this evaluation ({who}): give another --out, or remove the file to start over",
        path.display()
    )))
}

/// A checksum of `files` (their bytes, in order) with their total size, naming a model
/// in a table's rows: `crc32 1a2b3c4d of 5.2 MB`.
pub fn fingerprint(files: &[PathBuf]) -> Result<String> {
    use std::io::Read;
    let mut hasher = crc32fast::Hasher::new();
    let (mut total, mut buf) = (0u64, vec![0u8; 1 << 20]);
    for path in files {
        let mut file = std::fs::File::open(path).map_err(|e| LetheError::io(path.clone(), e))?;
        loop {
            let n = file.read(&mut buf).map_err(|e| LetheError::io(path.clone(), e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            total += n as u64;
        }
    }
    Ok(format!("crc32 {:08x} of {:.1} MB", hasher.finalize(), total as f64 / 1e6))
}

/// Refuses a count of samples a cell outside 1 to [`MAX_SAMPLES`].
pub fn check_samples(samples: usize) -> Result<()> {
    if samples == 0 || samples > MAX_SAMPLES {
        return Err(LetheError::Invalid(format!("--samples {samples}: must be from 1 to {MAX_SAMPLES} a cell")));
    }
    Ok(())
}

/// Refuses a grid with a cell that cannot be generated (a length too short for a task),
/// before any is evaluated: one sample of each task at the shortest length.
pub fn check(grid: &Grid, units: &dyn Units) -> Result<()> {
    check_samples(grid.samples)?;
    // A sample's text and units are held whole while it is built: bounded as any input.
    let longest = grid.lengths.iter().copied().max().unwrap_or(0) as u64;
    let most = lethe_core::input::max_bytes() / BYTES_PER_UNIT;
    if longest > most {
        return Err(LetheError::Invalid(format!(
            "--lengths {longest}: a sample that long would not fit in what lethe holds for one input (at most {most} units here)"
        )));
    }
    let Some(&shortest) = grid.lengths.iter().min() else { return Ok(()) };
    check_length(&grid.tasks, shortest, units, grid.text.as_ref())
        .map_err(|e| LetheError::Invalid(format!("--lengths {shortest}: {e}")))
}

/// What a unit of a sample costs while it is built (its text, its id, the copies).
const BYTES_PER_UNIT: u64 = 16;

/// The samples of one cell, read and answered; `progress` is told every
/// [`Grid::report_every`] of the samples done, or of the units read of a long sample.
fn evaluate(
    subject: &dyn Subject,
    units: &dyn Units,
    grid: &Grid,
    (task, length, depth): (&'static str, usize, Option<f64>),
    progress: &mut impl FnMut(Progress),
) -> Result<Cell> {
    let started = Instant::now();
    let mut reported = started;
    let spec = Spec { length, depth: depth.unwrap_or(0.0), text: grid.text.clone() };
    let (mut accuracy, mut memory) = (0.0, 0.0);
    for i in 0..grid.samples {
        let mut rng = Rng::derive(grid.seed, sample_index(task, length, depth, i));
        let sample = generate(task, &spec, units, &mut rng)?;
        let room = units.encode(&format!(" {}.", sample.answers.join(", ")))?.len() + ANSWER_SLACK;
        let mut reading = |read: usize, of: usize| {
            if reported.elapsed() >= grid.report_every && read < of {
                progress(Progress::Reading { task, length, depth, sample: (i + 1, grid.samples), read: (read, of) });
                reported = Instant::now();
            }
        };
        let mut reader = subject.read(&sample.input, length, &mut reading)?;
        let held = reader.memory_held();
        memory += held.iter().sum::<usize>() as f64 / held.len().max(1) as f64;
        let answer = (0..room).map(|_| reader.next_token()).collect::<Result<Vec<_>>>()?;
        accuracy += score(&units.decode(&answer)?, &sample.answers, &sample.scoring);
        if reported.elapsed() >= grid.report_every && i + 1 < grid.samples {
            progress(Progress::Samples(task, length, depth, i + 1, grid.samples));
            reported = Instant::now();
        }
    }
    let n = grid.samples.max(1) as f64;
    Ok(Cell {
        task: task.to_string(),
        length,
        depth: depth.map(|d| 100.0 * d),
        samples: grid.samples,
        seed: grid.seed,
        accuracy: accuracy / n,
        memory: memory / n,
        seconds: started.elapsed().as_secs_f64(),
        haystack: grid.haystack_label(),
        subject: String::new(),
    })
}

/// Units generated beyond the answers' own (RULER lets a model say a few words first).
const ANSWER_SLACK: usize = 8;

/// A sample's sub-stream of the seed: the same cell gives the same samples in any grid.
fn sample_index(task: &str, length: usize, depth: Option<f64>, i: usize) -> u64 {
    let mut h = crc32fast::Hasher::new();
    h.update(task.as_bytes());
    h.update(&(length as u64).to_le_bytes());
    if let Some(depth) = depth {
        h.update(&depth.to_bits().to_le_bytes());
    }
    (u64::from(h.finalize()) << 32) | i as u64
}

/// The rows of a `longeval.csv` that a previous run wrote; none when there is no file.
fn read_table(path: &Path) -> Result<Vec<Cell>> {
    if !path.exists() {
        return Ok(vec![]);
    }
    let bytes = lethe_core::input::read(path).map_err(|e| LetheError::data(path, e))?;
    csv::Reader::from_reader(bytes.as_slice())
        .deserialize()
        .collect::<std::result::Result<Vec<Cell>, _>>()
        .map_err(|e| LetheError::data(path, format!("is not a table lethe longeval wrote: {e}")))
}

/// Writes `rows` as `path`, atomically.
fn write_table(path: &Path, rows: &[Cell]) -> Result<()> {
    let mut writer = csv::Writer::from_writer(vec![]);
    for row in rows {
        writer.serialize(row)?;
    }
    let bytes = writer.into_inner().map_err(|e| LetheError::io(PathBuf::from(path), e.into_error()))?;
    lethe_core::output::write("--out", path, &bytes, &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_reads_back_as_written_and_a_foreign_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("longeval.csv");
        let row = Cell {
            task: "passkey".into(),
            length: 1024,
            depth: Some(50.0),
            samples: 2,
            seed: 7,
            accuracy: 0.5,
            memory: 128.0,
            seconds: 1.25,
            haystack: "noise".into(),
            subject: "crc32 00000001 of 0.1 MB".into(),
        };
        let spread = Cell { task: "qa1".into(), depth: None, ..row.clone() };
        write_table(&path, &[row.clone(), Cell { depth: Some(100.0), ..row.clone() }, spread.clone()]).unwrap();
        let back = read_table(&path).unwrap();
        assert_eq!(back, vec![row.clone(), Cell { depth: Some(100.0), ..row.clone() }, spread]);
        let grid = Grid {
            tasks: vec![],
            lengths: vec![],
            depths: vec![],
            samples: 2,
            seed: 7,
            text: None,
            report_every: REPORT_EVERY,
        };
        assert!(back[0].is("passkey", 1024, Some(0.5), &grid));
        assert!(!back[0].is("passkey", 1024, None, &grid));
        assert!(back[2].is("qa1", 1024, None, &grid));
        assert!(!back[0].is("passkey", 1024, Some(0.5), &Grid { seed: 8, ..grid.clone() }));
        std::fs::write(&path, "a,b\n1,2\n").unwrap();
        let err = read_table(&path).unwrap_err().to_string();
        assert!(err.contains("longeval.csv") && err.contains("not a table"), "{err}");
    }

    #[test]
    fn a_task_without_depth_has_one_cell_per_length() {
        let grid = Grid {
            tasks: vec!["passkey", "qa2", "cwe"],
            lengths: vec![1024, 2048],
            depths: vec![0.0, 0.5, 1.0],
            samples: 1,
            seed: 0,
            text: None,
            report_every: REPORT_EVERY,
        };
        assert_eq!(grid.depths_of("passkey"), vec![Some(0.0), Some(0.5), Some(1.0)]);
        assert_eq!(grid.depths_of("qa2"), vec![None]);
        assert_eq!(grid.cells(), 2 * 3 + 2 + 2);
    }

    /// A subject that reads its input in four steps, telling of each, and answers `7`.
    struct Sevens;

    impl Subject for Sevens {
        fn read<'s>(
            &'s self,
            input: &[Token],
            _length: usize,
            progress: &mut dyn FnMut(usize, usize),
        ) -> Result<Box<dyn Reader + 's>> {
            for quarter in 1..=4 {
                progress(input.len() * quarter / 4, input.len());
            }
            Ok(Box::new(Sevens))
        }
    }

    impl Reader for Sevens {
        fn next_token(&mut self) -> Result<Token> {
            Ok(Token::from(b'7'))
        }
        fn memory_held(&self) -> Vec<usize> {
            vec![3, 5]
        }
    }

    #[test]
    fn a_cell_under_way_reports_its_reading_and_its_samples() {
        let dir = tempfile::tempdir().unwrap();
        let grid = Grid {
            tasks: vec!["passkey"],
            lengths: vec![512],
            depths: vec![0.5],
            samples: 2,
            seed: 1,
            text: None,
            report_every: std::time::Duration::ZERO,
        };
        let mut events = vec![];
        let table = run(&Sevens, &lethe_data::longctx::ByteUnits, &grid, (dir.path(), "sevens"), |p| {
            events.push(match p {
                Progress::Reading { task, length, depth, sample, read } => {
                    format!("{task} {length} {depth:?}: sample {sample:?}, read {read:?}")
                }
                Progress::Samples(task, _, _, done, of) => format!("{task}: {done} of {of} samples"),
                Progress::Cell(cell, done, of) => format!("cell {done}/{of}: {}", cell.memory),
            })
        })
        .unwrap();
        assert_eq!(table.len(), 1);
        // Every sample's reading but its end (`read < of`), then the samples done but
        // the last, then the cell.
        let reading: Vec<&String> = events.iter().filter(|e| e.contains("read")).collect();
        assert_eq!(reading.len(), 6, "{events:?}");
        assert!(reading[0].starts_with("passkey 512 Some(0.5): sample (1, 2), read ("), "{events:?}");
        assert!(reading[3].starts_with("passkey 512 Some(0.5): sample (2, 2), read ("), "{events:?}");
        assert_eq!(events.iter().filter(|e| e.as_str() == "passkey: 1 of 2 samples").count(), 1, "{events:?}");
        assert_eq!(events.last().map(String::as_str), Some("cell 1/1: 4"), "{events:?}");
    }

    #[test]
    fn samples_differ_by_cell_and_index_but_not_by_grid() {
        let a = sample_index("passkey", 1024, Some(0.5), 0);
        assert_eq!(a, sample_index("passkey", 1024, Some(0.5), 0));
        assert_ne!(a, sample_index("passkey", 1024, Some(0.5), 1));
        assert_ne!(a, sample_index("passkey", 2048, Some(0.5), 0));
        assert_ne!(a, sample_index("passkey", 1024, Some(0.25), 0));
        assert_ne!(a, sample_index("niah_single_1", 1024, Some(0.5), 0));
    }
}
