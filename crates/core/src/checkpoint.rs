//! Checkpoints: one safetensors file holding the model parameters (named by module path,
//! so `safetensors.torch.load_file` reads them), the optimiser moments (`optim.*`), the
//! memory carried by each stream group (`memory.<group>.layers.<i>.*`), and in its
//! metadata the resolved config (TOML), the training state (JSON: step, data position,
//! random state) and a CRC-32 of every tensor's bytes (JSON `checksums`), checked on
//! load so that flipped bits are caught, not computed with.
//!
//! Writes are atomic: the bytes go to a temporary file in the same folder, which is
//! fsynced and renamed over the old checkpoint, then the folder is fsynced. A crash at
//! any moment leaves either the old checkpoint or the new one, never a torn file.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::config::Config;
use crate::error::{LetheError, Result};

/// File name of a run's checkpoint inside its run folder.
pub const FILE_NAME: &str = "checkpoint.safetensors";
const FORMAT: &str = "lethe-checkpoint-1";
/// Keys of the config's and the training state's checksums (no tensor name has brackets).
const CONFIG_SUM: &str = "(config)";
const STATE_SUM: &str = "(state)";

/// Where training stands, for exact resume.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Optimiser steps completed.
    pub step: usize,
    /// Where the trainer's data stands (the language-model trainer's stream positions,
    /// the RL trainer's episodes in progress), serialised by the trainer that owns it, so
    /// that the checkpoint format names no trainer's types.
    pub data: serde_json::Value,
    /// Tokens consumed so far (all streams).
    pub tokens_seen: u64,
    /// Data-parallel ranks that trained it (their memories are `memory.<g>.*`, rank `r`'s
    /// micro-batch `i` at `g = r * accum + i`). 1 for a single process, and for
    /// checkpoints written before lethe trained on several.
    #[serde(default = "one")]
    pub world_size: usize,
    /// `memory.expire.target`'s controller of the span loss's weight: its integral factor
    /// and the last memory over the target. None without a target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span_target: Option<[f64; 2]>,
}

fn one() -> usize {
    1
}

impl TrainState {
    /// The state after `step` steps, with the trainer's own `data` position.
    pub fn new(step: usize, data: &impl Serialize, tokens_seen: u64) -> Result<Self> {
        Ok(TrainState { step, data: serde_json::to_value(data)?, tokens_seen, world_size: 1, span_target: None })
    }

    /// The trainer's data position, as the trainer saved it; `None` when it is of another
    /// kind (another trainer's).
    pub fn data<D: serde::de::DeserializeOwned>(&self) -> Option<D> {
        serde_json::from_value(self.data.clone()).ok()
    }
}

/// A loaded checkpoint.
pub struct Checkpoint {
    /// Where it was read from.
    pub path: PathBuf,
    /// The config it was trained with.
    pub config: Config,
    /// The training state, when saved by `train`.
    pub state: Option<TrainState>,
    tensors: HashMap<String, Tensor>,
}

/// The checkpoint file for `path`: the path itself when it is a file, or
/// `<path>/checkpoint.safetensors` when it is a run folder.
pub fn resolve(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join(FILE_NAME)
    } else {
        path.to_path_buf()
    }
}

fn dtype_of(kind: Kind) -> Result<Dtype> {
    match kind {
        Kind::Float => Ok(Dtype::F32),
        Kind::Double => Ok(Dtype::F64),
        Kind::Int64 => Ok(Dtype::I64),
        Kind::BFloat16 => Ok(Dtype::BF16),
        Kind::Half => Ok(Dtype::F16),
        k => Err(LetheError::Invalid(format!("cannot save tensors of kind {k:?}"))),
    }
}

fn kind_of(dtype: Dtype) -> Option<Kind> {
    match dtype {
        Dtype::F32 => Some(Kind::Float),
        Dtype::F64 => Some(Kind::Double),
        Dtype::I64 => Some(Kind::Int64),
        Dtype::BF16 => Some(Kind::BFloat16),
        Dtype::F16 => Some(Kind::Half),
        _ => None,
    }
}

