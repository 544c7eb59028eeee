//! The config reference: every key of a run's config, its default and what it means, read
//! from the doc comments of the config's own fields (the section files are compiled in),
//! so that `lethe train --help-config` and the guide's Config chapter say what the code
//! says (a test keeps the chapter equal to [`markdown`]).
//!
//! A key is a field whose type is not another config section; a section is a field whose
//! type is a struct of these files (`model: ModelConfig` makes the prefix `model.`). The
//! default is the field's value in [`Config::default`], written as TOML writes it; a doc
//! comment's closing "Default ..." sentence is left out of the meaning.

use std::collections::HashMap;

use super::Config;
use crate::error::{LetheError, Result};

/// The files that define the config's sections, in the order the reference lists them.
const SOURCES: [&str; 11] = [
    include_str!("run.rs"),
    include_str!("model.rs"),
    include_str!("memory/mod.rs"),
    include_str!("memory/expire.rs"),
    include_str!("memory/adaptive.rs"),
    include_str!("memory/compressive.rs"),
    include_str!("memory/infinity.rs"),
    include_str!("data.rs"),
    include_str!("tasks.rs"),
    include_str!("train.rs"),
    include_str!("rl.rs"),
];

/// One key of the reference.
#[derive(Clone, Debug, PartialEq)]
pub struct Key {
    /// Dotted, as `--set` takes it: `memory.expire.ramp`.
    pub key: String,
    /// In [`Config::default`], as TOML writes it; `-` when unset.
    pub default: String,
    /// The field's doc comment on one line, without its "Default ..." sentence.
    pub meaning: String,
    /// The doc comment's "Default ..." sentence, if it has one.
    pub stated_default: Option<String>,
}

/// A field of a config struct, or a variant of a config enum: its name, type (none for a
/// variant) and doc comment.
struct Field {
    name: String,
    ty: String,
    doc: String,
}

/// The config's structs and enums by name, each with its fields or variants.
struct Items {
    structs: HashMap<String, Vec<Field>>,
    enums: HashMap<String, Vec<Field>>,
}

/// Every key of the config, depth first in the order the fields are declared.
pub fn keys() -> Result<Vec<Key>> {
    let items = items();
    let defaults = toml::Table::try_from(Config::default()).map_err(|e| LetheError::ConfigParse(e.to_string()))?;
    let mut out = Vec::new();
    walk(&items, "Config", "", &toml::Value::Table(defaults), &mut out)?;
    Ok(out)
}

fn walk(items: &Items, name: &str, prefix: &str, defaults: &toml::Value, out: &mut Vec<Key>) -> Result<()> {
    let fields =
        items.structs.get(name).ok_or_else(|| LetheError::Invalid(format!("config reference: no struct {name}")))?;
    for f in fields {
        let key = format!("{prefix}{}", f.name);
        let value = defaults.get(&f.name);
        if items.structs.contains_key(&f.ty) {
            let empty = toml::Value::Table(toml::Table::new());
            walk(items, &f.ty, &format!("{key}."), value.unwrap_or(&empty), out)?;
            continue;
        }
        let (mut meaning, stated_default) = split_default(&f.doc);
        if let Some(variants) = items.enums.get(&f.ty).filter(|v| !names_any(&meaning, v)) {
            meaning.push_str(&values(variants));
        }
        let default = value.map_or_else(|| "-".to_string(), written);
        out.push(Key { key, default, meaning, stated_default });
    }
    Ok(())
}

/// A default as TOML writes it, but a small or large number in exponent form (`1e-6`,
/// not `0.000001`).
fn written(value: &toml::Value) -> String {
    match value {
        toml::Value::Float(x) if *x != 0.0 && (x.abs() < 1e-3 || x.abs() >= 1e6) => format!("{x:e}"),
        _ => value.to_string(),
    }
}

