//! A training run's folder, `<out>/<name>`: the checks before a run may touch it, the
//! lock that keeps a second training out, and the files a run starts with.
//!
//! Nothing in the folder changes before the run is accepted: [`RunFolder::open`] checks
//! the options against what the folder holds and locks it, [`RunFolder::resumable`]
//! loads and checks the checkpoint to continue, and only [`RunFolder::commit`], called
//! once the data and the model are built, removes an old run (`--overwrite`), writes
//! `config.toml` and `machine.json` and cuts `metrics.jsonl` back to the checkpoint's step. A folder that
//! this run created and never committed is removed again.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use lethe_core::checkpoint::{self, Checkpoint};
use lethe_core::config::Config;
use lethe_core::dist::ProcessGroup;
use lethe_core::error::{LetheError, Result};
use lethe_core::metrics::MetricsLog;

/// Name of the lock file inside a run folder.
pub const LOCK_FILE: &str = ".lethe.lock";

/// The file in a run folder that says on what machine the run (or its last resume)
/// trained: the CPU, libtorch's thread count and [`lethe_core::device::numerics_fingerprint`].
pub const MACHINE_FILE: &str = "machine.json";

/// The contents of [`MACHINE_FILE`] for this process.
fn machine_json() -> String {
    let machine = serde_json::json!({
        "cpu": lethe_core::device::cpu_model(),
        "threads": tch::get_num_threads(),
        "numerics": lethe_core::device::numerics_fingerprint(),
    });
    format!("{machine:#}\n")
}

/// How a training run wants its folder: the part of `TrainOptions` the folder checks.
#[derive(Clone, Copy, Debug, Default)]
pub struct Intent {
    /// Continue from the folder's checkpoint.
    pub resume: bool,
    /// Replace the folder's run.
    pub overwrite: bool,
    /// Stop after this step (`--stop-after`).
    pub stop_after: Option<usize>,
    /// Resume under changed optimisation settings (`--accept-changes`).
    pub accept_changes: bool,
}

/// A locked run folder. The lock (an advisory `flock` on [`LOCK_FILE`]) is held until
/// this value is dropped.
pub struct RunFolder {
    /// The folder.
    pub dir: PathBuf,
    intent: Intent,
    _lock: File,
    /// The outermost folder this run created, if any (so that a refused run can remove
    /// it again).
    created: Option<PathBuf>,
    committed: bool,
}

impl RunFolder {
    /// Checks `intent` against the folder `dir` (without writing), then creates the
    /// folder if needed and locks it. Refuses a second training on the same folder.
    pub fn open(dir: &Path, intent: Intent) -> Result<RunFolder> {
        if dir.join(LOCK_FILE).is_file() {
            drop(try_lock(dir)?); // in use by another training: say so before anything else
        }
        check_intent(dir, intent)?;
        let created =
            dir.ancestors().take_while(|a| !a.as_os_str().is_empty() && !a.exists()).last().map(Path::to_path_buf);
        std::fs::create_dir_all(dir)
            .map_err(|e| LetheError::Invalid(format!("cannot create the run folder `{}`: {e}", dir.display())))?;
        let lock = match lock(dir) {
            Ok(lock) => lock,
            Err(e) => {
                if let Some(root) = &created {
                    let _ = std::fs::remove_dir_all(root);
                }
                return Err(e);
            }
        };
        Ok(RunFolder { dir: dir.to_path_buf(), intent, _lock: lock, created, committed: false })
    }

    /// The folder's checkpoint file.
    pub fn checkpoint_path(&self) -> PathBuf {
        self.dir.join(checkpoint::FILE_NAME)
    }

    /// When resuming, the folder's checkpoint, checked against `cfg`: same model, data
    /// and batch layout, a step before `train.steps`, and a `--stop-after` after it.
    pub fn resumable(&self, cfg: &Config) -> Result<Option<Checkpoint>> {
        if !self.intent.resume {
            return Ok(None);
        }
        let path = self.checkpoint_path();
        let ck = Checkpoint::load(&path)?;
        check_resumable(&ck, cfg, self.intent.accept_changes)?;
        let step = ck.state.as_ref().ok_or_else(|| LetheError::checkpoint(&path, "holds no training state"))?.step;
        if step >= cfg.train.steps {
            return Err(LetheError::checkpoint(
                &path,
                format!(
                    "is at step {step}, and train.steps is {}: nothing left to train; raise --steps to continue",
                    cfg.train.steps
                ),
            ));
        }
        if let Some(stop) = self.intent.stop_after.filter(|&s| s <= step) {
            return Err(LetheError::config(
                "--stop-after",
                stop,
                format!("must be after the checkpoint's step {step}"),
            ));
        }
        Ok(Some(ck))
    }

