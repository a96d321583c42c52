//! The tool registry (R1): every tool declared with its class and what
//! takes it back, read from a TOML file and refused at start-up with one
//! message per mistake, naming the tool and the field.

use super::class::{Audience, ToolClass};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

/// A call that reverses or compensates a step, written before the step runs
/// (R6). Its arguments are a template that may refer to `{key}` (the step's
/// idempotency key) and `{args.FIELD}`, never to an external id.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallTemplate {
    pub tool: String,
    #[serde(default)]
    pub args: toml::Table,
}

/// What is sent to the people who saw an irreversible effect (R10).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorrectionTemplate {
    pub template: String,
    pub recipients: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    pub name: String,
    pub class: ToolClass,
    /// The connector operation that performs the call (`stripe.capture` …).
    pub connector: String,
    #[serde(default = "default_audience")]
    pub audience: Audience,
    pub undo: Option<CallTemplate>,
    pub compensation: Option<CallTemplate>,
    pub correction: Option<CorrectionTemplate>,
    /// Runs only as a commit step of an approved pivot (R9).
    #[serde(default)]
    pub gated: bool,
    /// How long to wait before looking a key up a second time (R7).
    #[serde(default = "default_settle_ms")]
    pub settle_ms: u64,
}

fn default_audience() -> Audience {
    Audience::Internal
}

fn default_settle_ms() -> u64 {
    2000
}

/// One mistake in the tools file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryMistake {
    pub tool: String,
    pub field: &'static str,
    pub problem: String,
}

impl fmt::Display for RegistryMistake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tool `{}`, field `{}`: {}",
            self.tool, self.field, self.problem
        )
    }
}

