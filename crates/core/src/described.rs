//! A registered call in words, for the person who decides: the sentence
//! its tool's display template makes of the arguments, who it reaches, and
//! what undoing it would do. Read through the template language of
//! `saga::words`; the same words on every page and in Slack.

use super::class::{Audience, ToolClass};
use super::registry::{Registry, ToolSpec};
use super::words::{
    fill_display_among, is_deceptive, names, plain, recipients, visible, CallInWords, Referents,
};
use serde_json::Value;

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
        self.in_words_among(tool, args, way_back, &Referents::new())
    }

    /// A call in words within its run: an argument that is an earlier
    /// step's key reads as what that step made (`known`).
    pub fn in_words_among(
        &self,
        tool: &str,
        args: &Value,
        way_back: Option<&Value>,
        known: &Referents,
    ) -> CallInWords {
        let spec = self.get(tool);
        let sentence = match spec.and_then(|s| s.display.as_deref()) {
            Some(template) => fill_display_among(template, args, known),
            None => default_sentence(tool, args),
        };
        let (sentence, hidden_in_sentence) = visible(&sentence);
        let pretty = serde_json::to_string_pretty(args).unwrap_or_default();
        let (exact, hidden_in_args) = visible(&pretty);
        let (if_undone, hidden_in_way_back) = visible(&self.if_undone_among(
            way_back,
            spec.map_or(ToolClass::Irreversible, |s| s.class),
            known,
        ));
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
        self.if_undone_among(way_back, class, &Referents::new())
    }

    /// As [`Registry::if_undone`], naming earlier steps by what they made.
    pub fn if_undone_among(
        &self,
        way_back: Option<&Value>,
        class: ToolClass,
        known: &Referents,
    ) -> String {
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
                    Some(template) => fill_display_among(template, &way["args"], known),
                    None => default_sentence(tool, &way["args"]),
                };
                format!("If undone: {}", lower_first(&sentence))
            }
            None => format!("If undone: {way}"),
        }
    }
}

impl Registry {
    /// How a person checks by hand whether this call took effect: the
    /// tool's `check` template filled in, or where to look by default.
    pub fn check_in_words(&self, tool: &str, args: &Value, key: &str, known: &Referents) -> String {
        match self.get(tool).and_then(|s| s.check.as_deref()) {
            Some(template) => {
                visible(&fill_display_among(
                    &template.replace("{key}", key),
                    args,
                    known,
                ))
                .0
            }
            None => format!(
                "Look in {} for what this call would have made; its key is under the call's \
                 technical details.",
                self.system_of(tool)
            ),
        }
    }

    /// The money a call of this tool moves, by its connector operation,
    /// with what it is: captured and charged money comes in (positive),
    /// refunded money goes out (negative). Minor units of the call's
    /// currency.
    pub fn money_moved(&self, tool: &str, args: &Value) -> Option<(&'static str, i64)> {
        let (what, sign) = match self.get(tool)?.connector.as_str() {
            "stripe.capture" => ("captured", 1),
            "stripe.charge" => ("charged", 1),
            "stripe.refund" => ("refunded", -1),
            _ => return None,
        };
        Some((what, sign * args.get("amount")?.as_i64()?))
    }

    /// The system a tool's calls reach, as a lead names it ("Stripe",
    /// "Jira", "the mail server", "warehouse").
    pub fn system_of(&self, tool: &str) -> String {
        let connector = self.get(tool).map_or(tool, |s| s.connector.as_str());
        let mut parts = connector.split('.');
        let first = parts.next().unwrap_or(connector);
        match first {
            "stripe" => "Stripe".to_owned(),
            "jira" => "Jira".to_owned(),
            "zendesk" => "Zendesk".to_owned(),
            "slack" => "Slack".to_owned(),
            "smtp" => "the mail server".to_owned(),
            // An upstream MCP server or a declared HTTP API: its own name.
            "mcp" | "http" => parts.next().unwrap_or(first).to_owned(),
            other => other.to_owned(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::words::display_problem;
    use serde_json::json;

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
    fn an_earlier_steps_key_reads_as_what_that_step_made() {
        let registry = Registry::from_toml(TOOLS).unwrap();
        let args = json!({"intent_key": "083bf4aa91c2d3e4", "amount": 3200, "currency": "usd"});
        let way_back = registry
            .get("capture_payment")
            .unwrap()
            .way_back("k", &args)
            .unwrap();
        let known: Referents =
            [("083bf4aa91c2d3e4".to_owned(), "pi_3Q9 (step 5)".to_owned())].into();
        let words = registry.in_words_among("capture_payment", &args, way_back.as_ref(), &known);
        assert_eq!(
            words.sentence,
            "Capture $32.00 from the hold pi_3Q9 (step 5)"
        );
        assert!(!words.sentence.contains("083bf4aa"));
        // Unknown keys still read as before.
        let words = registry.in_words("capture_payment", &args, None);
        assert_eq!(words.sentence, "Capture $32.00 from the hold 083bf4aa…");
    }

    #[test]
    fn a_tools_check_tells_a_person_where_to_look_and_is_validated() {
        let tools = format!(
            "{TOOLS}\ncheck = \"Search the sent mail for “{{args.subject}}” (Message-ID <{{key}}@saga-harness>)\"\n"
        );
        let registry = Registry::from_toml(&tools).unwrap();
        let args = json!({"to": "ada@example.com", "subject": "Your kettle"});
        assert_eq!(
            registry.check_in_words("send_email", &args, "k1", &Referents::new()),
            "Search the sent mail for “Your kettle” (Message-ID <k1@saga-harness>)"
        );
        // Without a check, where to look, never the key itself.
        let default = registry.check_in_words("refund", &args, "k1", &Referents::new());
        assert!(default.starts_with("Look in Stripe"), "{default}");
        assert!(!default.contains("k1"), "{default}");
        let bad = format!("{TOOLS}\ncheck = \"Search for {{args.subject|upper}}\"\n");
        let refused = Registry::from_toml(&bad).unwrap_err().to_string();
        assert!(refused.contains("check"), "{refused}");
        assert!(refused.contains("unknown filter `upper`"), "{refused}");
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