/// Writes a checkpoint atomically to `path`.
pub fn save(path: &Path, config: &Config, state: &TrainState, tensors: &[(String, Tensor)]) -> Result<()> {
    let mut raw = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let t = t.detach().to_device(tch::Device::Cpu).contiguous();
        let mut bytes = vec![0u8; t.numel() * t.kind().elt_size_in_bytes()];
        t.f_copy_data_u8(&mut bytes, t.numel())
            .map_err(|e| LetheError::checkpoint(path, format!("reading tensor `{name}`: {e}")))?;
        let shape: Vec<usize> = t.size().iter().map(|&s| s as usize).collect();
        raw.push((name.clone(), dtype_of(t.kind())?, shape, bytes));
    }
    let config_text = config.to_toml()?;
    let state_text = serde_json::to_string(state)?;
    let mut checksums: std::collections::BTreeMap<&str, u32> =
        raw.iter().map(|(n, _, _, b)| (n.as_str(), crc32fast::hash(b))).collect();
    checksums.insert(CONFIG_SUM, crc32fast::hash(config_text.as_bytes()));
    checksums.insert(STATE_SUM, crc32fast::hash(state_text.as_bytes()));
    let views = raw
        .iter()
        .map(|(n, d, s, b)| TensorView::new(*d, s.clone(), b).map(|v| (n.as_str(), v)))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| LetheError::checkpoint(path, said(&e)))?;
    let metadata = HashMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("config".to_string(), config_text),
        ("state".to_string(), state_text),
        ("checksums".to_string(), serde_json::to_string(&checksums)?),
    ]);
    let bytes = safetensors::serialize(views, &Some(metadata)).map_err(|e| LetheError::checkpoint(path, said(&e)))?;
    write_atomic(path, &bytes)
}

/// Writes `bytes` to `path` through a temporary file, fsync and rename. When any of it
/// fails (a full disk), the temporary file is removed, so that it does not keep the
/// disk full, and `path` is left as it was.
///
/// An existing folder, FIFO or device at `path` is refused: the rename would replace it.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(kind) = path.symlink_metadata().ok().and_then(|m| crate::input::not_a_file(&m.file_type())) {
        return Err(LetheError::Invalid(format!("`{}` is {kind}, not a file lethe can write", path.display())));
    }
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = crate::output::temporary(path);
    // Named by the file the user asked for: the temporary one is gone when this is said.
    let written = write_synced(&tmp, bytes).map_err(|e| LetheError::io(path, e));
    let renamed = written.and_then(|()| std::fs::rename(&tmp, path).map_err(|e| LetheError::io(path, e)));
    if renamed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    renamed?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all(); // best effort: not every filesystem can fsync a folder
    }
    Ok(())
}

/// A safetensors error in words (the crate's own `Display` is its `Debug` rendering).
fn said(e: &safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::InvalidHeader | E::InvalidHeaderStart | E::InvalidHeaderDeserialization | E::InvalidHeaderLength => {
            "its header is not a safetensors header".into()
        }
        E::HeaderTooLarge => NOT_SAFETENSORS.into(),
        E::HeaderTooSmall => "it is shorter than a safetensors header".into(),
        E::TensorNotFound(name) => format!("no tensor `{name}`"),
        E::TensorInvalidInfo => "a tensor's shape, type and size disagree".into(),
        E::InvalidOffset(name) => format!("tensor `{name}` lies outside the file"),
        E::IoError(io) => io.to_string(),
        E::JsonError(json) => format!("its header: {json}"),
        E::InvalidTensorView(dtype, shape, size) => {
            format!("a {dtype:?} tensor of shape {shape:?} cannot hold {size} bytes")
        }
        E::MetadataIncompleteBuffer => "its tensors do not cover the file: it was cut short or added to".into(),
        E::ValidationOverflow => "a tensor's size overflows".into(),
    }
}

