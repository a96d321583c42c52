//! The tool registry (R1): every tool declared with its class and what
//! takes it back, read from a TOML file and refused at start-up with one
//! message per mistake, naming the tool and the field.

use super::class::{Audience, ToolClass};
use super::words::placeholders;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

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
    /// The connector operation that sends it (an email's correction is an
    /// email: irreversible tools default to their own connector).
    pub via: Option<String>,
}

/// A tool's corrections (R10): one per audience that can see its effect,
/// each to the people of that audience. The one-correction form
/// (`correction = { template, recipients }`) is for the tool's declared
/// `audience` only; a tool whose audience rules reach several audiences
/// declares one per audience (`correction.customer = { … }`), and an
/// audience with none declared gets no correction.
#[derive(Clone, Debug, PartialEq)]
pub enum Corrections {
    ForDeclaredAudience(CorrectionTemplate),
    PerAudience(BTreeMap<Audience, CorrectionTemplate>),
}

impl<'de> Deserialize<'de> for Corrections {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let table = toml::Table::deserialize(deserializer)?;
        let one_form = ["template", "recipients", "via"];
        if table.keys().any(|k| one_form.contains(&k.as_str())) {
            return toml::Value::Table(table)
                .try_into()
                .map(Corrections::ForDeclaredAudience)
                .map_err(D::Error::custom);
        }
        let mut per_audience = BTreeMap::new();
        for (name, declared) in table {
            let audience: Audience = name.parse().map_err(|_| {
                D::Error::custom(format!(
                    "`{name}` is neither a field of a correction (template, recipients, via) \
                     nor an audience (partner, finance, customer, public)"
                ))
            })?;
            let template: CorrectionTemplate = declared
                .try_into()
                .map_err(|e| D::Error::custom(format!("correction.{name}: {e}")))?;
            per_audience.insert(audience, template);
        }
        Ok(Corrections::PerAudience(per_audience))
    }
}

/// `audience` applies when argument `arg` equals `equals`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AudienceRule {
    pub arg: String,
    pub equals: toml::Value,
    pub audience: Audience,
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
    /// Widens the audience when an argument has a value: a charge with
    /// `receipt = true` reaches the customer, without it only finance.
    #[serde(default)]
    pub audience_when: Vec<AudienceRule>,
    pub undo: Option<CallTemplate>,
    pub compensation: Option<CallTemplate>,
    pub correction: Option<Corrections>,
    /// Runs only as a commit step of an approved pivot (R9).
    #[serde(default)]
    pub gated: bool,
    /// Runs only as another tool's undo or compensation, never as an
    /// agent's step, so it needs no way back of its own.
    #[serde(default)]
    pub way_back_only: bool,
    /// How long to wait before looking a key up a second time (R7).
    #[serde(default = "default_settle_ms")]
    pub settle_ms: u64,
    /// A JSON Schema (draft 2020-12) of the call's arguments, an object
    /// schema: served to agents (`GET /api/v1/tools`, MCP `tools/list`),
    /// and every new call is checked against it before anything is logged.
    #[serde(default)]
    pub schema: Option<serde_json::Value>,
    /// The call as a sentence for the person who decides on it, with
    /// `{args.FIELD}` and `{args.FIELD|money}` (`|recipients`, `|short`)
    /// placeholders: "Capture {args.amount|money} from the hold".
    pub display: Option<String>,
    /// How a person checks by hand whether a call of this tool took
    /// effect, when no system could say (R7): "Search the sent mail for the
    /// subject “{args.subject}”". The display placeholders, and `{key}` for
    /// the step's key.
    #[serde(default)]
    pub check: Option<String>,
    /// What the tool does, for the model choosing it (an upstream MCP
    /// server's own description when the tools file gives none).
    #[serde(default)]
    pub description: Option<String>,
    /// How long a call of this tool waits for approval before it expires
    /// ("30m", "4h"), instead of `[approvals] deadline`.
    #[serde(default)]
    pub approval_deadline: Option<String>,
    /// Every call of this tool needs two different approvers.
    #[serde(default)]
    pub two_people: bool,
    /// The groups whose members may approve a pivot or a held step that
    /// contains this tool; empty: `[approvals] approvers`, and when that
    /// is empty too, any approver.
    #[serde(default)]
    pub approvers: Vec<String>,
    /// Which arguments are money (`money = { amount = "amount", currency =
    /// "currency" }`), for `[[limits.money]]`.
    #[serde(default)]
    pub money: Option<super::limits::MoneyArgs>,
}

/// A tool as an upstream MCP server lists it: what the registry needs to
/// class it and check its calls.
#[derive(Clone, Debug, PartialEq)]
pub struct UpstreamTool {
    pub name: String,
    pub description: Option<String>,
    /// Its `inputSchema`.
    pub schema: serde_json::Value,
    /// What its annotations claim. The MCP specification says a client
    /// must treat them as untrusted: they class nothing unless the tools
    /// file trusts the server's hints.
    pub hints: ToolHints,
}

/// An upstream tool's annotations, as its server lists them (absent ones
/// are `None`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ToolHints {
    pub read_only: Option<bool>,
    pub destructive: Option<bool>,
    pub idempotent: Option<bool>,
    pub open_world: Option<bool>,
}

impl std::fmt::Display for ToolHints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let named = [
            ("readOnlyHint", self.read_only),
            ("destructiveHint", self.destructive),
            ("idempotentHint", self.idempotent),
            ("openWorldHint", self.open_world),
        ];
        let given: Vec<String> = named
            .iter()
            .filter_map(|(name, value)| value.map(|v| format!("{name} {v}")))
            .collect();
        if given.is_empty() {
            f.write_str("no hints")
        } else {
            f.write_str(&given.join(", "))
        }
    }
}

impl ToolSpec {
    /// What the limits need to know of this tool.
    pub fn shape(&self) -> super::limits::ToolShape {
        super::limits::ToolShape {
            name: self.name.clone(),
            pure: self.class == ToolClass::Pure,
            money: self.money.clone(),
            schema: self.schema.clone(),
        }
    }

    /// An upstream tool the tools file does not declare. Nothing says how
    /// to take its effect back, and its own annotations are only claims,
    /// so it is irreversible whatever it says: each call waits for a
    /// person, and a correction is only for the team. Only a server the
    /// tools file trusts (`trust_read_only_hints`) gets a read-only tool
    /// taken as pure.
    fn listed_upstream(
        name: String,
        operation: String,
        tool: UpstreamTool,
        trust_hints: bool,
    ) -> ToolSpec {
        ToolSpec {
            name,
            class: if trust_hints && tool.hints.read_only == Some(true) {
                ToolClass::Pure
            } else {
                ToolClass::Irreversible
            },
            connector: operation,
            audience: Audience::Internal,
            audience_when: Vec::new(),
            undo: None,
            compensation: None,
            correction: None,
            gated: false,
            way_back_only: false,
            settle_ms: default_settle_ms(),
            schema: Some(tool.schema),
            display: None,
            check: None,
            description: tool.description,
            approval_deadline: None,
            two_people: false,
            approvers: Vec::new(),
            money: None,
        }
    }

    /// The correction declared for the people of one audience, if any: an
    /// audience with none declared gets none (R10).
    pub fn correction_to(&self, audience: Audience) -> Option<&CorrectionTemplate> {
        match self.correction.as_ref()? {
            Corrections::ForDeclaredAudience(one) => (audience == self.audience).then_some(one),
            Corrections::PerAudience(each) => each.get(&audience),
        }
    }

    /// Every declared correction, with the audience it goes to.
    pub fn corrections(&self) -> Vec<(Audience, &CorrectionTemplate)> {
        match &self.correction {
            None => Vec::new(),
            Some(Corrections::ForDeclaredAudience(one)) => vec![(self.audience, one)],
            Some(Corrections::PerAudience(each)) => each.iter().map(|(a, c)| (*a, c)).collect(),
        }
    }

