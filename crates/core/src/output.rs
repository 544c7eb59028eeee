//! Where a command may write a file its user named: the one check every output path
//! passes before anything is written ([`check`]), and the atomic write after it
//! ([`write`]).
//!
//! An output path is refused, naming the flag that gave it, when it is
//!
//! - an existing folder, FIFO, device or socket: the atomic write renames a new file
//!   over the path, which would replace a device node, and a FIFO is nobody's file;
//! - the same file as one of the command's inputs (a CSV over the checkpoint it scores,
//!   the predictions it reads): the input would be gone;
//! - one of a run folder's own files ([`RUN_FILES`]: its config, checkpoint, metrics
//!   log, tokenizer, TensorBoard events, lock), which only training writes: a run
//!   folder is one that holds a checkpoint or a run's lock file.
//!
//! Any other path, a new file in a run folder included, is written atomically (a
//! temporary file in the same folder renamed over it), so that a failed or stopped
//! write leaves the old file whole.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::error::{LetheError, Result};

/// The files a training run keeps in its folder, with what each is; a `*` stands for
/// any text.
pub const RUN_FILES: &[(&str, &str)] = &[
    ("checkpoint.safetensors", "its checkpoint"),
    ("config.toml", "its config"),
    ("metrics.jsonl", "its metrics log"),
    ("machine.json", "the machine it trained on"),
    ("tokenizer.json", "its tokenizer"),
    (".lethe.lock", "its lock"),
    ("events.out.tfevents.*", "its TensorBoard events"),
    (".*.tmp", "a file being written"),
];

/// The temporary file (or folder) `path` is written into before it is renamed over it:
/// beside it, hidden, and this writer's own (the process and a count in it), so that
/// two commands writing the same output at once each write a whole one, rather than
/// into one together.
pub fn temporary(path: &Path) -> std::path::PathBuf {
    static WRITERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = WRITERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path.file_name().map_or_else(|| "output".into(), |n| n.to_string_lossy());
    path.with_file_name(format!(".{name}.{}-{n}.tmp", std::process::id()))
}

/// An output folder a command made, with the ancestors it lacked, so that a command that
/// fails before writing anything into it can leave the disk as it found it
/// ([`MadeFolder::unless_failed`]).
#[derive(Debug)]
pub struct MadeFolder {
    dir: std::path::PathBuf,
    /// The outermost folder made, when any was.
    outermost: Option<std::path::PathBuf>,
}

impl MadeFolder {
    /// Makes `dir` and the ancestors it lacks.
    pub fn make(dir: &Path) -> Result<Self> {
        let outermost =
            dir.ancestors().take_while(|a| !a.as_os_str().is_empty() && !a.exists()).last().map(Path::to_path_buf);
        std::fs::create_dir_all(dir).map_err(|e| LetheError::io(dir, e))?;
        Ok(MadeFolder { dir: dir.to_path_buf(), outermost })
    }

    /// `done`, passed on; when it failed, the folders made are removed while empty
    /// ([`MadeFolder::remove_if_empty`]).
    pub fn unless_failed<T, E>(&self, done: std::result::Result<T, E>) -> std::result::Result<T, E> {
        if done.is_err() {
            self.remove_if_empty();
        }
        done
    }

    /// Removes the folders made, innermost first, as long as each is empty: what anyone
    /// wrote into them stays.
    pub fn remove_if_empty(&self) {
        let Some(outermost) = &self.outermost else { return };
        for folder in self.dir.ancestors() {
            if std::fs::remove_dir(folder).is_err() || folder == outermost {
                return;
            }
        }
    }
}

/// Files whose presence makes a folder a run folder: its checkpoint, or its lock
/// (`run::folder::LOCK_FILE`, named here too: this layer sits below the run's).
const RUN_MARKERS: &[&str] = &[crate::checkpoint::FILE_NAME, ".lethe.lock"];

/// Refuses `path`, given by `flag`, as an output of a command that reads `inputs`
/// (files or folders; those that do not exist are skipped). See the module
/// documentation for what is refused.
pub fn check(flag: &str, path: &Path, inputs: &[&Path]) -> Result<()> {
    let refuse = |reason: String| Err(LetheError::Invalid(format!("{flag} `{}`: {reason}", path.display())));
    if let Some(kind) = path.metadata().ok().and_then(|m| crate::input::not_a_file(&m.file_type())) {
        return refuse(format!("is {kind}, not a file lethe can write; give a file path"));
    }
    if let Some(input) = inputs.iter().find(|input| same_file(path, input)) {
        return refuse(format!("is the same file as the input `{}`; write the output elsewhere", input.display()));
    }
    if let Some((folder, what)) = run_file(path) {
        return refuse(format!(
            "is {what} in the run folder `{}`, which only training writes; give another path",
            folder.display()
        ));
    }
    Ok(())
}