/// What libtorch's reader (through tch) said of a safetensors file, in lethe's words:
/// tch renders the safetensors error's Rust name (`safetensors error PATH:
/// TensorInvalidInfo`), which becomes [`said`]'s phrase; anything else is kept.
pub fn safetensors_reason(message: &str) -> String {
    use safetensors::SafeTensorError as E;
    let Some((_, name)) = message.rsplit_once(": ") else { return message.to_string() };
    let quoted = || name.split('"').nth(1).unwrap_or("?").to_string();
    let error = match name.split('(').next().unwrap_or(name) {
        "InvalidHeader" => E::InvalidHeader,
        "InvalidHeaderStart" => E::InvalidHeaderStart,
        "InvalidHeaderDeserialization" => E::InvalidHeaderDeserialization,
        "InvalidHeaderLength" => E::InvalidHeaderLength,
        "HeaderTooLarge" => E::HeaderTooLarge,
        "HeaderTooSmall" => E::HeaderTooSmall,
        "TensorInvalidInfo" => E::TensorInvalidInfo,
        "InvalidOffset" => E::InvalidOffset(quoted()),
        "TensorNotFound" => E::TensorNotFound(quoted()),
        "MetadataIncompleteBuffer" => E::MetadataIncompleteBuffer,
        "ValidationOverflow" => E::ValidationOverflow,
        _ => return message.to_string(),
    };
    said(&error)
}

/// Creates `path` with `bytes`, flushed to the disk.
fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// The longest header [`read_config`] reads, safetensors' own bound.
const MAX_HEADER: u64 = 100_000_000;

/// What a file whose first 8 bytes announce a header past [`MAX_HEADER`] is: a text, or
/// anything but a safetensors file (whose first 8 bytes are its header's length).
const NOT_SAFETENSORS: &str =
    "not a safetensors file: its first 8 bytes, read as the length of its header, give more than 100 MB";

/// The config of the checkpoint at `path` (a file, or a run folder's), read from the
/// file's header alone and checked against its checksum as [`Checkpoint::load`] checks
/// it: for a caller that needs no tensor, without reading the parameters.
pub fn read_config(path: &Path) -> Result<Config> {
    use std::io::Read;
    let path = resolve(path);
    crate::input::check_file(&path).map_err(|e| LetheError::checkpoint(&path, e))?;
    let corrupt = |what: &str| LetheError::checkpoint(&path, format!("corrupt or truncated ({what})"));
    let mut file =
        std::fs::File::open(&path).map_err(|e| LetheError::checkpoint(&path, format!("cannot read: {e}")))?;
    let mut length = [0u8; 8];
    file.read_exact(&mut length).map_err(|_| corrupt("it ends before its header"))?;
    let length = u64::from_le_bytes(length);
    if length > MAX_HEADER {
        return Err(LetheError::checkpoint(&path, NOT_SAFETENSORS));
    }
    let mut header = vec![0u8; length as usize];
    file.read_exact(&mut header).map_err(|_| corrupt("it ends inside its header"))?;
    let header: serde_json::Value = serde_json::from_slice(&header).map_err(|_| corrupt("its header is not JSON"))?;
    let meta = |key: &str| header.get("__metadata__").and_then(|m| m.get(key)).and_then(serde_json::Value::as_str);
    if meta("format") != Some(FORMAT) {
        return Err(LetheError::checkpoint(&path, "not a lethe checkpoint (no `format` metadata)"));
    }
    let config_text = meta("config").ok_or_else(|| corrupt("no config"))?;
    if let Some(sums) = meta("checksums") {
        let sums: HashMap<String, u32> = serde_json::from_str(sums).map_err(|_| corrupt("checksums"))?;
        match sums.get(CONFIG_SUM) {
            Some(&sum) if sum == crc32fast::hash(config_text.as_bytes()) => {}
            Some(_) => return Err(corrupt("the config does not match its checksum: the file was changed or damaged")),
            None => return Err(corrupt("the config has no checksum")),
        }
    }
    Config::from_toml(config_text, &format!("config inside {}", path.display()))
}

