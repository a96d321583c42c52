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

/// The filters a display template may apply to an argument:
/// `{args.amount|money}`, `{args.to|recipients}`, `{args.key|short}`.
pub const FILTERS: [&str; 3] = ["money", "recipients", "short"];

#[cfg(feature = "ssr")]
pub use ssr::*;

#[cfg(feature = "ssr")]
mod ssr {
    use super::*;
    use crate::saga::registry::{placeholders, Registry, ToolSpec};
    use serde_json::Value;

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
    /// [`fill`]: crate::saga::registry::fill
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
        fill_placeholders(template, args, false)
    }

    /// Fills only the `{args.FIELD|filter}` placeholders of a text (a
    /// correction's template), leaving the others for [`fill`].
    ///
    /// [`fill`]: crate::saga::registry::fill
    pub fn fill_filtered(template: &str, args: &Value) -> String {
        fill_placeholders(template, args, true)
    }

    fn fill_placeholders(template: &str, args: &Value, only_filtered: bool) -> String {
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
            out.push_str(&match (value, filter) {
                (None, _) => format!("(no {field})"),
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

    fn plain(value: &Value) -> String {
        match value {
            Value::String(text) => text.clone(),
            Value::Array(items) => items.iter().map(plain).collect::<Vec<_>>().join(", "),
            other => other.to_string(),
        }
    }

    fn names(value: &Value) -> Vec<String> {
        match value {
            Value::Array(items) => items.iter().map(plain).collect(),
            other => vec![plain(other)],
        }
    }

    /// The people or places an effect reaches, from the arguments that
    /// name them; nothing for an effect only the team sees (a draft).
    pub fn reach_of(spec: &ToolSpec, args: &Value) -> Option<String> {
        if spec.audience_for(args).is_internal() {
            return None;
        }
        let mut named = Vec::new();
        for field in ["to", "recipients", "emails", "cc", "bcc"] {
            if let Some(v) = args.get(field).filter(|v| !v.is_null()) {
                named.extend(names(v));
            }
        }
        let channel = args.get("channel").map(plain);
        match (named.len(), channel) {
            (0, None) => None,
            (0, Some(channel)) => Some(format!("channel {channel}")),
            (n, channel) => {
                let people = if n == 1 {
                    "1 recipient".to_owned()
                } else {
                    format!("{n} recipients")
                };
                Some(match channel {
                    Some(channel) => format!("{people} · channel {channel}"),
                    None => people,
                })
            }
        }
        .map(|reach| {
            if spec.gated {
                format!("{reach} · gated")
            } else {
                reach
            }
        })
    }

    impl Registry {
        /// A call in words; `way_back` is the one written for it (R6), if
        /// any. A tool the file no longer declares reads as its name.
        pub fn in_words(&self, tool: &str, args: &Value, way_back: Option<&Value>) -> CallInWords {
            let spec = self.get(tool);
            let sentence = match spec.and_then(|s| s.display.as_deref()) {
                Some(template) => fill_display(template, args),
                None => default_sentence(tool, args),
            };
            let (sentence, hidden_in_sentence) = visible(&sentence);
            let pretty = serde_json::to_string_pretty(args).unwrap_or_default();
            let (exact, hidden_in_args) = visible(&pretty);
            let (if_undone, hidden_in_way_back) = visible(
                &self.if_undone(way_back, spec.map_or(ToolClass::Irreversible, |s| s.class)),
            );
            CallInWords {
                tool: tool.to_owned(),
                sentence,
                class: spec.map_or(ToolClass::Irreversible, |s| s.class),
                audience: spec.map_or(Audience::Internal, |s| s.audience_for(args)),
                reach: spec.and_then(|s| reach_of(s, args)),
                gated: spec.is_some_and(|s| s.gated),
                if_undone,
                exact,
                hidden_characters: hidden_in_sentence
                    || hidden_in_args
                    || hidden_in_way_back
                    || json_hides_characters(args),
            }
        }

        /// The way back in words: the undo or compensation read through
        /// its own tool's display template, or who a correction goes to.
        pub fn if_undone(&self, way_back: Option<&Value>, class: ToolClass) -> String {
            let Some(way) = way_back.filter(|w| !w.is_null()) else {
                return match class {
                    ToolClass::Pure => "Nothing to undo".into(),
                    ToolClass::Irreversible => {
                        "Cannot be undone; nobody outside the team saw it".into()
                    }
                    _ => "No way back written: a person decides".into(),
                };
            };
            match way["kind"].as_str() {
                Some("correction") => {
                    let to = names(&way["recipients"]);
                    format!(
                        "If undone: a correction to {}: “{}”",
                        if to.len() > 1 {
                            to.join(", ")
                        } else {
                            recipients(&to)
                        },
                        way["template"].as_str().unwrap_or_default()
                    )
                }
                Some(_) => {
                    let tool = way["tool"].as_str().unwrap_or_default();
                    let sentence = match self.get(tool).and_then(|s| s.display.as_deref()) {
                        Some(template) => fill_display(template, &way["args"]),
                        None => default_sentence(tool, &way["args"]),
                    };
                    format!("If undone: {}", lower_first(&sentence))
                }
                None => format!("If undone: {way}"),
            }
        }
    }

    /// Without a display template: the tool's name in words.
    fn default_sentence(tool: &str, args: &Value) -> String {
        let name = tool.replace(['_', '.'], " ");
        let mut sentence = upper_first(&name);
        if let Some(n) = args.as_object().map(|o| o.len()).filter(|n| *n > 0) {
            sentence.push_str(&format!(" ({n} argument{})", if n == 1 { "" } else { "s" }));
        }
        sentence
    }

    /// Whether any key or string in the JSON holds a deceptive character
    /// (JSON escaping would otherwise hide some of them).
    fn json_hides_characters(value: &Value) -> bool {
        match value {
            Value::String(text) => text.chars().any(is_deceptive),
            Value::Array(items) => items.iter().any(json_hides_characters),
            Value::Object(map) => map
                .iter()
                .any(|(k, v)| k.chars().any(is_deceptive) || json_hides_characters(v)),
            _ => false,
        }
    }

    fn upper_first(text: &str) -> String {
        let mut chars = text.chars();
        match chars.next() {
            Some(first) => first.to_uppercase().chain(chars).collect(),
            None => String::new(),
        }
    }

    fn lower_first(text: &str) -> String {
        let mut chars = text.chars();
        match chars.next() {
            Some(first) => first.to_lowercase().chain(chars).collect(),
            None => String::new(),
        }
    }
}

#[cfg(all(test, feature = "ssr"))]
mod tests {
    use super::*;
    use crate::saga::registry::Registry;
    use serde_json::json;

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

    const TOOLS: &str = r#"
        [[tool]]
        name = "capture_payment"
        class = "compensatable"
        connector = "stripe.capture"
        audience = "finance"
        display = "Capture {args.amount|money} from the hold {args.intent_key|short}"
        compensation = { tool = "refund", args = { charge_key = "{args.intent_key}", amount = "{args.amount}", currency = "{args.currency}" } }
        correction = { template = "A captured payment was refunded.", recipients = ["finance@example.com"], via = "smtp.send" }
        [[tool]]
        name = "refund"
        class = "irreversible"
        connector = "stripe.refund"
        audience = "finance"
        display = "Refund {args.amount|money}"
        correction = { template = "A refund was issued in error.", recipients = ["finance@example.com"] }
        [[tool]]
        name = "send_email"
        class = "irreversible"
        connector = "smtp.send"
        audience = "customer"
        gated = true
        display = "Email {args.to|recipients}: “{args.subject}”"
        correction = { template = "Please disregard our email.", recipients = ["{args.to}"] }
    "#;

    #[test]
    fn a_commit_step_reads_as_a_sentence_with_its_way_back() {
        let registry = Registry::from_toml(TOOLS).unwrap();
        let args = json!({"intent_key": "083bf4aa91c2d3e4", "amount": 3200, "currency": "usd"});
        let way_back = registry
            .get("capture_payment")
            .unwrap()
            .way_back("k", &args)
            .unwrap();
        let words = registry.in_words("capture_payment", &args, way_back.as_ref());
        assert_eq!(words.sentence, "Capture $32.00 from the hold 083bf4aa…");
        assert_eq!(words.if_undone, "If undone: refund $32.00");
        assert_eq!(words.audience, Audience::Finance);
        assert!(words.exact.contains("\"amount\": 3200"));
        assert!(!words.hidden_characters);
    }

    #[test]
    fn an_email_shows_its_recipients_reach_and_gate() {
        let registry = Registry::from_toml(TOOLS).unwrap();
        let args = json!({"to": ["a@example.com", "b@example.com", "c@example.com"], "subject": "Your lamp"});
        let way_back = registry
            .get("send_email")
            .unwrap()
            .way_back("k", &args)
            .unwrap();
        let words = registry.in_words("send_email", &args, way_back.as_ref());
        assert_eq!(words.sentence, "Email 3 recipients: “Your lamp”");
        assert_eq!(words.reach.as_deref(), Some("3 recipients · gated"));
        assert!(words.gated);
        assert_eq!(
            words.if_undone,
            "If undone: a correction to a@example.com, b@example.com, c@example.com: “Please disregard our email.”"
        );
    }

    #[test]
    fn what_the_approver_reads_is_what_will_be_sent() {
        let registry = Registry::from_toml(TOOLS).unwrap();
        let args = json!({"to": "grace@example.com", "subject": "Refund \u{202e}00.1$ approved"});
        let words = registry.in_words("send_email", &args, None);
        assert!(words.hidden_characters);
        assert!(words.sentence.contains("\\u{202e}"), "{}", words.sentence);
        assert!(!words.sentence.contains('\u{202e}'));
        assert!(!words.exact.contains('\u{202e}'));
    }

    #[test]
    fn a_corrections_text_reads_amounts_as_money() {
        let registry = Registry::from_toml(
            r#"
            [[tool]]
            name = "refund"
            class = "irreversible"
            connector = "stripe.refund"
            audience = "finance"
            correction = { template = "A refund of {args.amount|money} ({key}) was issued in error.", recipients = ["finance@example.com"] }
            "#,
        )
        .unwrap();
        let refund = registry.get("refund").unwrap();
        let args = json!({"amount": 500, "currency": "eur"});
        let (text, _) = refund
            .correction_for(Audience::Finance, "k9", &args)
            .unwrap();
        assert_eq!(text, "A refund of €5.00 (k9) was issued in error.");
        let bad = Registry::from_toml(
            r#"
            [[tool]]
            name = "refund"
            class = "irreversible"
            connector = "stripe.refund"
            audience = "finance"
            correction = { template = "A refund of {args.amount|dollars}.", recipients = ["finance@example.com"] }
            "#,
        )
        .unwrap_err()
        .to_string();
        assert!(bad.contains("unknown filter `dollars`"), "{bad}");
    }

    #[test]
    fn a_display_template_with_an_unknown_filter_is_refused() {
        assert_eq!(display_problem("Pay {args.amount|money}"), None);
        assert!(display_problem("Pay {args.amount|euros}")
            .unwrap()
            .contains("unknown filter `euros`"));
        assert!(display_problem("Pay {key}")
            .unwrap()
            .contains("unknown placeholder"));
    }
}