    /// Accepts the run: removes an old run's checkpoint (`--overwrite`), writes the
    /// resolved config, and opens the metrics log with the records after step `from`
    /// (the resumed checkpoint's, 0 for a new run) removed.
    pub fn commit(&mut self, cfg: &Config, from: usize) -> Result<MetricsLog> {
        if !self.intent.resume {
            let old = self.checkpoint_path();
            if old.exists() {
                std::fs::remove_file(&old).map_err(|e| LetheError::io(&old, e))?;
            }
        }
        checkpoint::write_atomic(&self.dir.join("config.toml"), cfg.to_toml()?.as_bytes())?;
        checkpoint::write_atomic(&self.dir.join(MACHINE_FILE), machine_json().as_bytes())?;
        // The run keeps its tokenizer, so that its checkpoints work wherever they go.
        if let Some(tokenizer) = lethe_data::text::tokenizer_of(cfg)?.filter(|_| !self.intent.resume) {
            checkpoint::write_atomic(&self.dir.join("tokenizer.json"), tokenizer.to_json()?.as_bytes())?;
        }
        let metrics = MetricsLog::open_from(&self.dir, from)?;
        self.committed = true;
        Ok(metrics)
    }
}

impl Drop for RunFolder {
    fn drop(&mut self) {
        if let Some(root) = self.created.as_ref().filter(|_| !self.committed) {
            let _ = std::fs::remove_dir_all(root);
        }
    }
}

/// The checks that need no write: resuming needs a checkpoint; a new run refuses to
/// replace one without `--overwrite`; the two flags exclude each other.
fn check_intent(dir: &Path, intent: Intent) -> Result<()> {
    let ckpt = dir.join(checkpoint::FILE_NAME);
    if intent.resume && intent.overwrite {
        return Err(LetheError::Invalid(
            "--resume continues a run and --overwrite replaces it: give one of them".into(),
        ));
    }
    if intent.stop_after == Some(0) {
        return Err(LetheError::config("--stop-after", 0, "must be at least 1 (the step after which to stop)"));
    }
    if intent.resume && !ckpt.exists() {
        return Err(LetheError::checkpoint(ckpt, "nothing to resume: no checkpoint in this run folder"));
    }
    // A folder that is not a run's (no lock, no checkpoint) but holds files a run
    // writes: they are somebody else's, and training would replace them.
    let is_run = ckpt.exists() || dir.join(LOCK_FILE).exists();
    if !is_run && !intent.overwrite {
        let theirs = lethe_core::output::RUN_FILES
            .iter()
            .map(|(name, _)| *name)
            .filter(|name| !name.contains('*'))
            .find(|name| dir.join(name).exists());
        if let Some(file) = theirs {
            return Err(LetheError::Invalid(format!(
                "`{}` is not a lethe run folder but holds `{file}`, which training would replace: pick another --name or --out (or --overwrite to replace it)",
                dir.display()
            )));
        }
    }
    if !intent.resume && !intent.overwrite && ckpt.exists() {
        return Err(LetheError::Invalid(format!(
            "run folder `{}` already holds a checkpoint: pass --resume to continue it, --overwrite to start over, or --name for a new run",
            dir.display()
        )));
    }
    Ok(())
}

/// Takes the folder's lock without waiting, and writes this process's id into it.
fn lock(dir: &Path) -> Result<File> {
    lethe_core::lock::lock(&dir.join(LOCK_FILE))?.map_err(|holder| in_use(dir, &holder))
}

/// Opens (creating if needed) and locks the folder's lock file, without writing to it;
/// refuses, naming the holder's pid, when another process holds the lock.
fn try_lock(dir: &Path) -> Result<File> {
    lethe_core::lock::try_lock(&dir.join(LOCK_FILE))?.map_err(|holder| in_use(dir, &holder))
}

/// The refusal of a run folder another training holds (`holder`: ` (process N)`).
fn in_use(dir: &Path, holder: &str) -> LetheError {
    LetheError::Invalid(format!(
        "run folder `{}` is in use by another training{holder}: wait for it to finish, or pick another --name",
        dir.display()
    ))
}

/// Fields that must be equal for a checkpoint to be resumed under a config.
const MUST_MATCH: &[&str] = &[
    "seed",
    "model.",
    "memory.",
    "data.",
    "train.batch",
    "train.block",
    "train.accum",
    "train.freeze_base",
    "train.lora_rank",
    "train.lora_alpha",
];

/// Optimisation settings: a resumed run keeps its own unless told to accept new ones.
const OPTIMISATION: &[&str] = &[
    "train.lr",
    "train.memory_lr",
    "train.warmup",
    "train.schedule",
    "train.min_lr_ratio",
    "train.beta1",
    "train.beta2",
    "train.eps",
    "train.optimizer",
    "train.weight_decay",
    "train.grad_clip",
];