impl Checkpoint {
    /// Reads and checks a checkpoint file (or a run folder's checkpoint).
    pub fn load(path: &Path) -> Result<Checkpoint> {
        let path = resolve(path);
        let bytes = crate::input::read(&path).map_err(|e| LetheError::checkpoint(&path, e))?;
        let corrupt = |what: String| LetheError::checkpoint(&path, format!("corrupt or truncated ({what})"));
        let unreadable = |e: safetensors::SafeTensorError| match e {
            safetensors::SafeTensorError::HeaderTooLarge => LetheError::checkpoint(&path, NOT_SAFETENSORS),
            e => corrupt(said(&e)),
        };
        let st = SafeTensors::deserialize(&bytes).map_err(unreadable)?;
        let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(unreadable)?;
        let meta = meta.metadata().clone().unwrap_or_default();
        if meta.get("format").map(String::as_str) != Some(FORMAT) {
            return Err(LetheError::checkpoint(&path, "not a lethe checkpoint (no `format` metadata)"));
        }
        let checksums: Option<HashMap<String, u32>> = match meta.get("checksums") {
            Some(s) => Some(serde_json::from_str(s).map_err(|e| corrupt(format!("checksums: {e}")))?),
            None => None, // written before checksums were kept
        };
        let check = |what: &str, key: &str, bytes: &[u8]| match checksums.as_ref().map(|sums| sums.get(key)) {
            None => Ok(()),
            Some(Some(&sum)) if sum == crc32fast::hash(bytes) => Ok(()),
            Some(Some(_)) => {
                Err(corrupt(format!("{what} does not match its checksum: the file was changed or damaged")))
            }
            Some(None) => Err(corrupt(format!("{what} has no checksum"))),
        };
        let config_text = meta.get("config").ok_or_else(|| corrupt("no config".into()))?;
        check("the config", CONFIG_SUM, config_text.as_bytes())?;
        let config = Config::from_toml(config_text, &format!("config inside {}", path.display()))?;
        let state = match meta.get("state") {
            Some(s) => {
                check("the training state", STATE_SUM, s.as_bytes())?;
                Some(serde_json::from_str(s).map_err(|e| corrupt(format!("training state: {e}")))?)
            }
            None => None,
        };
        // A tensor the checksums list must be in the file: one taken out (a memory's, say)
        // would otherwise load as an empty memory and train on without a word.
        if let Some(sums) = &checksums {
            let held: std::collections::HashSet<String> = st.names().into_iter().cloned().collect();
            let mut missing: Vec<&String> =
                sums.keys().filter(|k| *k != CONFIG_SUM && *k != STATE_SUM && !held.contains(*k)).collect();
            missing.sort();
            if let Some(first) = missing.first() {
                return Err(corrupt(format!(
                    "tensor `{first}` and {} more are listed in its checksums but missing: the file was changed",
                    missing.len() - 1
                )));
            }
        }
        let mut tensors = HashMap::new();
        for (name, view) in st.tensors() {
            check(&format!("tensor `{name}`"), &name, view.data())?;
            let kind = kind_of(view.dtype())
                .ok_or_else(|| corrupt(format!("tensor `{name}` has dtype {:?}", view.dtype())))?;
            let shape: Vec<i64> = view.shape().iter().map(|&s| s as i64).collect();
            let t = Tensor::f_from_data_size(view.data(), &shape, kind)
                .map_err(|e| corrupt(format!("tensor `{name}`: {e}")))?;
            tensors.insert(name, t);
        }
        Ok(Checkpoint { path, config, state, tensors })
    }