    /// The audiences this tool's effect can reach: the declared one and
    /// those its rules widen to.
    pub fn reachable_audiences(&self) -> Vec<Audience> {
        let mut reach: Vec<Audience> = std::iter::once(self.audience)
            .chain(self.audience_when.iter().map(|rule| rule.audience))
            .collect();
        reach.sort_unstable();
        reach.dedup();
        reach
    }

    /// The connector operation that sends this tool's correction to one
    /// audience.
    pub fn correction_channel(&self, audience: Audience) -> Option<&str> {
        self.channel_of(self.correction_to(audience)?)
    }

    /// Every operation that sends one of this tool's corrections.
    pub fn correction_channels(&self) -> Vec<&str> {
        let mut channels: Vec<&str> = self
            .corrections()
            .into_iter()
            .filter_map(|(_, c)| self.channel_of(c))
            .collect();
        channels.sort_unstable();
        channels.dedup();
        channels
    }

    fn channel_of<'a>(&'a self, correction: &'a CorrectionTemplate) -> Option<&'a str> {
        match (&correction.via, self.class) {
            (Some(via), _) => Some(via),
            (None, ToolClass::Irreversible) => Some(&self.connector),
            (None, _) => None,
        }
    }

    /// Who could see this call's effect, given its arguments: the widest of
    /// the rules that match, else the declared audience.
    pub fn audience_for(&self, args: &serde_json::Value) -> Audience {
        self.audience_when
            .iter()
            .filter(|rule| {
                let wanted = serde_json::to_value(&rule.equals).ok();
                args.get(&rule.arg).is_some() && args.get(&rule.arg) == wanted.as_ref()
            })
            .map(|rule| rule.audience)
            .fold(self.audience, Audience::max)
    }

    /// The pre-written way back (R6): the undo or compensation call with its
    /// arguments filled from the step's key and arguments, or the
    /// correction. `Err` says why it cannot be built for these arguments.
    pub fn way_back(
        &self,
        key: &str,
        args: &serde_json::Value,
    ) -> Result<Option<serde_json::Value>, String> {
        use serde_json::json;
        match self.class {
            ToolClass::Pure => Ok(None),
            ToolClass::Reversible | ToolClass::Compensatable => {
                let (kind, call) = match (&self.undo, &self.compensation) {
                    (Some(undo), _) => ("undo", undo),
                    (None, Some(compensation)) => ("compensation", compensation),
                    (None, None) => {
                        return Err(format!("{} declares no undo or compensation", self.name))
                    }
                };
                let filled = fill(
                    &serde_json::to_value(&call.args).map_err(|e| e.to_string())?,
                    key,
                    args,
                )?;
                Ok(Some(
                    json!({"kind": kind, "tool": call.tool, "args": filled}),
                ))
            }
            ToolClass::Irreversible => {
                let audience = self.audience_for(args);
                if audience.is_internal() && self.correction_to(audience).is_none() {
                    // Only the team saw it: nobody outside needs a letter.
                    return Ok(None);
                }
                let (template, recipients) = self.correction_for(audience, key, args)?;
                Ok(Some(json!({
                    "kind": "correction",
                    "audience": audience,
                    "template": template,
                    "recipients": recipients,
                })))
            }
        }
    }

    /// The correction declared for `audience`, filled for this call: its
    /// text and who receives it. `Err` when that audience has none or it
    /// names nobody for these arguments.
    pub fn correction_for(
        &self,
        audience: Audience,
        key: &str,
        args: &serde_json::Value,
    ) -> Result<(String, Vec<String>), String> {
        let Some(correction) = self.correction_to(audience) else {
            return Err(format!(
                "{} declares no correction for the {audience} audience",
                self.name
            ));
        };
        let mut recipients = Vec::new();
        for recipient in &correction.recipients {
            match fill(&serde_json::Value::String(recipient.clone()), key, args)? {
                serde_json::Value::String(one) if !one.trim().is_empty() => recipients.push(one),
                serde_json::Value::Array(many) => {
                    recipients.extend(many.iter().filter_map(|v| v.as_str()).map(str::to_owned))
                }
                _ => {}
            }
        }
        if recipients.is_empty() {
            return Err("the correction has no recipient for these arguments".into());
        }
        Ok((fill_once(&correction.template, key, args)?, recipients))
    }
}

/// Fills a correction's text in one pass over the template: `{key}` and
/// `{args.FIELD}` as [`fill`] does, `{args.FIELD|filter}` as the dashboard
/// writes it ("$9.00"). What an argument puts in is never read again, so a
/// value that looks like a placeholder reaches the letter as written.
pub fn fill_once(template: &str, key: &str, args: &serde_json::Value) -> Result<String, String> {
    use serde_json::Value;
    let mut out = String::new();
    let mut done = 0;
    for placeholder in placeholders(template) {
        let placeholder = placeholder?;
        out.push_str(&template[done..placeholder.start]);
        let whole = &template[placeholder.start..placeholder.end];
        if placeholder.name.contains('|') {
            // Amounts and recipient counts read as in the dashboard.
            out.push_str(&super::words::fill_filtered(whole, args));
        } else {
            match fill(&Value::String(whole.to_owned()), key, args)? {
                Value::String(text) => out.push_str(&text),
                other => out.push_str(&other.to_string()),
            }
        }
        done = placeholder.end;
    }
    out.push_str(&template[done..]);
    Ok(out)
}

/// Fills `{key}` and `{args.FIELD}` in every string of a template. A string
/// that is exactly one placeholder takes the argument's JSON value (so an
/// amount stays a number); a missing argument is an error naming it.
pub fn fill(
    template: &serde_json::Value,
    key: &str,
    args: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    use serde_json::Value;
    let lookup = |name: &str| -> Result<Value, String> {
        if name == "key" {
            return Ok(Value::String(key.to_owned()));
        }
        let Some(field) = name.strip_prefix("args.") else {
            return Err(format!(
                "unknown placeholder {{{name}}}: use {{key}} or {{args.FIELD}}"
            ));
        };
        args.pointer(&format!("/{}", field.replace('.', "/")))
            .filter(|v| !v.is_null())
            .cloned()
            .ok_or_else(|| format!("the call has no argument `{field}` to fill {{{name}}}"))
    };
    match template {
        Value::String(text) => {
            if let Some(name) = text.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
                if !name.contains(['{', '}']) {
                    return lookup(name);
                }
            }
            let mut out = String::new();
            let mut done = 0;
            for placeholder in placeholders(text) {
                let placeholder = placeholder?;
                out.push_str(&text[done..placeholder.start]);
                match lookup(placeholder.name)? {
                    Value::String(s) => out.push_str(&s),
                    other => out.push_str(&other.to_string()),
                }
                done = placeholder.end;
            }
            out.push_str(&text[done..]);
            Ok(Value::String(out))
        }
        Value::Array(items) => items
            .iter()
            .map(|v| fill(v, key, args))
            .collect::<Result<_, _>>()
            .map(Value::Array),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| fill(v, key, args).map(|v| (k.clone(), v)))
            .collect::<Result<_, _>>()
            .map(Value::Object),
        other => Ok(other.clone()),
    }
}

fn default_audience() -> Audience {
    Audience::Internal
}

fn default_settle_ms() -> u64 {
    2000
}

/// Compiled argument schemas, by tool.
#[derive(Clone, Default)]
struct ArgsSchemas(BTreeMap<String, Arc<jsonschema::Validator>>);

impl PartialEq for ArgsSchemas {
    /// Compiled from the tools' `schema` fields, which `Registry` compares.
    fn eq(&self, other: &Self) -> bool {
        self.0.keys().eq(other.0.keys())
    }
}

impl fmt::Debug for ArgsSchemas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

