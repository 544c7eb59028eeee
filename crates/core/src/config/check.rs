//! The checks every section's validation uses: each names the field it refuses.

use crate::error::{LetheError, Result};

/// A run name is one plain folder name: it may not be empty, hold a path separator or
/// be `.` or `..`, so that the run folder stays inside `--out`; nor hold a control
/// character (a line break would split every message naming the folder), nor be longer
/// than [`MAX_NAME_BYTES`] (a folder name's limit, with room for a sweep's suffixes).
pub(super) fn validate_name(name: &str) -> Result<()> {
    let reason = if name.trim().is_empty() {
        "must not be empty"
    } else if name.contains(['/', '\\']) || name == "." || name == ".." {
        "must be a plain folder name (no `/`, `.` or `..`): the run folder is <out>/<name>"
    } else if name.starts_with('-') {
        "must not start with `-`"
    } else if name.chars().any(char::is_control) {
        "must not hold a control character (a line break, a tab)"
    } else if name.len() > MAX_NAME_BYTES {
        "must be at most 200 bytes long (a folder name holds 255, and a sweep adds to it)"
    } else {
        return Ok(());
    };
    Err(LetheError::config("name", format!("{name:?}"), reason))
}

/// The longest run name, in bytes.
const MAX_NAME_BYTES: usize = 200;

pub(super) fn non_negative(field: &str, value: f64) -> Result<()> {
    if !(value >= 0.0 && value.is_finite()) {
        return Err(LetheError::config(field, value, "must be a non-negative number"));
    }
    Ok(())
}

pub(super) fn positive_number(field: &str, value: f64) -> Result<()> {
    if !(value > 0.0 && value.is_finite()) {
        return Err(LetheError::config(field, value, "must be a positive number"));
    }
    Ok(())
}

pub(super) fn probability(field: &str, value: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&value) {
        return Err(LetheError::config(field, value, "must be a probability in [0, 1]"));
    }
    Ok(())
}

/// `value` (of `field`) must be at least `min` (of `min_field`).
pub(super) fn not_below(field: &str, value: usize, min_field: &str, min: usize) -> Result<()> {
    if value < min {
        return Err(LetheError::config(field, value, format!("must be >= {min_field}")));
    }
    Ok(())
}

pub(super) fn positive(field: &str, value: usize) -> Result<()> {
    if value == 0 {
        return Err(LetheError::config(field, value, "must be at least 1"));
    }
    Ok(())
}