/// The optimisation settings `cfg` changes from the checkpoint's, as `key old -> new`.
pub fn setting_changes(ck: &Checkpoint, cfg: &Config) -> Result<Vec<String>> {
    let (saved, now) = (flatten(&ck.config)?, flatten(cfg)?);
    let absent = "(none)".to_string();
    Ok(OPTIMISATION
        .iter()
        .filter_map(|&key| {
            let (old, new) = (saved.get(key).unwrap_or(&absent), now.get(key).unwrap_or(&absent));
            (old != new).then(|| format!("{key} {old} -> {new}"))
        })
        .collect())
}

/// Refuses to resume a checkpoint whose model, memory, data or batch layout differ from
/// `cfg`, naming the first field that differs; and one whose optimisation settings
/// differ, naming them all, unless `accept_changes`.
pub fn check_resumable(ck: &Checkpoint, cfg: &Config, accept_changes: bool) -> Result<()> {
    let saved = flatten(&ck.config)?;
    let now = flatten(cfg)?;
    let keys: BTreeSet<&String> = saved.keys().chain(now.keys()).collect();
    for key in keys {
        if !MUST_MATCH.iter().any(|p| key == p.trim_end_matches('.') || (p.ends_with('.') && key.starts_with(p))) {
            continue;
        }
        let absent = "(none)".to_string();
        let (old, value) = (saved.get(key).unwrap_or(&absent), now.get(key).unwrap_or(&absent));
        if old != value {
            return Err(LetheError::checkpoint(
                &ck.path,
                format!("was saved with {key} = {old}, but this run has {key} = {value}; a different model config cannot be resumed"),
            ));
        }
    }
    let changes = setting_changes(ck, cfg)?;
    if !changes.is_empty() && !accept_changes {
        let why = format!(
            "was trained with other optimisation settings ({}): resuming under them would not continue the same run; pass --accept-changes to resume with them anyway, or start a new run from this one with --init-from",
            changes.join(", ")
        );
        return Err(LetheError::checkpoint(&ck.path, why));
    }
    Ok(())
}

/// The line a resumed run prints: the checkpoint, its step, and the settings changed.
pub fn resumed_line(ck: &Checkpoint, cfg: &Config, step: usize) -> Result<String> {
    let changes = setting_changes(ck, cfg)?;
    let changed =
        if changes.is_empty() { String::new() } else { format!(", with changed settings: {}", changes.join(", ")) };
    Ok(format!("resumed from {} at step {step}{changed}", ck.path.display()))
}

/// The config as `dotted.key -> value` text.
fn flatten(cfg: &Config) -> Result<BTreeMap<String, String>> {
    let value = toml::Value::try_from(cfg).map_err(|e| LetheError::ConfigParse(e.to_string()))?;
    let mut out = BTreeMap::new();
    fn walk(prefix: &str, v: &toml::Value, out: &mut BTreeMap<String, String>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                    walk(&key, v, out);
                }
            }
            other => {
                out.insert(prefix.to_string(), other.to_string());
            }
        }
    }
    walk("", &value, &mut out);
    Ok(out)
}
/// Rank 0 (or a single process) locks the run folder and checks the checkpoint to
/// resume; the other ranks read that checkpoint without touching the folder. A
/// checkpoint of another number of ranks is refused before anything is written.
pub fn open_for_ranks(
    cfg: &Config,
    intent: Intent,
    dir: &Path,
    group: Option<&ProcessGroup>,
) -> Result<(Option<RunFolder>, Option<Checkpoint>)> {
    let (folder, resumed) = if group.is_none_or(|g| g.rank() == 0) {
        let folder = RunFolder::open(dir, intent)?;
        let resumed = folder.resumable(cfg)?;
        (Some(folder), resumed)
    } else if intent.resume {
        let ck = Checkpoint::load(&dir.join(checkpoint::FILE_NAME))?;
        check_resumable(&ck, cfg, intent.accept_changes)?;
        (None, Some(ck))
    } else {
        (None, None)
    };
    let world = group.map_or(1, ProcessGroup::world_size);
    if let Some((ck, state)) = resumed.as_ref().and_then(|ck| ck.state.as_ref().map(|s| (ck, s))) {
        if state.world_size != world {
            let reason = format!(
                "was written by {} rank(s), each carrying the memory of its own streams; resume it with the same number (torchrun --nproc-per-node {}), not {world}",
                state.world_size, state.world_size
            );
            return Err(LetheError::checkpoint(&ck.path, reason));
        }
    }
    Ok((folder, resumed))
}