/// A schema for a tool's arguments, compiled: it must describe an object.
fn compile_schema(schema: &serde_json::Value) -> Result<jsonschema::Validator, String> {
    if schema.get("type").and_then(|t| t.as_str()) != Some("object") {
        return Err(
            "must be a JSON Schema with `type = \"object\"`: a call's arguments are an object"
                .into(),
        );
    }
    jsonschema::validator_for(schema).map_err(|e| format!("not a valid JSON Schema: {e}"))
}

/// Why a call's arguments do not fit the tool's schema, naming the argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgsMistake {
    /// The argument, as a path (`items.0`); the missing one for `required`.
    pub field: String,
    pub problem: String,
}

impl ArgsMistake {
    fn of(error: &jsonschema::ValidationError<'_>) -> ArgsMistake {
        let path = error
            .instance_path()
            .as_str()
            .trim_start_matches('/')
            .replace('/', ".");
        let field = match error.kind() {
            jsonschema::error::ValidationErrorKind::Required { property } => {
                let missing = property
                    .as_str()
                    .map_or_else(|| property.to_string(), str::to_owned);
                if path.is_empty() {
                    missing
                } else {
                    format!("{path}.{missing}")
                }
            }
            _ => path,
        };
        ArgsMistake {
            field,
            problem: error.to_string(),
        }
    }
}

impl fmt::Display for ArgsMistake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "the arguments: {}", self.problem)
        } else {
            write!(f, "argument `{}`: {}", self.field, self.problem)
        }
    }
}

/// How a mistake in `[limits]` names its limit in `RegistryMistake::tool`.
const LIMIT_MISTAKE: &str = "[limits] ";

/// One mistake in the tools file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryMistake {
    pub tool: String,
    pub field: &'static str,
    pub problem: String,
}

impl fmt::Display for RegistryMistake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.tool.strip_prefix(LIMIT_MISTAKE) {
            Some(limit) => write!(
                f,
                "limit `{limit}`, field `{}`: {}",
                self.field, self.problem
            ),
            None => write!(
                f,
                "tool `{}`, field `{}`: {}",
                self.tool, self.field, self.problem
            ),
        }
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
    /// Where each connector reaches its system and which environment
    /// variables hold its credentials; read by the connectors themselves.
    #[serde(default)]
    connectors: toml::Table,
    /// Where approvals are also asked for (`[approvals.slack]`); read by
    /// the approvals module.
    #[serde(default)]
    approvals: toml::Table,
    /// `[[limits.money]]`, `[[limits.recipients]]`, `[[limits.calls]]`.
    #[serde(default)]
    limits: toml::Table,
    /// `[retention]`: a daily pass that prunes settled history.
    #[serde(default)]
    retention: toml::Table,
}

/// `[retention]`: once a day, the runs last changed longer ago than
/// `older_than` that nothing can still move leave the saga log, each
/// first written to a JSON-lines file under `archive_dir` when set. Off
/// unless the section is there.
#[derive(Clone, Debug, PartialEq)]
pub struct RetentionPolicy {
    pub older_than: std::time::Duration,
    pub archive_dir: Option<std::path::PathBuf>,
    pub share: Share,
}

/// The most of the time a pruning pass works: after each page it rests
/// long enough that its work is this fraction of the whole, and agents'
/// calls have the database (and the CPU) to themselves the rest.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Share(f64);

impl Share {
    /// A tenth: agents' calls beside a pass keep nine tenths and more of
    /// their rate (benches/README.md's retention table measures it).
    pub const DEFAULT: Share = Share(0.1);
    /// All the time: no rest between pages.
    pub const FLAT_OUT: Share = Share(1.0);

    /// A fraction in (0, 1].
    pub fn new(fraction: f64) -> Result<Share, String> {
        if fraction > 0.0 && fraction <= 1.0 {
            Ok(Share(fraction))
        } else {
            Err(Share::refusal(fraction))
        }
    }

    /// Why `given` is not a share.
    fn refusal(given: impl std::fmt::Display) -> String {
        format!(
            "must be a fraction of the time greater than 0 and at most 1 (0.1 is a tenth), not {given}"
        )
    }

    /// The rest after `worked` that keeps the work to this share.
    pub fn rest_after(self, worked: std::time::Duration) -> std::time::Duration {
        worked.mul_f64((1.0 - self.0) / self.0)
    }
}

impl std::str::FromStr for Share {
    type Err = String;

    fn from_str(text: &str) -> Result<Share, String> {
        match text.trim().parse::<f64>() {
            Ok(fraction) => Share::new(fraction),
            Err(_) => Err(Share::refusal(format!("`{text}`"))),
        }
    }
}

fn retention_policy(
    section: &toml::Table,
    mistakes: &mut Vec<RegistryMistake>,
) -> Option<RetentionPolicy> {
    if section.is_empty() {
        return None;
    }
    let mut say = |field: &'static str, problem: String| {
        mistakes.push(RegistryMistake {
            tool: "[retention]".into(),
            field,
            problem,
        })
    };
    for key in section.keys() {
        if !matches!(key.as_str(), "older_than" | "archive_dir" | "share") {
            say(
                "(section)",
                format!(
                    "`{key}` is not a setting here; the settings are older_than, archive_dir and share"
                ),
            );
        }
    }
    let older_than = match section.get("older_than").map(|v| v.as_str()) {
        Some(Some(text)) => match duration_setting(text) {
            Ok(age) => Some(age),
            Err(problem) => {
                say("older_than", problem);
                None
            }
        },
        Some(None) => {
            say("older_than", "must be a duration like \"90d\"".into());
            None
        }
        None => {
            say(
                "older_than",
                "missing: how long a run stays after its last change, like \"90d\"".into(),
            );
            None
        }
    };
    let archive_dir = match section.get("archive_dir") {
        None => None,
        Some(toml::Value::String(dir)) if !dir.trim().is_empty() => {
            Some(std::path::PathBuf::from(dir))
        }
        Some(_) => {
            say("archive_dir", "must be a directory path".into());
            None
        }
    };
    let share = match section.get("share") {
        None => Ok(Share::DEFAULT),
        Some(toml::Value::Float(f)) => Share::new(*f),
        Some(toml::Value::Integer(n)) => Share::new(*n as f64),
        Some(other) => Err(Share::refusal(other)),
    }
    .unwrap_or_else(|problem| {
        say("share", problem);
        Share::DEFAULT
    });
    older_than.map(|older_than| RetentionPolicy {
        older_than,
        archive_dir,
        share,
    })
}

/// How long approvals wait (`[approvals]`): until a deadline, after which
/// they expire (never a person's "no"), and, before it, until someone
/// else is asked as well.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ApprovalPolicy {
    /// `deadline`: how long an approval waits, unless its tool says otherwise.
    pub deadline: Option<std::time::Duration>,
    /// `escalate_after`: when a waiting approval is posted again, to the
    /// escalation channel.
    pub escalate_after: Option<std::time::Duration>,
    /// `two_people_above`: a call whose `amount` argument (in minor units)
    /// is above this needs two different approvers.
    pub two_people_above: Option<i64>,
    /// Each tool's own `approval_deadline`.
    per_tool: BTreeMap<String, std::time::Duration>,
    /// `approvers`: the groups that may decide calls of a tool that names
    /// none of its own; empty: any approver.
    pub approvers: Vec<String>,
}

impl ApprovalPolicy {
    /// How many different people must approve this call: two when its
    /// tool says so or its amount is above `two_people_above`.
    pub fn approvers_for(&self, spec: &ToolSpec, args: &serde_json::Value) -> i64 {
        let large = match (
            self.two_people_above,
            args.get("amount").and_then(|a| a.as_i64()),
        ) {
            (Some(limit), Some(amount)) => amount > limit,
            _ => false,
        };
        if spec.two_people || large {
            2
        } else {
            1
        }
    }

    /// How long a call of `tool` may wait for approval.
    pub fn deadline_for(&self, tool: &str) -> Option<std::time::Duration> {
        self.per_tool.get(tool).copied().or(self.deadline)
    }
}

