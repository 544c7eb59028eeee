use super::*;

/// The leaves of a TOML table, dotted.
fn leaves(prefix: &str, table: &toml::Table, out: &mut Vec<String>) {
    for (name, value) in table {
        match value {
            toml::Value::Table(t) => leaves(&format!("{prefix}{name}."), t, out),
            _ => out.push(format!("{prefix}{name}")),
        }
    }
}

/// Every key a config file or `--set` takes is in the reference, once, with a meaning;
/// the reference's other keys are the settings unset by default (paths).
#[test]
fn the_reference_has_every_key_of_the_config_with_its_meaning() {
    let keys = keys().unwrap();
    let table = toml::Table::try_from(Config::default()).unwrap();
    let mut set = Vec::new();
    leaves("", &table, &mut set);
    let named: Vec<&str> = keys.iter().map(|k| k.key.as_str()).collect();
    for key in &set {
        assert_eq!(named.iter().filter(|n| *n == key).count(), 1, "{key} once in the reference");
    }
    for k in &keys {
        assert!(set.contains(&k.key) || k.default == "-", "{} is no key of the config", k.key);
        assert!(k.meaning.len() > 10, "{} has no meaning: {:?}", k.key, k.meaning);
    }
    assert!(keys.len() > 100, "{} keys", keys.len());
    assert!(named.contains(&"memory.expire.ramp") && named.contains(&"data.copy.distance_max"));
}

/// The value a stated default names (its first word), in the form TOML writes it, where
/// it names one: a number, a boolean, a word in backticks or a list; `none` is unset.
fn stated_value(stated: &str) -> Option<String> {
    let first = stated.split([' ', ':']).next()?.trim_matches('`');
    if stated.starts_with('[') || stated.starts_with("`[") {
        return Some(stated.trim_matches('`').split(']').next()?.to_string() + "]");
    }
    if let Ok(x) = first.parse::<f64>() {
        return Some(format!("{x:e}"));
    }
    match first {
        "true" | "false" => Some(first.to_string()),
        "none" => Some("-".to_string()),
        _ if stated.starts_with('`') => Some(format!("\"{first}\"")),
        _ => None,
    }
}

/// Where a doc comment says what its default is, the code's default agrees: a default is
/// written once, in the code, and a comment that drifted from it fails here.
#[test]
fn a_default_that_a_doc_comment_states_is_the_default() {
    let mut checked = 0;
    for k in keys().unwrap() {
        let Some(stated) = k.stated_default.as_deref().and_then(stated_value) else { continue };
        let actual = match k.default.parse::<f64>() {
            Ok(x) => format!("{x:e}"),
            Err(_) => k.default.clone(),
        };
        assert_eq!(stated, actual, "{}: the doc comment says {:?}", k.key, k.stated_default);
        checked += 1;
    }
    assert!(checked > 90, "{checked} stated defaults checked");
}

#[test]
fn the_text_lists_the_keys_under_a_prefix_wrapped() {
    let keys = keys().unwrap();
    let text = text(&keys, "memory.expire.");
    assert!(text.starts_with("memory.expire.ramp = 16\n    Ramp length `R`"), "{text}");
    assert!(!text.contains("memory.adaptive") && !text.contains("model."));
    assert!(text.lines().all(|l| l.len() <= 100), "{text}");
    assert!(super::text(&keys, "nothing.").is_empty());
}

#[test]
fn markdown_rows_escape_the_cell_separator() {
    let key = Key { key: "a.b".into(), default: "[1, 2]".into(), meaning: "x | y".into(), stated_default: None };
    assert_eq!(markdown(&[key]), "| key | meaning | default |\n|---|---|---|\n| `a.b` | x \\| y | `[1, 2]` |\n");
}
