//! A call as the person who decides on it reads it: one sentence from the
//! tool's display template ("Capture $32.00 from the hold on the card"),
//! its reach and whether it is gated, what happens if it is undone, and the
//! exact arguments kept one click away. The pivot panel, held single
//! steps, the unwind review and the corrections inbox all read calls this
//! way, so a lead checks each in seconds and sees the same words
//! everywhere.
//!
//! What a person approves must be what will be sent: characters that
//! display differently from what they are (bidirectional overrides and
//! isolates, zero-width marks, control characters) are shown as visible
//! escapes, and the call is flagged.

use super::class::{Audience, ToolClass};
use serde::{Deserialize, Serialize};

/// One call, in words.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallInWords {
    pub tool: String,
    /// The sentence a lead checks ("Email grace@example.com: “Your lamp”").
    pub sentence: String,
    pub class: ToolClass,
    pub audience: Audience,
    /// Who or what the effect reaches ("1 recipient", "channel #support").
    pub reach: Option<String>,
    /// Runs only as a commit step of an approved pivot (R9).
    pub gated: bool,
    /// "If undone: refund $32.00", "If undone: a correction to finance@…".
    pub if_undone: String,
    /// The exact arguments, pretty-printed, hidden characters made visible.
    pub exact: String,
    /// Set when the arguments hold characters that display differently
    /// from what they are; the page says so next to the call.
    pub hidden_characters: bool,
}