/// A list of group names, each a non-empty word without spaces.
fn group_names(value: &toml::Value) -> Result<Vec<String>, String> {
    let problem = || "must be a list of group names, like [\"billing-leads\"]".to_owned();
    let items = value.as_array().ok_or_else(problem)?;
    items
        .iter()
        .map(|item| match item.as_str() {
            Some(name) if !name.trim().is_empty() && !name.contains(char::is_whitespace) => {
                Ok(name.to_owned())
            }
            _ => Err(problem()),
        })
        .collect()
}

/// Reads a duration written as people write one ("90s", "30m", "4h 30m").
fn duration_setting(text: &str) -> Result<std::time::Duration, String> {
    match humantime::parse_duration(text) {
        Ok(duration) if duration.is_zero() => Err("must be longer than zero".into()),
        Ok(duration) => Ok(duration),
        Err(e) => Err(format!(
            "`{text}` is not a duration like \"30m\" or \"4h\": {e}"
        )),
    }
}

/// The `[approvals]` section's own settings (its `slack` table belongs to
/// the Slack approvals).
fn approval_policy(
    section: &toml::Table,
    tools: &BTreeMap<String, ToolSpec>,
    mistakes: &mut Vec<RegistryMistake>,
) -> ApprovalPolicy {
    let mut policy = ApprovalPolicy::default();
    let mut say = |tool: &str, field: &'static str, problem: String| {
        mistakes.push(RegistryMistake {
            tool: tool.to_owned(),
            field,
            problem,
        })
    };
    for (key, value) in section {
        if key == "two_people_above" {
            match value.as_integer() {
                Some(limit) if limit >= 0 => policy.two_people_above = Some(limit),
                _ => say(
                    "[approvals]",
                    "two_people_above",
                    "must be an amount in minor units (cents), like 50000".into(),
                ),
            }
            continue;
        }
        if key == "approvers" {
            match group_names(value) {
                Ok(groups) => policy.approvers = groups,
                Err(problem) => say("[approvals]", "approvers", problem),
            }
            continue;
        }
        let target = match key.as_str() {
            "deadline" => &mut policy.deadline,
            "escalate_after" => &mut policy.escalate_after,
            "slack" => continue,
            other => {
                say(
                    "[approvals]",
                    "(section)",
                    format!("`{other}` is not a setting (deadline, escalate_after, two_people_above, approvers, slack)"),
                );
                continue;
            }
        };
        let field = if key == "deadline" {
            "deadline"
        } else {
            "escalate_after"
        };
        match value.as_str().map(duration_setting) {
            Some(Ok(duration)) => *target = Some(duration),
            Some(Err(problem)) => say("[approvals]", field, problem),
            None => say(
                "[approvals]",
                field,
                "must be a duration in quotes, like \"30m\"".into(),
            ),
        }
    }
    for spec in tools.values() {
        if let Some(text) = &spec.approval_deadline {
            match duration_setting(text) {
                Ok(duration) => {
                    policy.per_tool.insert(spec.name.clone(), duration);
                }
                Err(problem) => say(&spec.name, "approval_deadline", problem),
            }
        }
    }
    if let (Some(deadline), Some(escalate)) = (policy.deadline, policy.escalate_after) {
        if escalate >= deadline {
            say(
                "[approvals]",
                "escalate_after",
                "must be shorter than the deadline, or nobody is asked before it expires".into(),
            );
        }
    }
    policy
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Registry {
    tools: BTreeMap<String, ToolSpec>,
    connectors: toml::Table,
    approvals: toml::Table,
    approval_policy: ApprovalPolicy,
    schemas: ArgsSchemas,
    limits: super::limits::Limits,
    retention: Option<RetentionPolicy>,
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
        // A way back names a tool that must itself be declared.
        for spec in tools.values() {
            for (field, call) in [("undo", &spec.undo), ("compensation", &spec.compensation)] {
                if let Some(call) = call {
                    if !tools.contains_key(&call.tool) {
                        mistakes.push(RegistryMistake {
                            tool: spec.name.clone(),
                            field,
                            problem: format!("names tool `{}`, which is not declared", call.tool),
                        });
                    }
                }
            }
        }
        let mut schemas = ArgsSchemas::default();
        for spec in tools.values() {
            let Some(schema) = &spec.schema else { continue };
            match compile_schema(schema) {
                Ok(validator) => {
                    schemas.0.insert(spec.name.clone(), Arc::new(validator));
                }
                Err(problem) => mistakes.push(RegistryMistake {
                    tool: spec.name.clone(),
                    field: "schema",
                    problem,
                }),
            }
        }
        let approval_policy = approval_policy(&file.approvals, &tools, &mut mistakes);
        let retention = retention_policy(&file.retention, &mut mistakes);
        let shapes = tools
            .iter()
            .map(|(name, spec)| (name.clone(), spec.shape()))
            .collect();
        let mut limit_mistakes = Vec::new();
        let limits = super::limits::read_limits(&file.limits, &shapes, &mut limit_mistakes);
        mistakes.extend(limit_mistakes.into_iter().map(|(limit, field, problem)| {
            RegistryMistake {
                tool: format!("{LIMIT_MISTAKE}{limit}"),
                field,
                problem,
            }
        }));
        if mistakes.is_empty() {
            Ok(Registry {
                tools,
                connectors: file.connectors,
                approvals: file.approvals,
                approval_policy,
                schemas,
                limits,
                retention,
            })
        } else {
            Err(RegistryError::Mistakes(mistakes))
        }
    }

    pub fn get(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.get(name)
    }

    /// Checks a call's arguments against the tool's schema; the first
    /// mistake names the argument. A tool without a schema takes any
    /// object.
    pub fn check_args(&self, tool: &str, args: &serde_json::Value) -> Result<(), ArgsMistake> {
        let Some(validator) = self.schemas.0.get(tool) else {
            return Ok(());
        };
        match validator.iter_errors(args).next() {
            None => Ok(()),
            Some(error) => Err(ArgsMistake::of(&error)),
        }
    }

    /// Takes in the tools an upstream MCP server lists (operation
    /// `mcp.SERVER.TOOL`). A tool the tools file declares on that operation
    /// keeps its declaration, and gains the upstream's schema and
    /// description where it gives none. Any other is added as
    /// `PREFIX_TOOL`, irreversible (each call waits for a person) unless the
    /// server's hints are trusted and say read-only. Returns the operations
    /// the server serves.
    pub fn adopt_upstream(
        &mut self,
        server: &str,
        prefix: &str,
        trust_hints: bool,
        listed: Vec<UpstreamTool>,
    ) -> Result<Vec<String>, Vec<RegistryMistake>> {
        let mut mistakes = Vec::new();
        let mut operations = Vec::new();
        for tool in listed {
            let operation = format!("mcp.{server}.{}", tool.name);
            let declared = self
                .tools
                .values_mut()
                .find(|spec| spec.connector == operation);
            let spec = match declared {
                Some(spec) => {
                    spec.schema.get_or_insert(tool.schema);
                    if spec.description.is_none() {
                        spec.description = tool.description;
                    }
                    spec.clone()
                }
                None => {
                    let name = format!("{prefix}_{}", tool.name);
                    if self.tools.contains_key(&name) {
                        mistakes.push(RegistryMistake {
                            tool: name,
                            field: "name",
                            problem: format!(
                                "declared in the tools file and also listed by the upstream MCP server `{server}`; \
                                 give the server another prefix"
                            ),
                        });
                        continue;
                    }
                    let spec =
                        ToolSpec::listed_upstream(name, operation.clone(), tool, trust_hints);
                    self.tools.insert(spec.name.clone(), spec.clone());
                    spec
                }
            };
            if let Some(schema) = &spec.schema {
                match compile_schema(schema) {
                    Ok(validator) => {
                        self.schemas
                            .0
                            .insert(spec.name.clone(), Arc::new(validator));
                    }
                    Err(problem) => mistakes.push(RegistryMistake {
                        tool: spec.name.clone(),
                        field: "schema",
                        problem: format!(
                            "as listed by the upstream MCP server `{server}`: {problem}"
                        ),
                    }),
                }
            }
            operations.push(operation);
        }
        if mistakes.is_empty() {
            Ok(operations)
        } else {
            Err(mistakes)
        }
    }

    /// The `[connectors]` section of the tools file.
    pub fn connector_settings(&self) -> &toml::Table {
        &self.connectors
    }

    /// The `[approvals]` section: where else approvals are asked for.
    pub fn approval_settings(&self) -> &toml::Table {
        &self.approvals
    }

    /// How long approvals wait, and when they are escalated.
    /// The tools file's limits on the sum of correct calls.
    pub fn limits(&self) -> &super::limits::Limits {
        &self.limits
    }

    /// `[retention]`, when the tools file sets it.
    pub fn retention(&self) -> Option<&RetentionPolicy> {
        self.retention.as_ref()
    }

    pub fn approval_policy(&self) -> &ApprovalPolicy {
        &self.approval_policy
    }

    /// The groups whose members may decide a call of `tool`: its own
    /// `approvers`, else `[approvals] approvers`; empty: any approver.
    pub fn approver_groups(&self, tool: &str) -> &[String] {
        match self.tools.get(tool) {
            Some(spec) if !spec.approvers.is_empty() => &spec.approvers,
            _ => &self.approval_policy.approvers,
        }
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
    [
        shape_mistakes(spec),
        correction_mistakes(spec),
        template_mistakes(spec),
        super::limits::money_mistakes(&spec.shape()),
    ]
    .into_iter()
    .flatten()
    .map(|(field, problem)| RegistryMistake {
        tool: spec.name.clone(),
        field,
        problem,
    })
    .collect()
}

