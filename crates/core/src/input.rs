//! Reading the files a user names, bounded: the one way lethe reads a corpus, a config,
//! a checkpoint, a prompt or a tokenizer.
//!
//! - Only regular files are read. A FIFO (whose reader waits for a writer forever), a
//!   device (`/dev/zero` and `/dev/urandom` never end), a socket or a folder is refused
//!   by name before it is opened.
//! - No file larger than [`max_bytes`] (half the machine's memory) is read: lethe holds
//!   what it reads whole, and a larger file would end in the kernel killing the process.
//!   The bound holds while reading too, for files that grow or misstate their size.
//! - A folder is walked ([`walk`]) without following a link back into a folder already
//!   seen, so that a symbolic-link loop ends.
//!
//! The functions return the reason as text; the caller wraps it in the error that
//! names what the file is (data, checkpoint, config).

use std::collections::HashSet;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The most bytes any one file may hold: half the machine's memory (`MemTotal`), or
/// 64 GiB where the OS does not say.
pub fn max_bytes() -> u64 {
    total_memory_bytes().map_or(64 << 30, |total| total / 2)
}

/// The machine's memory (`MemTotal`), where the OS reports it; read once per process.
pub fn total_memory_bytes() -> Option<u64> {
    static TOTAL: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *TOTAL.get_or_init(|| {
        let info = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    })
}

/// Refuses `path` unless it is a regular file (through links) of at most
/// [`max_bytes`]; returns its size.
pub fn check_file(path: &Path) -> Result<u64, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read: {e}"))?;
    let t = meta.file_type();
    if !t.is_file() {
        return Err(format!(
            "is {}, not a regular file: lethe reads only files",
            not_a_file(&t).unwrap_or("not a regular file")
        ));
    }
    let most = max_bytes();
    if meta.len() > most {
        return Err(format!(
            "is {}, more than lethe reads from one file ({}, half this machine's memory)",
            gib(meta.len()),
            gib(most)
        ));
    }
    Ok(meta.len())
}

/// The bytes of the regular file `path` ([`check_file`]).
pub fn read(path: &Path) -> Result<Vec<u8>, String> {
    let size = check_file(path)?;
    let most = max_bytes();
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read: {e}"))?;
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(most + 1).read_to_end(&mut bytes).map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > most {
        return Err(format!("grew past {} while being read: lethe reads only files of a fixed size", gib(most)));
    }
    Ok(bytes)
}

/// The text of the regular file `path` ([`read`]), which must be UTF-8.
pub fn read_to_string(path: &Path) -> Result<String, String> {
    String::from_utf8(read(path)?)
        .map_err(|e| format!("is not UTF-8 text (invalid byte at offset {})", e.utf8_error().valid_up_to()))
}

/// The files under `dir`, recursively, sorted by path; entries whose name starts with a
/// dot are skipped, and a folder reached again through a link is walked once.
pub fn walk(dir: &Path) -> Result<Vec<PathBuf>, (PathBuf, String)> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let meta = std::fs::metadata(&d).map_err(|e| (d.clone(), format!("cannot read folder: {e}")))?;
        if !seen.insert((meta.dev(), meta.ino())) {
            continue; // a link back into a folder already walked
        }
        let entries = std::fs::read_dir(&d).map_err(|e| (d.clone(), format!("cannot read folder: {e}")))?;
        for entry in entries {
            let p = entry.map_err(|e| (d.clone(), e.to_string()))?.path();
            if p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.')) {
                continue;
            }
            if p.is_dir() {
                pending.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// What an existing path is when it is not a regular file.
pub fn not_a_file(t: &std::fs::FileType) -> Option<&'static str> {
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a folder")
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_char_device() || t.is_block_device() {
        Some("a device")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_symlink() {
        None // written over as a link: the rename replaces the link, not what it names
    } else {
        Some("not a regular file")
    }
}

fn gib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_fifos_and_folders_are_refused_without_being_opened() {
        for path in ["/dev/zero", "/dev/urandom", "/dev/null"] {
            let e = read(Path::new(path)).unwrap_err();
            assert!(e.contains("is a device, not a regular file"), "{path}: {e}");
        }
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path()).unwrap_err().contains("is a folder"));
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Opening a FIFO for reading would wait for a writer: the check comes first.
        assert!(read(&fifo).unwrap_err().contains("is a FIFO"));
    }

    #[test]
    fn a_regular_file_reads_whole_and_text_must_be_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        std::fs::write(&path, b"hello").unwrap();
        assert_eq!(read(&path).unwrap(), b"hello");
        std::fs::write(&path, b"ab\xffcd").unwrap();
        assert!(read_to_string(&path).unwrap_err().contains("offset 2"));
        assert!(read(&dir.path().join("missing")).unwrap_err().starts_with("cannot read"));
    }

    #[test]
    fn a_link_loop_is_walked_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a.txt"), "a").unwrap();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("sub/loop")).unwrap();
        let files = walk(dir.path()).unwrap();
        assert_eq!(files, vec![dir.path().join("sub/a.txt")]);
    }
}
