//! Advisory locks (`flock`) on a lock file that holds the locking process's id, so that a
//! second process about to write the same files is refused with the first one named.
//! The lock lasts as long as the returned file is open: a process that dies, however it
//! dies, lets go of it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::Path;

use crate::error::{LetheError, Result};

/// Opens (creating if needed) and locks the lock file `path` without waiting or writing
/// to it. `Ok(Err(holder))` when another process holds the lock: `holder` names it
/// (` (process 1234)`, or nothing when it wrote no id).
pub fn try_lock(path: &Path) -> Result<std::result::Result<File, String>> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| LetheError::io(path, e))?;
    match file.try_lock() {
        Ok(()) => Ok(Ok(file)),
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = (&mut file).take(64).read_to_string(&mut holder);
            let holder = holder.trim();
            Ok(Err(if holder.is_empty() { String::new() } else { format!(" (process {holder})") }))
        }
        Err(std::fs::TryLockError::Error(e)) => Err(LetheError::io(path, e)),
    }
}

/// [`try_lock`], then this process's id written into the lock file.
pub fn lock(path: &Path) -> Result<std::result::Result<File, String>> {
    let mut file = match try_lock(path)? {
        Ok(file) => file,
        Err(holder) => return Ok(Err(holder)),
    };
    let write_pid = |f: &mut File| -> std::io::Result<()> {
        f.set_len(0)?;
        f.rewind()?;
        f.write_all(std::process::id().to_string().as_bytes())
    };
    write_pid(&mut file).map_err(|e| LetheError::io(path, e))?;
    Ok(Ok(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_first_holder_and_a_dropped_one_is_free() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".lock");
        let first = lock(&path).unwrap().unwrap();
        let holder = try_lock(&path).unwrap().unwrap_err();
        assert_eq!(holder, format!(" (process {})", std::process::id()));
        drop(first);
        assert!(lock(&path).unwrap().is_ok());
    }
}