/// A field and what is wrong with it.
type FieldMistake = (&'static str, String);

/// Names, the way back each class needs, and what may be gated or kept
/// for undoing others.
fn shape_mistakes(spec: &ToolSpec) -> Vec<FieldMistake> {
    let mut found = Vec::new();
    let mut say = |field: &'static str, problem: &str| found.push((field, problem.to_owned()));
    if spec.name.trim().is_empty() {
        say("name", "empty");
    }
    if spec.connector.trim().is_empty() {
        say("connector", "empty");
    }
    if spec
        .approvers
        .iter()
        .any(|g| g.trim().is_empty() || g.contains(char::is_whitespace))
    {
        say(
            "approvers",
            "must be a list of group names, like [\"billing-leads\"]",
        );
    }
    match spec.class {
        ToolClass::Pure => {}
        _ if spec.way_back_only => {}
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
    if spec.way_back_only && (spec.gated || spec.class == ToolClass::Pure) {
        say(
            "way_back_only",
            "only a tool with an effect, not gated, can be reserved for undoing others",
        );
    }
    if spec.gated && spec.class != ToolClass::Irreversible {
        say(
            "gated",
            "only an irreversible tool can be gated behind the pivot",
        );
    }
    found
}

/// R10: a correction for each audience the tool reaches, and only those;
/// a customer's goes to the customer of the call.
fn correction_mistakes(spec: &ToolSpec) -> Vec<FieldMistake> {
    let mut found = Vec::new();
    let mut say = |field: &'static str, problem: &str| found.push((field, problem.to_owned()));
    let reachable = spec.reachable_audiences();
    if let Some(Corrections::ForDeclaredAudience(_)) = &spec.correction {
        let outside: Vec<&str> = reachable
            .iter()
            .filter(|a| !a.is_internal())
            .map(|a| a.as_str())
            .collect();
        if outside.len() > 1 {
            say(
                "correction",
                &format!(
                    "this tool reaches more than one audience ({}): declare its correction per audience \
                     (correction.{} = {{ template, recipients, via }} …), so each goes only to the people who saw it",
                    outside.join(", "),
                    outside[0]
                ),
            );
        }
    }
    for (audience, correction) in spec.corrections() {
        if !reachable.contains(&audience) {
            say(
                "correction",
                &format!(
                    "declares a correction for the {audience} audience, which this tool never reaches (it reaches {})",
                    reachable.iter().map(|a| a.as_str()).collect::<Vec<_>>().join(", ")
                ),
            );
        }
        if correction.template.trim().is_empty() {
            say("correction.template", "empty");
        }
        if correction.recipients.is_empty() {
            say(
                "correction.recipients",
                "empty; name who receives the correction",
            );
        }
        // A customer is whoever this call was about: a fixed address
        // cannot be them, and would write to someone who never saw it.
        if audience == Audience::Customer
            && !correction.recipients.is_empty()
            && !correction.recipients.iter().all(|r| r.contains("{args."))
        {
            say(
                "correction.recipients",
                "a customer's correction goes to the customer of the call: name the argument that holds their address ({args.FIELD}), not a fixed address",
            );
        }
    }
    let may_reach_outside = spec.audience != Audience::Internal
        || spec
            .audience_when
            .iter()
            .any(|rule| rule.audience != Audience::Internal);
    let undoable = matches!(spec.class, ToolClass::Reversible | ToolClass::Compensatable)
        && !spec.way_back_only;
    if spec.correction.is_none() && undoable && may_reach_outside {
        say(
            "correction",
            "missing; an effect people outside the team can see needs a correction (template, recipients, via) for when it is undone",
        );
    }
    if undoable && spec.corrections().iter().any(|(_, c)| c.via.is_none()) {
        say(
            "correction.via",
            "missing; name the connector operation that sends this correction",
        );
    }
    found
}

/// Placeholders that could never be filled: in the display line, the way
/// back, the correction's text and recipients.
fn template_mistakes(spec: &ToolSpec) -> Vec<FieldMistake> {
    let mut found = Vec::new();
    let mut say = |field: &'static str, problem: &str| found.push((field, problem.to_owned()));
    if let Some(problem) = spec
        .display
        .as_deref()
        .and_then(super::words::display_problem)
    {
        say("display", &problem);
    }
    if let Some(problem) = spec
        .check
        .as_deref()
        .and_then(|check| super::words::display_problem(&check.replace("{key}", "")))
    {
        say("check", &problem);
    }
    // R6: a way back is filled in before the call, from the key and the
    // arguments; any other placeholder could never be filled, and every
    // call of the tool would be held for a person.
    for (field, call) in [("undo", &spec.undo), ("compensation", &spec.compensation)] {
        if let Some(problem) = call.as_ref().and_then(|c| {
            c.args
                .values()
                .find_map(|v| placeholder_problem(&toml_strings(v)))
        }) {
            say(field, &problem);
        }
    }
    for (_, correction) in spec.corrections() {
        // The text may use the display filters; recipients may not.
        let unfiltered =
            super::words::fill_filtered(&correction.template, &serde_json::Value::Null);
        let template_problem = super::words::display_problem_in_filters(&correction.template)
            .or_else(|| placeholder_problem(&[&unfiltered]));
        if let Some(problem) = template_problem.or_else(|| {
            correction
                .recipients
                .iter()
                .find_map(|t| placeholder_problem(&[t.as_str()]))
        }) {
            say("correction", &problem);
        }
    }
    found
}

/// Every string inside a TOML value.
fn toml_strings(value: &toml::Value) -> Vec<&str> {
    match value {
        toml::Value::String(text) => vec![text.as_str()],
        toml::Value::Array(items) => items.iter().flat_map(toml_strings).collect(),
        toml::Value::Table(table) => table.values().flat_map(toml_strings).collect(),
        _ => Vec::new(),
    }
}

/// What is wrong with the placeholders in these strings, if anything: only
/// `{key}` and `{args.FIELD}` can be filled (see [`fill`]).
fn placeholder_problem(texts: &[&str]) -> Option<String> {
    texts
        .iter()
        .flat_map(|text| placeholders(text))
        .find_map(|placeholder| {
            let name = match placeholder {
                Ok(placeholder) => placeholder.name,
                Err(problem) => return Some(problem),
            };
            let known = name == "key" || name.strip_prefix("args.").is_some_and(|f| !f.is_empty());
            (!known).then(|| {
                format!(
                    "unknown placeholder {{{name}}}: use {{key}} (the step's idempotency key) or \
                 {{args.FIELD}}; an external id does not exist before the call"
                )
            })
        })
}

#[cfg(test)]
mod tests {
    #[test]
    fn approval_deadlines_are_durations_and_a_tools_own_comes_first() {
        let file = |approvals: &str, tool: &str| {
            format!(
                "[[tool]]\nname = \"send\"\nclass = \"pure\"\nconnector = \"x.send\"\n{tool}\n\
                 [[tool]]\nname = \"post\"\nclass = \"pure\"\nconnector = \"x.post\"\n\
                 [approvals]\n{approvals}"
            )
        };
        let registry = Registry::from_toml(&file(
            "deadline = \"4h\"\nescalate_after = \"30m\"",
            "approval_deadline = \"15m\"",
        ))
        .unwrap();
        let policy = registry.approval_policy();
        let minutes = |m: u64| Some(std::time::Duration::from_secs(m * 60));
        assert_eq!(policy.deadline_for("send"), minutes(15));
        assert_eq!(policy.deadline_for("post"), minutes(240));
        assert_eq!(policy.escalate_after, minutes(30));

        for (approvals, tool, field) in [
            ("deadline = \"soon\"", "", "deadline"),
            ("deadline = 30", "", "deadline"),
            ("deadline = \"0s\"", "", "deadline"),
            ("", "approval_deadline = \"a while\"", "approval_deadline"),
            (
                "deadline = \"1h\"\nescalate_after = \"2h\"",
                "",
                "escalate_after",
            ),
            ("wait = \"1h\"", "", "(section)"),
        ] {
            let Err(RegistryError::Mistakes(mistakes)) =
                Registry::from_toml(&file(approvals, tool))
            else {
                panic!("accepted: {approvals} {tool}")
            };
            assert_eq!(mistakes[0].field, field, "{approvals} {tool}: {mistakes:?}");
        }
    }

    #[test]
    fn a_tools_argument_schema_must_describe_an_object_and_compile() {
        let file = |schema: &str| {
            format!("[[tool]]\nname = \"look\"\nclass = \"pure\"\nconnector = \"x.look\"\n{schema}")
        };
        let Err(RegistryError::Mistakes(mistakes)) =
            Registry::from_toml(&file("[tool.schema]\ntype = \"string\""))
        else {
            panic!("a non-object schema was accepted")
        };
        assert_eq!(mistakes[0].field, "schema");
        assert!(
            mistakes[0].problem.contains("object"),
            "{}",
            mistakes[0].problem
        );
        let Err(RegistryError::Mistakes(mistakes)) = Registry::from_toml(&file(
            "[tool.schema]\ntype = \"object\"\n[tool.schema.properties]\nn = { type = \"no-such-type\" }",
        )) else {
            panic!("an invalid schema was accepted")
        };
        assert_eq!(mistakes[0].field, "schema");
        let registry = Registry::from_toml(&file(
            "[tool.schema]\ntype = \"object\"\nrequired = [\"q\"]\n[tool.schema.properties]\nq = { type = \"string\" }",
        ))
        .unwrap();
        assert_eq!(
            registry.check_args("look", &serde_json::json!({"q": "x"})),
            Ok(())
        );
        let missing = registry
            .check_args("look", &serde_json::json!({}))
            .unwrap_err();
        assert_eq!(missing.field, "q");
        let wrong = registry
            .check_args("look", &serde_json::json!({"q": 3}))
            .unwrap_err();
        assert_eq!(wrong.field, "q");
    }

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
        correction = { template = "The hold on your card was released.", recipients = ["{args.email}"], via = "smtp.send" }

        [[tool]]
        name = "stripe.cancel"
        class = "compensatable"
        connector = "stripe.cancel_payment_intent"
        compensation = { tool = "stripe.authorize" }

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
        assert_eq!(registry.len(), 4);
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
    fn r6_a_way_back_or_correction_with_a_placeholder_that_cannot_be_filled_is_refused() {
        let text = r#"
            [[tool]]
            name = "close"
            class = "compensatable"
            connector = "jira.close"
            way_back_only = true
            [[tool]]
            name = "ticket"
            class = "compensatable"
            connector = "jira.create"
            compensation = { tool = "close", args = { issue = "{external_id}" } }
            [[tool]]
            name = "notify"
            class = "irreversible"
            connector = "smtp.send"
            correction = { template = "About {args.subject", recipients = ["{args.to}"] }
            [[tool]]
            name = "fine"
            class = "compensatable"
            connector = "jira.create"
            compensation = { tool = "close", args = { ticket_key = "{key}", note = ["{args.why}"] } }
        "#;
        let RegistryError::Mistakes(mistakes) = Registry::from_toml(text).unwrap_err() else {
            panic!("expected mistakes");
        };
        let lines: Vec<String> = mistakes
            .iter()
            .map(|m| format!("{} {}: {}", m.tool, m.field, m.problem))
            .collect();
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(lines[0].starts_with("ticket compensation: unknown placeholder {external_id}"));
        assert!(lines[1].starts_with("notify correction: unclosed placeholder"));
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
    fn audience_widens_with_arguments() {
        let registry = Registry::from_toml(
            r#"
            [[tool]]
            name = "charge"
            class = "compensatable"
            connector = "payments.charge"
            audience = "finance"
            audience_when = [{ arg = "receipt", equals = true, audience = "customer" }]
            compensation = { tool = "payments.refund", args = { charge_key = "{key}", amount = "{args.amount}" } }
            correction.customer = { template = "We refunded you.", recipients = ["{args.email}"], via = "smtp.send" }
            [[tool]]
            name = "payments.refund"
            class = "irreversible"
            connector = "payments.refund"
            correction = { template = "t", recipients = ["finance@example.com"] }
            "#,
        )
        .unwrap();
        let charge = registry.get("charge").unwrap();
        assert_eq!(
            charge.audience_for(&serde_json::json!({"receipt": true})),
            Audience::Customer
        );
        assert_eq!(
            charge.audience_for(&serde_json::json!({"receipt": false})),
            Audience::Finance
        );
        assert_eq!(
            charge.audience_for(&serde_json::json!({})),
            Audience::Finance
        );
    }

    #[test]
    fn r6_the_way_back_refers_to_the_key_and_fails_without_its_arguments() {
        let registry = Registry::from_toml(
            r#"
            [[tool]]
            name = "charge"
            class = "compensatable"
            connector = "payments.charge"
            compensation = { tool = "payments.refund", args = { charge_key = "{key}", amount = "{args.amount}", note = "refund of {args.amount} cents" } }
            [[tool]]
            name = "payments.refund"
            class = "irreversible"
            connector = "payments.refund"
            correction = { template = "t", recipients = ["finance@example.com"] }
            [[tool]]
            name = "mail"
            class = "irreversible"
            connector = "mail.send"
            correction = { template = "Dear {args.name}, please disregard our message.", recipients = ["{args.to}"] }
            "#,
        )
        .unwrap();
        let way = registry
            .get("charge")
            .unwrap()
            .way_back("k1", &serde_json::json!({"amount": 1200}))
            .unwrap()
            .unwrap();
        assert_eq!(
            way,
            serde_json::json!({"kind": "compensation", "tool": "payments.refund",
                "args": {"charge_key": "k1", "amount": 1200, "note": "refund of 1200 cents"}})
        );
        let err = registry
            .get("charge")
            .unwrap()
            .way_back("k1", &serde_json::json!({}))
            .unwrap_err();
        assert!(err.contains("`amount`"), "{err}");
        let err = registry
            .get("mail")
            .unwrap()
            .way_back("k2", &serde_json::json!({"name": "Ana"}))
            .unwrap_err();
        assert!(err.contains("`to`"), "{err}");
        let mail = registry
            .get("mail")
            .unwrap()
            .way_back(
                "k2",
                &serde_json::json!({"name": "Ana", "to": "ana@example.com"}),
            )
            .unwrap()
            .unwrap();
        assert_eq!(mail["recipients"], serde_json::json!(["ana@example.com"]));
        assert_eq!(mail["template"], "Dear Ana, please disregard our message.");
    }

    #[test]
    fn r1_a_way_back_must_name_a_declared_tool() {
        let err = Registry::from_toml(
            "[[tool]]\nname = \"charge\"\nclass = \"compensatable\"\nconnector = \"c\"\ncompensation = { tool = \"refund\" }\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains(
                "tool `charge`, field `compensation`: names tool `refund`, which is not declared"
            ),
            "{err}"
        );
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

    #[test]
    fn r1_a_way_back_only_tool_needs_no_way_back_of_its_own() {
        let registry = Registry::from_toml(
            r#"
            [[tool]]
            name = "cancel_authorization"
            class = "compensatable"
            connector = "stripe.cancel"
            way_back_only = true
            "#,
        )
        .unwrap();
        assert!(registry.get("cancel_authorization").unwrap().way_back_only);
        let err = Registry::from_toml(
            r#"
            [[tool]]
            name = "announce"
            class = "irreversible"
            connector = "smtp.send"
            gated = true
            way_back_only = true
            correction = { template = "x", recipients = ["y"] }
            "#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("field `way_back_only`"), "{err}");
    }

    #[test]
    fn the_connectors_section_is_kept_for_the_connectors() {
        let registry = Registry::from_toml(
            r#"
            [connectors.stripe]
            base_url = "http://127.0.0.1:4101"
            "#,
        )
        .unwrap();
        assert_eq!(
            registry.connector_settings()["stripe"]["base_url"].as_str(),
            Some("http://127.0.0.1:4101")
        );
    }

    const CHARGE_WITH_TWO_AUDIENCES: &str = r#"
        [[tool]]
        name = "charge"
        class = "compensatable"
        connector = "payments.charge"
        audience = "finance"
        audience_when = [{ arg = "receipt", equals = true, audience = "customer" }]
        compensation = { tool = "refund", args = { charge_key = "{key}" } }
        correction.customer = { template = "We refunded your {args.amount}.", recipients = ["{args.email}"], via = "smtp.send" }
        correction.finance = { template = "Charge {key} refunded.", recipients = ["finance@example.com"], via = "smtp.send" }
        [[tool]]
        name = "refund"
        class = "compensatable"
        connector = "payments.refund"
        way_back_only = true
    "#;

    #[test]
    fn r10_each_audience_gets_its_own_correction_and_recipients() {
        let registry = Registry::from_toml(CHARGE_WITH_TWO_AUDIENCES).unwrap();
        let charge = registry.get("charge").unwrap();
        let args = serde_json::json!({"amount": 900, "email": "ada@example.com"});
        let (text, to) = charge
            .correction_for(Audience::Customer, "k1", &args)
            .unwrap();
        assert_eq!(
            (text.as_str(), to),
            ("We refunded your 900.", vec!["ada@example.com".to_owned()])
        );
        let (text, to) = charge
            .correction_for(Audience::Finance, "k1", &args)
            .unwrap();
        assert_eq!(
            (text.as_str(), to),
            (
                "Charge k1 refunded.",
                vec!["finance@example.com".to_owned()]
            )
        );
        assert!(charge.correction_to(Audience::Partner).is_none());
        assert!(charge
            .correction_for(Audience::Partner, "k1", &args)
            .is_err());
        assert_eq!(
            charge.correction_channel(Audience::Finance),
            Some("smtp.send")
        );
    }

    #[test]
    fn r10_a_corrections_values_are_written_as_given_never_filled_again() {
        let registry = Registry::from_toml(CHARGE_WITH_TWO_AUDIENCES).unwrap();
        let charge = registry.get("charge").unwrap();
        // The customer's text is "We refunded your {args.amount}."
        let args = serde_json::json!({
            "amount": "{args.email} {key} {",
            "email": "ada@example.com",
        });
        let (text, _) = charge
            .correction_for(Audience::Customer, "k1", &args)
            .unwrap();
        assert_eq!(text, "We refunded your {args.email} {key} {.");
    }

    #[test]
    fn r10_a_tool_that_reaches_several_audiences_declares_its_correction_per_audience() {
        let file = CHARGE_WITH_TWO_AUDIENCES.replace(
            "correction.customer = { template = \"We refunded your {args.amount}.\", recipients = [\"{args.email}\"], via = \"smtp.send\" }\n        correction.finance = { template = \"Charge {key} refunded.\", recipients = [\"finance@example.com\"], via = \"smtp.send\" }",
            "correction = { template = \"We refunded you.\", recipients = [\"{args.email}\"], via = \"smtp.send\" }",
        );
        assert_ne!(file, CHARGE_WITH_TWO_AUDIENCES);
        let err = Registry::from_toml(&file).unwrap_err().to_string();
        assert!(err.contains("tool `charge`, field `correction`: this tool reaches more than one audience (finance, customer)"), "{err}");
    }

    #[test]
    fn r10_a_correction_for_an_audience_the_tool_never_reaches_is_refused() {
        let file = CHARGE_WITH_TWO_AUDIENCES.replace("correction.finance", "correction.partner");
        let err = Registry::from_toml(&file).unwrap_err().to_string();
        assert!(err.contains("correction for the partner audience, which this tool never reaches (it reaches finance, customer)"), "{err}");
        let file = CHARGE_WITH_TWO_AUDIENCES.replace("correction.finance", "correction.everyone");
        let err = Registry::from_toml(&file).unwrap_err().to_string();
        assert!(
            err.contains("`everyone` is neither a field of a correction"),
            "{err}"
        );
    }

    #[test]
    fn r10_a_customer_correction_must_be_addressed_from_the_calls_arguments() {
        let file = CHARGE_WITH_TWO_AUDIENCES.replace(
            "recipients = [\"{args.email}\"]",
            "recipients = [\"help@example.com\"]",
        );
        let err = Registry::from_toml(&file).unwrap_err().to_string();
        assert!(err.contains("field `correction.recipients`: a customer's correction goes to the customer of the call"), "{err}");
    }

    #[test]
    fn the_shipped_tools_file_corrects_a_receiptless_charge_to_finance_only() {
        let text = include_str!("../../../tools/support.toml");
        let registry = Registry::from_toml(text).unwrap();
        let charge = registry.get("charge_card").unwrap();
        let args = serde_json::json!({"amount": 900, "email": "ada@example.com", "receipt": false});
        let audience = charge.audience_for(&args);
        assert_eq!(audience, Audience::Finance);
        let (_, to) = charge.correction_for(audience, "k", &args).unwrap();
        assert_eq!(to, vec!["finance@example.com".to_owned()]);
    }
}

/// The registry `text` makes, or its start-up refusals as they read.
#[cfg(test)]
fn read_or_refusals(text: &str) -> Result<Registry, Vec<String>> {
    Registry::from_toml(text).map_err(|e| match e {
        RegistryError::Mistakes(found) => found.iter().map(|m| m.to_string()).collect(),
        other => vec![other.to_string()],
    })
}

#[cfg(test)]
mod limits_tests {
    use super::*;
    use uuid::Uuid;

    const TOOLS: &str = r#"
        [[tool]]
        name = "refund"
        class = "irreversible"
        connector = "stripe.refund"
        money = { amount = "amount", currency_is = "usd" }
        correction = { template = "A refund was issued in error.", recipients = ["finance@example.com"] }
        [tool.schema]
        type = "object"
        [tool.schema.properties]
        amount = { type = "integer" }
        customer = { type = "string" }

        [[tool]]
        name = "send_email"
        class = "irreversible"
        connector = "smtp.send"
        correction = { template = "Please disregard.", recipients = ["{args.to}"] }
        [tool.schema]
        type = "object"
        [tool.schema.properties]
        to = { type = "array" }
        subject = { type = "string" }
    "#;

    fn mistakes(limits: &str) -> Vec<String> {
        read_or_refusals(&format!("{TOOLS}\n{limits}"))
            .err()
            .unwrap_or_default()
    }

    #[test]
    fn limits_for_refunds_per_customer_and_bulk_email_are_read() {
        let registry = Registry::from_toml(&format!(
            "{TOOLS}\n{}",
            r#"
            [[limits.money]]
            name = "refunds"
            per = "customer/day"
            customer = "customer"
            max = 50000
            currency = "USD"

            [[limits.recipients]]
            per = "call"
            max = 50
            "#
        ))
        .unwrap();
        let limits = registry.limits();
        assert_eq!(limits.list.len(), 2);
        let refunds = limits.named("refunds").unwrap();
        assert_eq!(refunds.tools, ["refund"], "every money tool by default");
        assert_eq!(refunds.per.window_s(), Some(86_400));
        let bulk = limits.named("recipients per call").unwrap();
        assert_eq!(bulk.tools, ["send_email"], "every tool with recipients");
        let spec = registry.get("refund").unwrap();
        let run = Uuid::nil();
        let charges = limits
            .charges(
                &spec.name,
                spec.money.as_ref(),
                &serde_json::json!({"amount": 4900, "customer": "cus_ada"}),
                run,
                "bot",
            )
            .unwrap();
        assert_eq!(charges.step.charges.len(), 1);
        assert_eq!(charges.step.charges[0].scope, "refunds|customer:cus_ada");
        assert_eq!(charges.step.charges[0].amount, 4900);
        let over = limits.over(&charges.step.charges[0], 46_000, "bot");
        assert_eq!(
            over.words,
            "this would take customer cus_ada's refunds in the last 24 hours to $509.00 of $500.00"
        );
        let missing = limits
            .charges(
                &spec.name,
                spec.money.as_ref(),
                &serde_json::json!({"amount": 4900}),
                run,
                "bot",
            )
            .unwrap_err();
        assert_eq!(missing.field, "customer");
        let fraction = limits
            .charges(
                &spec.name,
                spec.money.as_ref(),
                &serde_json::json!({"amount": 49.5, "customer": "c"}),
                run,
                "bot",
            )
            .unwrap_err();
        assert_eq!(fraction.field, "amount");
    }

    #[test]
    fn each_mistake_in_a_limit_names_the_limit_and_the_field() {
        let found = mistakes(
            r#"
            [[limits.money]]
            name = "refunds"
            per = "customer/day"
            customer = "client"
            max = 0
            currency = "dollars"

            [[limits.money]]
            name = "weekly"
            per = "agent/week"
            max = -5
            currency = "usd"
            tools = ["send_email", "nope"]

            [[limits.calls]]
            name = "sends"
            per = "run"
            max = 3

            [[limits.speed]]
            max = 1
            "#,
        );
        let expect = [
            "limit `refunds`, field `max`",
            "limit `refunds`, field `currency`: `dollars` is not an ISO 4217",
            "limit `refunds`, field `customer`: names argument `client`, which tool `refund` does not have",
            "limit `weekly`, field `per`: `agent/week` is not a window",
            "limit `weekly`, field `max`: must be a whole number of minor units above zero",
            "limit `weekly`, field `tools`: names tool `send_email`, which declares no money argument",
            "limit `weekly`, field `tools`: names tool `nope`, which is not declared",
            "limit `sends`, field `tools`: missing",
            "limit `speed`, field `(section)`: `speed` is not a kind of limit",
        ];
        for wanted in expect {
            assert!(
                found.iter().any(|m| m.contains(wanted)),
                "missing {wanted:?} in {found:#?}"
            );
        }
    }

    #[test]
    fn a_money_declaration_must_name_an_integer_argument_and_a_currency() {
        let text = TOOLS
            .replacen(
                "money = { amount = \"amount\", currency_is = \"usd\" }",
                "money = { amount = \"total\", currency_is = \"xyz\" }",
                1,
            )
            .replacen(
                "connector = \"smtp.send\"",
                "connector = \"smtp.send\"\nmoney = { amount = \"subject\" }",
                1,
            );
        let found = read_or_refusals(&text).expect_err("refused");
        for wanted in [
            "tool `refund`, field `money.amount`: names argument `total`, which the tool does not have",
            "tool `refund`, field `money.currency_is`: `xyz` is not an ISO 4217",
            "tool `send_email`, field `money.amount`: argument `subject` is \"string\" in the schema",
            "tool `send_email`, field `money`: names neither a currency argument",
        ] {
            assert!(
                found.iter().any(|m| m.contains(wanted)),
                "missing {wanted:?} in {found:#?}"
            );
        }
    }
}

#[cfg(test)]
mod retention_tests {
    use super::*;

    const TOOL: &str = r#"
        [[tool]]
        name = "lookup"
        class = "pure"
        connector = "crm.lookup"
    "#;

    fn read(section: &str) -> Result<Option<RetentionPolicy>, Vec<String>> {
        read_or_refusals(&format!("{TOOL}\n{section}")).map(|r| r.retention().cloned())
    }

    #[test]
    fn retention_is_off_unless_set_and_reads_its_settings() {
        assert_eq!(read("").unwrap(), None);
        let policy =
            read("[retention]\nolder_than = \"90d\"\narchive_dir = \"/var/lib/saga/archive\"")
                .unwrap()
                .unwrap();
        assert_eq!(
            policy.older_than,
            std::time::Duration::from_secs(90 * 86_400)
        );
        assert_eq!(
            policy.archive_dir.as_deref(),
            Some(std::path::Path::new("/var/lib/saga/archive"))
        );
        assert_eq!(policy.share, Share::DEFAULT);
    }

    #[test]
    fn a_pass_works_the_share_of_the_time_it_is_given_and_rests_the_rest() {
        let policy = read("[retention]\nolder_than = \"90d\"\nshare = 0.25")
            .unwrap()
            .unwrap();
        assert_eq!(policy.share, Share::new(0.25).unwrap());
        let page = std::time::Duration::from_millis(100);
        assert_eq!(
            policy.share.rest_after(page),
            std::time::Duration::from_millis(300)
        );
        assert_eq!(Share::FLAT_OUT.rest_after(page), std::time::Duration::ZERO);
        for wrong in ["0", "-0.5", "1.5", "\"fast\"", "nan"] {
            let refused = read(&format!(
                "[retention]\nolder_than = \"90d\"\nshare = {wrong}"
            ))
            .unwrap_err();
            assert_eq!(refused.len(), 1, "{wrong}: {refused:?}");
            assert!(
                refused[0].contains("`[retention]`, field `share`: must be a fraction of the time"),
                "{wrong}: {refused:?}"
            );
        }
    }

    #[test]
    fn a_retention_section_without_an_age_or_with_a_stray_setting_is_refused_by_field() {
        let missing = read("[retention]\narchive_dir = \"/tmp/a\"").unwrap_err();
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(
            missing[0].contains("`[retention]`, field `older_than`: missing"),
            "{missing:?}"
        );
        let wrong = read("[retention]\nolder_than = \"soon\"\nkeep_forever = true").unwrap_err();
        assert_eq!(wrong.len(), 2, "{wrong:?}");
        assert!(
            wrong
                .iter()
                .any(|m| m.contains("`keep_forever` is not a setting here")),
            "{wrong:?}"
        );
        assert!(
            wrong.iter().any(|m| m.contains("`soon` is not a duration")),
            "{wrong:?}"
        );
    }
}
