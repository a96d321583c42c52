//! What an agent may send through either front door (the agent API and the
//! MCP gateway), checked in one place so the two cannot drift: no text the
//! database cannot keep (U+0000, which PostgreSQL refuses in text and JSON,
//! refused on SQLite alike), no arguments nested deeper than the log reads
//! back, and no label or text longer than the dashboard pages show. An
//! agent must not decide how big those pages get.

use serde_json::Value;

/// The longest a run's label may be.
pub const MAX_LABEL_CHARS: usize = 200;
/// The longest a run's purpose, a pivot's summary or an unwind's reason
/// may be.
pub const MAX_TEXT_CHARS: usize = 2000;
/// How deeply arguments may nest: tool arguments are records, not trees,
/// and the stored plan wraps them a few levels deeper still.
pub const MAX_NESTING: usize = 32;

/// Why an agent's input is refused, in words that say what to change.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum InputMistake {
    #[error("text cannot contain the NUL character (U+0000)")]
    Nul,
    #[error("`{field}` is longer than {max} characters")]
    TooLong { field: String, max: usize },
    #[error("the body nests objects and arrays deeper than {MAX_NESTING} levels")]
    TooDeep,
}

/// Refuses a text field over its length, naming the field.
pub fn within(field: &str, text: &str, max: usize) -> Result<(), InputMistake> {
    if text.chars().count() > max {
        return Err(InputMistake::TooLong {
            field: field.to_owned(),
            max,
        });
    }
    Ok(())
}

/// Refuses arguments holding U+0000 anywhere (keys included) or nested
/// past [`MAX_NESTING`].
pub fn check_value(value: &Value) -> Result<(), InputMistake> {
    if depth(value) > MAX_NESTING {
        return Err(InputMistake::TooDeep);
    }
    if has_nul(value) {
        return Err(InputMistake::Nul);
    }
    Ok(())
}

/// Whether any string (or key) holds U+0000.
pub fn has_nul(value: &Value) -> bool {
    match value {
        Value::String(text) => text.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

/// How deeply arrays and objects nest in a value (a scalar is 0).
fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nul_anywhere_and_deep_nesting_are_refused_and_ordinary_arguments_pass() {
        assert_eq!(check_value(&json!({"to": "ada@example.com"})), Ok(()));
        assert_eq!(check_value(&json!({"a\u{0}": 1})), Err(InputMistake::Nul));
        assert_eq!(
            check_value(&json!({"list": ["x", "y\u{0}"]})),
            Err(InputMistake::Nul)
        );
        let mut deep = json!(1);
        for _ in 0..=MAX_NESTING {
            deep = json!([deep]);
        }
        assert_eq!(check_value(&deep), Err(InputMistake::TooDeep));
    }

    #[test]
    fn a_text_over_its_length_is_refused_naming_the_field() {
        assert!(within("reason", &"x".repeat(MAX_TEXT_CHARS), MAX_TEXT_CHARS).is_ok());
        let err = within("reason", &"x".repeat(MAX_TEXT_CHARS + 1), MAX_TEXT_CHARS).unwrap_err();
        assert_eq!(err.to_string(), "`reason` is longer than 2000 characters");
    }
}
