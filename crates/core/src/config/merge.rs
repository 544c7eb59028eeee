//! Reading and writing configs as TOML: a file merged over a config, `--set` overrides,
//! and the round trip through `config.toml`.

use std::path::Path;

use super::run::Config;
use crate::error::{LetheError, Result};

impl Config {
    /// Merges a TOML file over `self` (fields the file leaves out keep their values).
    pub fn merge_file(self, path: &Path) -> Result<Config> {
        let text = crate::input::read_to_string(path)
            .map_err(|e| LetheError::ConfigParse(format!("`{}`: {e}", path.display())))?;
        let overlay: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            LetheError::ConfigParse(format!("`{}`: {}", path.display(), said(&e.to_string())))
        })?;
        self.merge_table(overlay, &path.display().to_string())
    }

    /// Merges `overlay` over `self`; `origin` names it in errors.
    pub(super) fn merge_table(self, overlay: toml::Table, origin: &str) -> Result<Config> {
        let mut base = self.to_table()?;
        merge_tables(&mut base, overlay);
        Self::from_table(base, origin)
    }

    /// Applies `section.field=value` overrides. The value is read as TOML (`4`, `0.5`,
    /// `true`, `[0.8, 0.1, 0.1]`) and otherwise taken as a string.
    pub fn apply_overrides(self, overrides: &[String]) -> Result<Config> {
        if overrides.is_empty() {
            return Ok(self);
        }
        let mut table = self.to_table()?;
        for item in overrides {
            let (key, raw) = item.split_once('=').ok_or_else(|| {
                LetheError::ConfigParse(format!("override `{item}` is not of the form section.field=value"))
            })?;
            set_path(&mut table, key.trim(), parse_value(raw.trim()))?;
        }
        Self::from_table(table, "--set")
    }

    /// Reads a config from TOML text (as written by [`Config::to_toml`]).
    pub fn from_toml(text: &str, origin: &str) -> Result<Config> {
        toml::from_str(text)
            .map_err(|e: toml::de::Error| LetheError::ConfigParse(format!("{origin}: {}", said(&e.to_string()))))
    }

    /// The config as TOML text.
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string_pretty(self).map_err(|e| LetheError::ConfigParse(e.to_string()))
    }

    fn to_table(&self) -> Result<toml::Table> {
        toml::Table::try_from(self).map_err(|e| LetheError::ConfigParse(e.to_string()))
    }

    fn from_table(table: toml::Table, origin: &str) -> Result<Config> {
        table
            .try_into()
            .map_err(|e: toml::de::Error| LetheError::ConfigParse(format!("{origin}: {}", said(&e.to_string()))))
    }
}

fn merge_tables(base: &mut toml::Table, overlay: toml::Table) {
    for (key, value) in overlay {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge_tables(b, o),
            (_, v) => {
                base.insert(key, v);
            }
        }
    }
}

fn parse_value(raw: &str) -> toml::Value {
    let probe = format!("v = {raw}");
    match probe.parse::<toml::Table>() {
        Ok(mut t) => t.remove("v").unwrap_or_else(|| toml::Value::String(raw.to_string())),
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

fn set_path(table: &mut toml::Table, key: &str, value: toml::Value) -> Result<()> {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts
        .pop()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| LetheError::ConfigParse(format!("empty key in `{key}`")))?;
    let mut cur = table;
    for part in parts {
        cur = match cur.get_mut(part) {
            Some(toml::Value::Table(t)) => t,
            _ => return Err(LetheError::ConfigParse(format!("unknown config section `{part}` in `{key}`"))),
        };
    }
    // A field that is unset (`None`) has no entry in the table, yet may be set.
    const OPTIONAL: [&str; 3] = ["data.path", "data.tokenizer", "train.init_from"];
    if !cur.contains_key(last) && !OPTIONAL.contains(&key) {
        return Err(LetheError::ConfigParse(format!("unknown config field `{key}`")));
    }
    cur.insert(last.to_string(), value);
    Ok(())
}

/// A TOML error in one line, in a user's words: the field first (`in \`model\``
/// becomes `` `model`: ``), the source snippet's lines dropped, and the Rust types serde
/// names (`struct ModelConfig`, `f64`, `usize`) said as what the field takes.
pub fn said(display: &str) -> String {
    let mut field = None;
    let mut parts = vec![];
    for line in display.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let snippet = line.starts_with('|')
            || line.split_once('|').is_some_and(|(n, _)| n.trim().chars().all(|c| c.is_ascii_digit()));
        if snippet {
            continue;
        }
        match line.strip_prefix("in `").and_then(|l| l.strip_suffix('`')) {
            Some(key) => field = Some(key.to_string()),
            None => parts.push(plain_types(line)),
        }
    }
    let message = parts.join("; ");
    match field {
        Some(key) => format!("`{key}`: {message}"),
        None => message,
    }
}

/// Replaces serde's names of Rust types in `text` with what a config field takes.
fn plain_types(text: &str) -> String {
    let mut out = text.replace("unit variant, expected string only", "a bare word, expected a name in quotes");
    for (rust, plain) in [
        ("f64", "a number"),
        ("f32", "a number"),
        ("usize", "a whole number"),
        ("u64", "a whole number"),
        ("u32", "a whole number"),
        ("i64", "a whole number"),
        ("i32", "a whole number"),
        ("u8", "a whole number"),
        ("string only", "a name in quotes"),
    ] {
        out = out.replace(&format!("expected {rust}"), &format!("expected {plain}"));
    }
    // `expected struct FooConfig` and `expected enum Foo`: a table, one of the names.
    for (kind, plain) in
        [("expected struct ", "expected a table of fields"), ("expected enum ", "expected one of its names")]
    {
        while let Some(at) = out.find(kind) {
            let rest = &out[at + kind.len()..];
            let end = rest.find(|c: char| !c.is_alphanumeric() && c != '_').unwrap_or(rest.len());
            out = format!("{}{plain}{}", &out[..at], &rest[end..]);
        }
    }
    out
}

#[cfg(test)]
mod said_tests {
    use super::said;

    #[test]
    fn toml_errors_read_in_one_line_without_rust_types() {
        assert_eq!(
            said("invalid type: integer `3`, expected struct ModelConfig\nin `model`\n"),
            "`model`: invalid type: integer `3`, expected a table of fields"
        );
        assert_eq!(
            said("invalid type: string \"x\", expected f64\nin `train.lr`\n"),
            "`train.lr`: invalid type: string \"x\", expected a number"
        );
        let parse = "TOML parse error at line 1, column 7\n  |\n1 | [model\n  |       ^\ninvalid table header\nexpected `.`, `]`\n";
        assert_eq!(said(parse), "TOML parse error at line 1, column 7; invalid table header; expected `.`, `]`");
    }
}