    /// The tensor called `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<Tensor> {
        self.tensors.get(name).map(Tensor::shallow_clone)
    }

    /// Tensors whose names start with `prefix`, with the prefix removed.
    pub fn with_prefix(&self, prefix: &str) -> Vec<(String, Tensor)> {
        let mut out: Vec<(String, Tensor)> = self
            .tensors
            .iter()
            .filter_map(|(n, t)| n.strip_prefix(prefix).map(|rest| (rest.to_string(), t.shallow_clone())))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The folder holding the run's own copy of its tokenizer (`tokenizer.json` beside
    /// the checkpoint, written when the run started), when the run was tokenised and
    /// the copy is there.
    pub fn run_tokenizer(&self) -> Option<PathBuf> {
        self.config.data.tokenizer.as_ref()?;
        self.path.parent().filter(|dir| dir.join("tokenizer.json").is_file()).map(Path::to_path_buf)
    }

    /// The model parameters by name (neither the optimiser's moments nor the memories).
    pub fn parameters(&self) -> HashMap<String, Tensor> {
        let state = |n: &str| n.starts_with("optim.") || n.starts_with("memory.");
        self.tensors.iter().filter(|(n, _)| !state(n)).map(|(n, t)| (n.clone(), t.shallow_clone())).collect()
    }

    /// Copies the saved parameters into `vars` (name -> variable). Every variable must be
    /// present with its exact shape, and no parameter may be left over.
    pub fn load_parameters(&self, vars: &HashMap<String, Tensor>) -> Result<()> {
        let _guard = tch::no_grad_guard();
        for (name, var) in vars {
            let saved = self.tensors.get(name).ok_or_else(|| {
                LetheError::checkpoint(
                    &self.path,
                    format!("has no parameter `{name}`: it was saved from a different model config"),
                )
            })?;
            if saved.size() != var.size() {
                return Err(LetheError::checkpoint(
                    &self.path,
                    format!(
                        "parameter `{name}` has shape {:?} but this model expects {:?}: it was saved from a different model config",
                        saved.size(),
                        var.size()
                    ),
                ));
            }
            if saved.is_floating_point() && saved.isfinite().all().int64_value(&[]) == 0 {
                return Err(LetheError::checkpoint(
                    &self.path,
                    format!("parameter `{name}` holds NaN or infinite values: this model cannot compute anything; resume from an earlier checkpoint"),
                ));
            }
            let mut v = var.shallow_clone();
            v.f_copy_(&saved.to_device(var.device()).to_kind(var.kind()))
                .map_err(|e| LetheError::checkpoint(&self.path, format!("parameter `{name}`: {e}")))?;
        }
        let extra: Vec<&String> = self
            .tensors
            .keys()
            .filter(|n| !n.starts_with("optim.") && !n.starts_with("memory.") && !vars.contains_key(*n))
            .collect();
        if let Some(name) = extra.first() {
            return Err(LetheError::checkpoint(
                &self.path,
                format!("has parameter `{name}` that this model lacks: it was saved from a different model config"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_safetensors_error_in_rusts_words_reads_as_lethes() {
        let said = safetensors_reason;
        assert_eq!(
            said("safetensors error w/m.safetensors: TensorInvalidInfo"),
            "a tensor's shape, type and size disagree"
        );
        assert_eq!(said("safetensors error m.safetensors: HeaderTooLarge"), NOT_SAFETENSORS);
        assert_eq!(
            said("safetensors error m: InvalidOffset(\"lm_head.weight\")"),
            "tensor `lm_head.weight` lies outside the file"
        );
        assert_eq!(said("No such file or directory (os error 2)"), "No such file or directory (os error 2)");
    }

    /// The config read from the header alone is the one `Checkpoint::load` reads; a
    /// changed config, a cut header and a file of another kind are refused in one line.
    #[test]
    fn a_config_is_read_from_the_header_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let config = Config { name: "header".into(), ..Config::default() };
        let state = TrainState::new(3, &serde_json::json!({}), 96).unwrap();
        save(&path, &config, &state, &[("w".into(), Tensor::ones([4], (Kind::Float, tch::Device::Cpu)))]).unwrap();
        assert_eq!(read_config(dir.path()).unwrap(), Checkpoint::load(&path).unwrap().config);
        assert_eq!(read_config(&path).unwrap().name, "header");

        let bytes = std::fs::read(&path).unwrap();
        let refused = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            let said = read_config(&path).unwrap_err().to_string();
            assert!(!said.contains('\n'), "{said}");
            said
        };
        // The config is TOML inside the JSON header: its quotes are escaped there.
        let at = bytes.windows(10).position(|w| w == br#"\"header\""#).expect("the name in the header");
        let mut changed = bytes.clone();
        changed[at + 3] = b'3';
        assert!(refused(&changed).contains("does not match its checksum"));
        assert!(refused(&bytes[..20]).contains("ends inside its header"));
        assert!(refused(&bytes[..4]).contains("ends before its header"));
        assert!(refused(&[255u8; 16]).contains("not a safetensors file"));
        let text = refused(b"a text, not a checkpoint\n");
        assert!(text.contains("not a safetensors file") && !text.contains("corrupt"), "{text}");
        let mut other = 2u64.to_le_bytes().to_vec();
        other.extend(b"{}");
        assert!(refused(&other).contains("not a lethe checkpoint"));
    }
}