/// The config structs and enums of [`SOURCES`] by name, with their public fields and
/// their variants.
fn items() -> Items {
    let (mut structs, mut enums) = (HashMap::new(), HashMap::new());
    for source in SOURCES {
        let mut lines = source.lines();
        while let Some(line) = lines.next() {
            if let Some(name) = line.strip_prefix("pub struct ").and_then(|r| r.strip_suffix(" {")) {
                structs.insert(name.to_string(), fields(&mut lines));
            } else if let Some(name) = line.strip_prefix("pub enum ").and_then(|r| r.strip_suffix(" {")) {
                enums.insert(name.to_string(), fields(&mut lines));
            }
        }
    }
    Items { structs, enums }
}

/// The public fields of a struct body, or the variants of an enum body (named as the
/// config writes them, in lower case), up to its closing brace.
fn fields<'a>(lines: &mut impl Iterator<Item = &'a str>) -> Vec<Field> {
    let (mut out, mut doc) = (Vec::new(), Vec::<&str>::new());
    for line in lines.by_ref() {
        let line = line.trim();
        if line == "}" {
            break;
        }
        if let Some(text) = line.strip_prefix("///") {
            doc.push(text.trim());
            continue;
        }
        let field = line.strip_prefix("pub ").and_then(|r| r.split_once(": "));
        let variant = line.strip_suffix(',').filter(|v| v.chars().all(char::is_alphanumeric));
        match (field, variant) {
            (Some((name, ty)), _) => {
                out.push(Field { name: name.to_string(), ty: ty.trim_end_matches(',').to_string(), doc: doc.join(" ") })
            }
            (None, Some(v)) => out.push(Field { name: v.to_lowercase(), ty: String::new(), doc: doc.join(" ") }),
            _ if line.starts_with("#[") => continue,
            _ => {}
        }
        doc.clear();
    }
    out
}

/// Whether `meaning` names one of `variants` in backticks already.
fn names_any(meaning: &str, variants: &[Field]) -> bool {
    variants.iter().any(|v| meaning.contains(&format!("`{}`", v.name)))
}

/// The values an enum takes, with their doc comments, as a sentence to append.
fn values(variants: &[Field]) -> String {
    let each: Vec<String> = variants.iter().map(|v| format!("`{}`: {}", v.name, unlink(&v.doc))).collect();
    format!(" {}", each.join(" "))
}

/// A doc comment without its closing "Default ..." sentence, and that sentence's value.
fn split_default(doc: &str) -> (String, Option<String>) {
    let doc = unlink(doc.trim());
    match doc.rfind("Default") {
        Some(at) if at == 0 || doc[..at].ends_with(". ") || doc[..at].ends_with(") ") => {
            let stated = doc[at..].trim_start_matches("Default").trim_start_matches(':').trim();
            (doc[..at].trim().to_string(), Some(stated.trim_end_matches('.').to_string()))
        }
        _ => (doc, None),
    }
}

/// Rustdoc's links to items, ``[`Name`]``, as plain code, `` `Name` ``.
fn unlink(doc: &str) -> String {
    doc.replace("[`", "`").replace("`]", "`")
}

/// The reference as the guide's table: one row per key.
pub fn markdown(keys: &[Key]) -> String {
    let mut out = String::from("| key | meaning | default |\n|---|---|---|\n");
    for k in keys {
        let cell = |s: &str| s.replace('|', "\\|");
        out.push_str(&format!("| `{}` | {} | `{}` |\n", k.key, cell(&k.meaning), cell(&k.default)));
    }
    out
}

/// The reference for a terminal: the keys that start with `prefix`, each with its default
/// and its meaning wrapped at 88 columns.
pub fn text(keys: &[Key], prefix: &str) -> String {
    let mut out = String::new();
    for k in keys.iter().filter(|k| k.key.starts_with(prefix)) {
        out.push_str(&format!("{} = {}\n", k.key, k.default));
        let mut line = String::from("   ");
        for word in k.meaning.split_whitespace() {
            if line.len() + word.len() > 88 && line.len() > 3 {
                out.push_str(&line);
                out.push('\n');
                line = String::from("   ");
            }
            line.push(' ');
            line.push_str(word);
        }
        if line.len() > 3 {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests;