/// Characters that change how text displays without showing themselves:
/// C0 and C1 controls (but line breaks and tabs), DEL, bidirectional
/// embeddings, overrides and isolates, and zero-width marks.
pub fn is_deceptive(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{8}' | '\u{b}'..='\u{c}' | '\u{e}'..='\u{1f}' | '\u{7f}'..='\u{9f}'
        | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

/// `text` with every deceptive character written as `\u{…}`, and whether
/// there was one.
pub fn visible(text: &str) -> (String, bool) {
    let mut out = String::with_capacity(text.len());
    let mut found = false;
    for c in text.chars() {
        if is_deceptive(c) {
            found = true;
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    (out, found)
}

/// `value` as pretty JSON for a person to edit, with every deceptive
/// character written as a JSON escape (`\u202e`): the text shows what is
/// there, and parses back to exactly the same value. (Every deceptive
/// character is in the Basic Multilingual Plane, so one escape each does.)
pub fn editable_json(value: &serde_json::Value) -> String {
    let pretty = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    let mut out = String::with_capacity(pretty.len());
    for c in pretty.chars() {
        if is_deceptive(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// An amount in a currency's minor units, as people write it: `$32.00`,
/// `€12.50`, `¥500`, `12.50 CHF`.
pub fn money(minor: i64, currency: &str) -> String {
    let currency = currency.to_ascii_lowercase();
    // Stripe's zero-decimal currencies: the amount is already whole units.
    const ZERO_DECIMAL: [&str; 16] = [
        "bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "ugx", "vnd", "vuv",
        "xaf", "xof", "xpf",
    ];
    let sign = if minor < 0 { "-" } else { "" };
    let abs = minor.unsigned_abs();
    let number = if ZERO_DECIMAL.contains(&currency.as_str()) {
        group(abs)
    } else {
        format!("{}.{:02}", group(abs / 100), abs % 100)
    };
    match currency.as_str() {
        "usd" => format!("{sign}${number}"),
        "eur" => format!("{sign}€{number}"),
        "gbp" => format!("{sign}£{number}"),
        "jpy" => format!("{sign}¥{number}"),
        other => format!("{sign}{number} {}", other.to_ascii_uppercase()),
    }
}

/// Thousands separated by commas.
fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// "grace@example.com", or "3 recipients" when there are several.
pub fn recipients(names: &[String]) -> String {
    match names {
        [] => "nobody".to_owned(),
        [one] => one.clone(),
        many => format!("{} recipients", many.len()),
    }
}

/// At most `max_chars` characters of `text`, with "…" when cut.
pub fn shorten(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// What earlier steps' keys stand for, in a lead's words: a step's key
/// maps to its system's reference ("pi_3Q… (step 5)") or to "of step 5"
/// while no reference is known. A sentence names the thing, never the key.
pub type Referents = std::collections::HashMap<String, String>;

/// The filters a display template may apply to an argument:
/// `{args.amount|money}`, `{args.to|recipients}`, `{args.key|short}`.
pub const FILTERS: [&str; 3] = ["money", "recipients", "short"];

#[cfg(feature = "engine")]
pub use ssr::*;

#[cfg(feature = "engine")]
mod ssr {
    use super::*;
    use serde_json::Value;

    /// One `{…}` in a template: where it stands and the name inside.
    pub(crate) struct Placeholder<'a> {
        pub start: usize,
        /// Just past its `}`.
        pub end: usize,
        pub name: &'a str,
    }

    /// The placeholders of a text, in order; an unclosed one is an error
    /// that ends the scan. Every template reader (ways back, corrections,
    /// display templates) reads them through this.
    pub(crate) fn placeholders(
        text: &str,
    ) -> impl Iterator<Item = Result<Placeholder<'_>, String>> {
        let mut from = 0;
        std::iter::from_fn(move || {
            let start = from + text.get(from..)?.find('{')?;
            match text[start..].find('}') {
                Some(len) => {
                    from = start + len + 1;
                    Some(Ok(Placeholder {
                        start,
                        end: from,
                        name: &text[start + 1..start + len],
                    }))
                }
                None => {
                    from = text.len();
                    Some(Err(format!("unclosed placeholder in {text:?}")))
                }
            }
        })
    }

    /// What is wrong with a display template, if anything: placeholders
    /// are `{args.FIELD}` or `{args.FIELD|filter}` with a known filter.
    pub fn display_problem(template: &str) -> Option<String> {
        placeholders(template).find_map(|placeholder| match placeholder {
            Ok(placeholder) => filter_problem(placeholder.name),
            Err(problem) => Some(problem),
        })
    }

    /// What is wrong with the filtered placeholders (`{args.FIELD|filter}`)
    /// of a correction's text, if anything; the others are [`fill`]'s.
    ///
    /// [`fill`]: crate::registry::fill
    pub fn display_problem_in_filters(text: &str) -> Option<String> {
        placeholders(text)
            .filter_map(Result::ok)
            .filter(|placeholder| placeholder.name.contains('|'))
            .find_map(|placeholder| filter_problem(placeholder.name))
    }

    /// What is wrong with one display placeholder's inside, if anything.
    fn filter_problem(inner: &str) -> Option<String> {
        let (field, filter) = inner.split_once('|').unwrap_or((inner, ""));
        if field.strip_prefix("args.").is_none_or(str::is_empty) {
            return Some(format!(
                "unknown placeholder {{{inner}}}: use {{args.FIELD}} or {{args.FIELD|filter}}"
            ));
        }
        if !filter.is_empty() && !FILTERS.contains(&filter) {
            return Some(format!(
                "unknown filter `{filter}` in {{{inner}}}; filters: {}",
                FILTERS.join(", ")
            ));
        }
        None
    }

    /// Fills a display template from the call's arguments; an argument the
    /// call does not have reads "(no FIELD)", so a missing value shows.
    pub fn fill_display(template: &str, args: &Value) -> String {
        fill_placeholders(template, args, false, &Referents::new())
    }

    /// As [`fill_display`], naming what an argument refers to where it is
    /// the key of an earlier step ("the card hold pi_3… (step 5)" rather
    /// than the key itself).
    pub fn fill_display_among(template: &str, args: &Value, known: &Referents) -> String {
        fill_placeholders(template, args, false, known)
    }

    /// Fills only the `{args.FIELD|filter}` placeholders of a text (a
    /// correction's template), leaving the others for [`fill`].
    ///
    /// [`fill`]: crate::registry::fill
    pub fn fill_filtered(template: &str, args: &Value) -> String {
        fill_placeholders(template, args, true, &Referents::new())
    }

    fn fill_placeholders(
        template: &str,
        args: &Value,
        only_filtered: bool,
        known: &Referents,
    ) -> String {
        let mut out = String::new();
        let mut done = 0;
        for placeholder in placeholders(template).map_while(Result::ok) {
            let (field, filter) = placeholder
                .name
                .split_once('|')
                .unwrap_or((placeholder.name, ""));
            if only_filtered && filter.is_empty() {
                continue;
            }
            out.push_str(&template[done..placeholder.start]);
            done = placeholder.end;
            let field = field.trim_start_matches("args.");
            let value = args
                .pointer(&format!("/{}", field.replace('.', "/")))
                .filter(|v| !v.is_null());
            let referent = value.and_then(Value::as_str).and_then(|v| known.get(v));
            out.push_str(&match (value, filter) {
                (None, _) => format!("(no {field})"),
                (Some(_), _) if referent.is_some() => referent.cloned().unwrap_or_default(),
                (Some(v), "money") => match v.as_i64() {
                    Some(minor) => money(
                        minor,
                        args.get("currency")
                            .and_then(Value::as_str)
                            .unwrap_or("usd"),
                    ),
                    None => plain(v),
                },
                (Some(v), "recipients") => recipients(&names(v)),
                (Some(v), "short") => shorten(&plain(v), 8),
                (Some(v), _) => plain(v),
            });
        }
        out.push_str(&template[done..]);
        out
    }

    pub(crate) fn plain(value: &Value) -> String {
        match value {
            Value::String(text) => text.clone(),
            Value::Array(items) => items.iter().map(plain).collect::<Vec<_>>().join(", "),
            other => other.to_string(),
        }
    }

    pub(crate) fn names(value: &Value) -> Vec<String> {
        match value {
            Value::Array(items) => items.iter().map(plain).collect(),
            other => vec![plain(other)],
        }
    }
}

#[cfg(all(test, feature = "engine"))]
mod tests {
    use super::*;

    #[test]
    fn money_is_written_as_people_write_it() {
        assert_eq!(money(3200, "usd"), "$32.00");
        assert_eq!(money(123456789, "EUR"), "€1,234,567.89");
        assert_eq!(money(500, "jpy"), "¥500");
        assert_eq!(money(1250, "chf"), "12.50 CHF");
        assert_eq!(money(-5, "gbp"), "-£0.05");
    }

    #[test]
    fn lists_show_the_start_of_long_texts() {
        assert_eq!(shorten("abcdef", 3), "abc…");
        assert_eq!(shorten("ab", 3), "ab");
        assert_eq!(shorten("ééééé", 2), "éé…");
    }

    #[test]
    fn editable_json_shows_hidden_characters_and_parses_back_the_same() {
        let args = serde_json::json!({"subject": "Refund of \u{202e}00.001$\u{7}", "body": "b\u{2066}x\u{7f}"});
        let text = editable_json(&args);
        assert!(!text.chars().any(is_deceptive), "{text}");
        assert!(text.contains("\\u202e"), "{text}");
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, args);
    }

    #[test]
    fn hidden_characters_are_shown_and_flagged() {
        let (shown, found) = visible("pay\u{202e}gpj.exe\u{7}");
        assert_eq!(shown, "pay\\u{202e}gpj.exe\\u{7}");
        assert!(found);
        let (shown, found) = visible("line one\nline two\ttab é");
        assert_eq!(shown, "line one\nline two\ttab é");
        assert!(!found);
        for c in ['\u{2066}', '\u{1b}', '\u{7f}', '\u{85}', '\u{200b}'] {
            assert!(is_deceptive(c), "{c:?}");
        }
    }
}