/// Checks `path` ([`check`]) and writes `bytes` to it atomically.
pub fn write(flag: &str, path: &Path, bytes: &[u8], inputs: &[&Path]) -> Result<()> {
    check(flag, path, inputs)?;
    crate::checkpoint::write_atomic(path, bytes)
}

/// Whether `a` and `b` both exist and are the same file (through links, `..` or not).
fn same_file(a: &Path, b: &Path) -> bool {
    match (a.metadata(), b.metadata()) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// When `path` names one of a run folder's own files: the folder and what the file is.
pub fn run_file(path: &Path) -> Option<(std::path::PathBuf, &'static str)> {
    let name = path.file_name()?.to_str()?;
    let folder = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(p) => p.to_path_buf(),
        None => std::path::PathBuf::from("."),
    };
    if !RUN_MARKERS.iter().any(|m| folder.join(m).exists()) {
        return None;
    }
    let what = RUN_FILES.iter().find(|(pattern, _)| match pattern.split_once('*') {
        Some((prefix, suffix)) => {
            name.len() >= prefix.len() + suffix.len() && name.starts_with(prefix) && name.ends_with(suffix)
        }
        None => name == *pattern,
    })?;
    Some((folder, what.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_folder() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for name in ["checkpoint.safetensors", "config.toml", "metrics.jsonl"] {
            std::fs::write(dir.path().join(name), "x").unwrap();
        }
        dir
    }

    #[test]
    fn a_made_folder_is_removed_while_empty_and_kept_with_anything_in_it() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b/c");
        MadeFolder::make(&dir).unwrap().remove_if_empty();
        assert!(!root.path().join("a").exists(), "all three made, all three removed");
        let made = MadeFolder::make(&dir).unwrap();
        std::fs::write(root.path().join("a/b/kept.txt"), "x").unwrap();
        made.remove_if_empty();
        assert!(!dir.exists() && root.path().join("a/b/kept.txt").exists(), "the emptied folder alone");
        // A folder that was there before is not the command's to remove.
        MadeFolder::make(&root.path().join("a")).unwrap().remove_if_empty();
        std::fs::remove_file(root.path().join("a/b/kept.txt")).unwrap();
        MadeFolder::make(&dir).unwrap().remove_if_empty();
        assert!(root.path().join("a/b").is_dir() && !dir.exists());
    }

    #[test]
    fn a_run_folders_own_files_are_refused_and_new_files_in_it_are_not() {
        let run = run_folder();
        for name in
            ["checkpoint.safetensors", "config.toml", "metrics.jsonl", "tokenizer.json", "events.out.tfevents.1.host"]
        {
            let e = check("--csv", &run.path().join(name), &[]).unwrap_err().to_string();
            assert!(e.starts_with("--csv `") && e.contains("which only training writes"), "{name}: {e}");
        }
        check("--csv", &run.path().join("per-token.csv"), &[]).unwrap();
        // The same names outside a run folder are anyone's.
        let plain = tempfile::tempdir().unwrap();
        std::fs::write(plain.path().join("config.toml"), "x").unwrap();
        check("--csv", &plain.path().join("config.toml"), &[]).unwrap();
    }

    #[test]
    fn an_input_is_refused_as_an_output_whatever_path_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("predictions.txt");
        std::fs::write(&input, "a\n").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let other_name = dir.path().join("sub/../predictions.txt");
        let e = check("--csv", &other_name, &[&input]).unwrap_err().to_string();
        assert!(e.contains("is the same file as the input"), "{e}");
        std::os::unix::fs::symlink(&input, dir.path().join("link.txt")).unwrap();
        assert!(check("--csv", &dir.path().join("link.txt"), &[&input]).is_err());
        check("--csv", &dir.path().join("scores.csv"), &[&input]).unwrap();
    }

    #[test]
    fn folders_fifos_and_devices_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = check("--out", dir.path(), &[]).unwrap_err().to_string();
        assert!(e.contains("is a folder"), "{e}");
        let e = check("--out", Path::new("/dev/null"), &[]).unwrap_err().to_string();
        assert!(e.contains("is a device"), "{e}");
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = check("--out", &fifo, &[]).unwrap_err().to_string();
        assert!(e.contains("is a FIFO"), "{e}");
    }

    #[test]
    fn a_refused_write_leaves_the_file_as_it_was() {
        let run = run_folder();
        let target = run.path().join("metrics.jsonl");
        assert!(write("--csv", &target, b"replaced", &[]).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"x");
    }
}