/// Every mistake found, each on its own line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("the tools file is not valid TOML for a tool list: {0}")]
    Syntax(String),
    #[error("the tools file has {} mistake(s):\n{}", .0.len(), .0.iter().map(|m| format!("  - {m}")).collect::<Vec<_>>().join("\n"))]
    Mistakes(Vec<RegistryMistake>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolsFile {
    #[serde(default)]
    tool: Vec<toml::Value>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Registry {
    tools: BTreeMap<String, ToolSpec>,
}

impl Registry {
    /// Parses and validates a tools file; all mistakes are reported at once.
    pub fn from_toml(text: &str) -> Result<Registry, RegistryError> {
        let file: ToolsFile =
            toml::from_str(text).map_err(|e| RegistryError::Syntax(e.to_string()))?;
        let mut mistakes = Vec::new();
        let mut tools = BTreeMap::new();
        for (position, raw) in file.tool.into_iter().enumerate() {
            let label = raw
                .get("name")
                .and_then(|n| n.as_str())
                .map(str::to_owned)
                .unwrap_or_else(|| format!("#{}", position + 1));
            if raw.get("class").is_none() {
                mistakes.push(RegistryMistake {
                    tool: label,
                    field: "class",
                    problem: "missing; every tool needs one of pure, reversible, compensatable, irreversible".into(),
                });
                continue;
            }
            let spec: ToolSpec = match raw.try_into() {
                Ok(spec) => spec,
                Err(e) => {
                    mistakes.push(RegistryMistake {
                        tool: label,
                        field: "(entry)",
                        problem: e.to_string().trim().to_owned(),
                    });
                    continue;
                }
            };
            mistakes.extend(spec_mistakes(&spec));
            if tools.contains_key(&spec.name) {
                mistakes.push(RegistryMistake {
                    tool: spec.name.clone(),
                    field: "name",
                    problem: "declared twice".into(),
                });
            }
            tools.insert(spec.name.clone(), spec);
        }
        if mistakes.is_empty() {
            Ok(Registry { tools })
        } else {
            Err(RegistryError::Mistakes(mistakes))
        }
    }

    pub fn get(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.get(name)
    }

    pub fn tools(&self) -> impl Iterator<Item = &ToolSpec> {
        self.tools.values()
    }

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

/// R1: each class must say how its effect is taken back.
fn spec_mistakes(spec: &ToolSpec) -> Vec<RegistryMistake> {
    let mut mistakes = Vec::new();
    let mut say = |field: &'static str, problem: &str| {
        mistakes.push(RegistryMistake {
            tool: spec.name.clone(),
            field,
            problem: problem.to_owned(),
        })
    };
    if spec.name.trim().is_empty() {
        say("name", "empty");
    }
    if spec.connector.trim().is_empty() {
        say("connector", "empty");
    }
    match spec.class {
        ToolClass::Pure => {}
        ToolClass::Reversible if spec.undo.is_none() => {
            say("undo", "missing; a reversible tool declares its undo (delete the draft, cancel the authorisation)")
        }
        ToolClass::Compensatable if spec.compensation.is_none() => {
            say("compensation", "missing; a compensatable tool declares its compensation (refund, close)")
        }
        ToolClass::Irreversible if spec.correction.is_none() => {
            say("correction", "missing; an irreversible tool declares its correction (template and recipients)")
        }
        _ => {}
    }
    if let Some(correction) = &spec.correction {
        if correction.template.trim().is_empty() {
            say("correction.template", "empty");
        }
        if correction.recipients.is_empty() {
            say(
                "correction.recipients",
                "empty; name who receives the correction",
            );
        }
    }
    if spec.gated && spec.class != ToolClass::Irreversible {
        say(
            "gated",
            "only an irreversible tool can be gated behind the pivot",
        );
    }
    mistakes
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
        [[tool]]
        name = "crm.lookup"
        class = "pure"
        connector = "http.get"

        [[tool]]
        name = "stripe.authorize"
        class = "reversible"
        connector = "stripe.create_payment_intent"
        audience = "finance"
        undo = { tool = "stripe.cancel", args = { intent_key = "{key}" } }

        [[tool]]
        name = "email.send"
        class = "irreversible"
        connector = "smtp.send"
        audience = "customer"
        gated = true
        correction = { template = "Please disregard our earlier message.", recipients = ["{args.to}"] }
    "#;

    #[test]
    fn r1_a_complete_file_registers_every_tool() {
        let registry = Registry::from_toml(GOOD).unwrap();
        assert_eq!(registry.len(), 3);
        let email = registry.get("email.send").unwrap();
        assert_eq!(email.class, ToolClass::Irreversible);
        assert_eq!(email.audience, Audience::Customer);
        assert!(email.gated);
        assert_eq!(registry.get("crm.lookup").unwrap().settle_ms, 2000);
    }

    #[test]
    fn r1_registration_fails_without_a_class_naming_the_tool() {
        let err = Registry::from_toml(
            "[[tool]]\nname = \"jira.create\"\nconnector = \"jira.create_issue\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("tool `jira.create`, field `class`: missing"),
            "{err}"
        );
    }

    #[test]
    fn r1_each_class_needs_its_way_back_one_message_per_mistake() {
        let text = r#"
            [[tool]]
            name = "draft"
            class = "reversible"
            connector = "zendesk.draft"
            [[tool]]
            name = "charge"
            class = "compensatable"
            connector = "stripe.charge"
            [[tool]]
            name = "notify"
            class = "irreversible"
            connector = "smtp.send"
            [[tool]]
            name = "post"
            class = "irreversible"
            connector = "slack.post"
            correction = { template = "", recipients = [] }
        "#;
        let RegistryError::Mistakes(mistakes) = Registry::from_toml(text).unwrap_err() else {
            panic!("expected mistakes");
        };
        let lines: Vec<String> = mistakes
            .iter()
            .map(|m| format!("{} {}", m.tool, m.field))
            .collect();
        assert_eq!(
            lines,
            vec![
                "draft undo",
                "charge compensation",
                "notify correction",
                "post correction.template",
                "post correction.recipients"
            ]
        );
    }

    #[test]
    fn r1_unknown_class_and_fields_are_named() {
        let err = Registry::from_toml(
            "[[tool]]\nname = \"x\"\nclass = \"sometimes\"\nconnector = \"c\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("tool `x`"), "{err}");
        assert!(err.contains("sometimes"), "{err}");
        let err = Registry::from_toml(
            "[[tool]]\nname = \"y\"\nclass = \"pure\"\nconnector = \"c\"\ncolour = 1\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("colour"), "{err}");
    }

    #[test]
    fn r1_duplicate_names_and_bad_syntax_are_refused() {
        let twice = "[[tool]]\nname = \"a\"\nclass = \"pure\"\nconnector = \"c\"\n".repeat(2);
        assert!(Registry::from_toml(&twice)
            .unwrap_err()
            .to_string()
            .contains("declared twice"));
        assert!(matches!(
            Registry::from_toml("[[tool"),
            Err(RegistryError::Syntax(_))
        ));
    }
}
