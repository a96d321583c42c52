//! Limits on the sum of correct calls: money moved, people reached and
//! calls made, per run, per agent in a rolling hour or day, and per
//! customer in a rolling day (`[[limits.money]]`, `[[limits.recipients]]`,
//! `[[limits.calls]]` in the tools file).
//!
//! A new step names what it would count against as charges. The store
//! checks and counts them in the commit that writes the step's intent, so
//! no two calls both fit under what only one of them fits under. A step
//! counts while its effect stands or may stand (INTENDED, UNKNOWN,
//! CONFIRMED); one that failed, was not executed, was rejected, or whose
//! compensation is confirmed (COMPENSATED) does not. A call that would
//! cross a limit is held for a person instead of sent.

use super::words::money;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use uuid::Uuid;

/// A tool's money arguments (`money = { amount = "amount", currency =
/// "currency" }`): the amount in minor units, and its currency from an
/// argument, else the one the tool names (`currency_is = "usd"`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoneyArgs {
    pub amount: String,
    #[serde(default)]
    pub currency: Option<String>,
    #[serde(default)]
    pub currency_is: Option<String>,
}

/// A call's argument a limit cannot count: which, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallMistake {
    pub field: String,
    pub problem: String,
}

/// What the limits need to know of a declared tool (the registry makes
/// it from the tool's declaration).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolShape {
    pub name: String,
    pub pure: bool,
    pub money: Option<MoneyArgs>,
    /// Its arguments' JSON Schema, when it has one.
    pub schema: Option<Value>,
}

/// A mistake in `[limits]`: the limit as the file names it, the field,
/// and what is wrong.
pub type LimitMistake = (String, &'static str, String);

/// What a limit is counted per.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Per {
    /// One call on its own (recipients only).
    Call,
    Run,
    AgentHour,
    AgentDay,
    CustomerDay,
}

impl Per {
    pub fn as_str(self) -> &'static str {
        match self {
            Per::Call => "call",
            Per::Run => "run",
            Per::AgentHour => "agent/hour",
            Per::AgentDay => "agent/day",
            Per::CustomerDay => "customer/day",
        }
    }

    /// The rolling window, in seconds on the database's clock; `None` for
    /// a run's whole life.
    pub fn window_s(self) -> Option<i64> {
        match self {
            Per::Call | Per::Run => None,
            Per::AgentHour => Some(3_600),
            Per::AgentDay | Per::CustomerDay => Some(86_400),
        }
    }

    fn in_words(self) -> &'static str {
        match self {
            Per::Call | Per::Run => "",
            Per::AgentHour => " in the last hour",
            Per::AgentDay | Per::CustomerDay => " in the last 24 hours",
        }
    }
}

/// What a limit counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Measure {
    /// Minor units of one currency (lowercase ISO 4217).
    Money {
        currency: String,
    },
    Recipients,
    Calls,
}

impl Measure {
    /// `n` of this measure, as a person reads it.
    pub fn amount_in_words(&self, n: i64) -> String {
        match self {
            Measure::Money { currency } => money(n, currency),
            Measure::Recipients if n == 1 => "1 recipient".to_owned(),
            Measure::Recipients => format!("{n} recipients"),
            Measure::Calls if n == 1 => "1 call".to_owned(),
            Measure::Calls => format!("{n} calls"),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Measure::Money { .. } => "money",
            Measure::Recipients => "recipients",
            Measure::Calls => "calls",
        }
    }
}

/// One limit from the tools file.
#[derive(Clone, Debug, PartialEq)]
pub struct Limit {
    /// Unique; what a person reads, the gauge's label, and the key its
    /// usage is kept under.
    pub name: String,
    pub measure: Measure,
    pub per: Per,
    /// In the measure's unit (minor units for money); above zero.
    pub max: i64,
    /// The tools whose calls count.
    pub tools: Vec<String>,
    /// The argument a customer/day limit reads the customer from.
    pub customer: Option<String>,
}

/// Every limit of the tools file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Limits {
    pub list: Vec<Limit>,
}

/// What one new step counts against one limit: stored with the step's
/// intent, checked in the same commit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// The limit's name.
    pub limit: String,
    /// Whose usage: the limit's name and the run, agent or customer.
    pub scope: String,
    pub amount: i64,
    pub max: i64,
    /// The rolling window in seconds; `None` for a run's whole life.
    pub window_s: Option<i64>,
}

/// The charges of a new step, and whether its intent must fit under them
/// (an agent's call) or is counted as it is (a step a person approved).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepLimits {
    pub enforce: bool,
    pub charges: Vec<Charge>,
}

impl StepLimits {
    pub fn is_empty(&self) -> bool {
        self.charges.is_empty()
    }

    /// The same charges, counted without a check: the step was approved by
    /// a person.
    pub fn counted_only(mut self) -> StepLimits {
        self.enforce = false;
        self
    }
}

/// A call over a limit: what the agent and the person are told.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverLimit {
    /// The limit's name.
    pub limit: String,
    /// Already counted in the window, without this call.
    pub used: i64,
    /// This call's own amount.
    pub amount: i64,
    pub max: i64,
    /// "this would take demo-agent's refunds in the last 24 hours to
    /// $612.00 of $500.00"
    pub words: String,
}

/// Whose usage a charge counts, for its sentence.
struct Whose<'a> {
    agent: &'a str,
    customer: Option<&'a str>,
}

impl Limit {
    fn noun(&self) -> String {
        self.name.clone()
    }

    fn whose(&self, who: &Whose<'_>) -> String {
        match self.per {
            Per::Call => "this call's".to_owned(),
            Per::Run => "this run's".to_owned(),
            Per::AgentHour | Per::AgentDay => format!("{}'s", who.agent),
            Per::CustomerDay => format!("customer {}'s", who.customer.unwrap_or("?")),
        }
    }

    /// The sentence for `used` plus `amount` against this limit.
    fn over(&self, who: &Whose<'_>, used: i64, amount: i64) -> OverLimit {
        OverLimit {
            limit: self.name.clone(),
            used,
            amount,
            max: self.max,
            words: format!(
                "this would take {} {}{} to {} of {}",
                self.whose(who),
                self.noun(),
                self.per.in_words(),
                self.measure.amount_in_words(used.saturating_add(amount)),
                self.measure.amount_in_words(self.max),
            ),
        }
    }
}

/// The fields a call's recipients are read from, as its audience rules,
/// display and pivot panel read them.
pub const RECIPIENT_FIELDS: [&str; 6] =
    ["to", "cc", "bcc", "recipients", "emails", "channel_members"];

/// How many different people a call names: each address once, across
/// every recipient field, a string with several addresses counted for each.
pub fn recipients_of(args: &Value) -> i64 {
    let mut seen = std::collections::BTreeSet::new();
    for field in RECIPIENT_FIELDS {
        let values: Vec<&str> = match args.get(field) {
            Some(Value::String(one)) => vec![one.as_str()],
            Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
            _ => continue,
        };
        for value in values {
            for address in value.split([',', ';']) {
                let address = address.trim();
                if !address.is_empty() {
                    seen.insert(address.to_lowercase());
                }
            }
        }
    }
    seen.len() as i64
}

/// A step's charges, and a limit it crosses on its own (a per-call limit),
/// if any.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Charges {
    pub step: StepLimits,
    pub over_now: Option<OverLimit>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn named(&self, name: &str) -> Option<&Limit> {
        self.list.iter().find(|l| l.name == name)
    }

    /// What a new call of `spec` with `args` in `agent`'s run counts
    /// against. A money argument that is not an integer, a currency that is
    /// missing, or a customer the limit needs that the call does not name is
    /// a mistake in the call: nothing may be written for it.
    pub fn charges(
        &self,
        tool: &str,
        money: Option<&MoneyArgs>,
        args: &Value,
        run_id: Uuid,
        agent: &str,
    ) -> Result<Charges, CallMistake> {
        let mut charges = Charges {
            step: StepLimits {
                enforce: true,
                charges: Vec::new(),
            },
            over_now: None,
        };
        let applies: Vec<&Limit> = self
            .list
            .iter()
            .filter(|l| l.tools.iter().any(|t| t == tool))
            .collect();
        if applies.is_empty() {
            return Ok(charges);
        }
        let spent = match money {
            Some(declared) => Some(money_of(declared, args)?),
            None => None,
        };
        for limit in applies {
            let amount = match &limit.measure {
                Measure::Money { currency } => match &spent {
                    Some((amount, of)) if of == currency => *amount,
                    _ => continue,
                },
                Measure::Recipients => recipients_of(args),
                Measure::Calls => 1,
            };
            let customer = match &limit.customer {
                Some(field) => Some(customer_of(field, args, limit)?),
                None => None,
            };
            let who = Whose {
                agent,
                customer: customer.as_deref(),
            };
            let scope = match limit.per {
                Per::Call => {
                    if amount > limit.max && charges.over_now.is_none() {
                        charges.over_now = Some(limit.over(&who, 0, amount));
                    }
                    continue;
                }
                Per::Run => format!("{}|run:{run_id}", limit.name),
                Per::AgentHour | Per::AgentDay => format!("{}|agent:{agent}", limit.name),
                Per::CustomerDay => format!(
                    "{}|customer:{}",
                    limit.name,
                    customer.as_deref().unwrap_or_default()
                ),
            };
            if amount <= 0 {
                continue;
            }
            charges.step.charges.push(Charge {
                limit: limit.name.clone(),
                scope,
                amount,
                max: limit.max,
                window_s: limit.per.window_s(),
            });
        }
        Ok(charges)
    }

    /// What a person and the agent are told of `charge`, already at `used`.
    pub fn over(&self, charge: &Charge, used: i64, agent: &str) -> OverLimit {
        let customer = charge.scope.split_once("|customer:").map(|(_, c)| c);
        match self.named(&charge.limit) {
            Some(limit) => limit.over(&Whose { agent, customer }, used, charge.amount),
            None => OverLimit {
                limit: charge.limit.clone(),
                used,
                amount: charge.amount,
                max: charge.max,
                words: format!(
                    "this would take {} to {} of {}",
                    charge.limit,
                    used.saturating_add(charge.amount),
                    charge.max
                ),
            },
        }
    }

    /// `used` of `limit` as a person reads it: "$120.00 of $500.00".
    pub fn spent_in_words(&self, limit: &str, used: i64) -> Option<String> {
        let limit = self.named(limit)?;
        Some(format!(
            "{} of {}",
            limit.measure.amount_in_words(used),
            limit.measure.amount_in_words(limit.max)
        ))
    }

    /// The scope of `limit` for a run, its agent, and (for a customer's
    /// limit) the customers its steps name: what the run page shows.
    pub fn scopes_of_run(
        &self,
        run_id: Uuid,
        agent: &str,
        steps_args: &[(&str, &Value)],
    ) -> Vec<(String, String, Option<i64>)> {
        let mut scopes = Vec::new();
        for limit in &self.list {
            let touched: Vec<&&Value> = steps_args
                .iter()
                .filter(|(tool, _)| limit.tools.iter().any(|t| t == tool))
                .map(|(_, args)| args)
                .collect();
            if touched.is_empty() {
                continue;
            }
            match limit.per {
                Per::Call => {}
                Per::Run => scopes.push((
                    limit.name.clone(),
                    format!("{}|run:{run_id}", limit.name),
                    None,
                )),
                Per::AgentHour | Per::AgentDay => scopes.push((
                    limit.name.clone(),
                    format!("{}|agent:{agent}", limit.name),
                    limit.per.window_s(),
                )),
                Per::CustomerDay => {
                    let field = limit.customer.as_deref().unwrap_or("customer");
                    let mut customers: Vec<&str> = touched
                        .iter()
                        .filter_map(|args| args.get(field).and_then(Value::as_str))
                        .collect();
                    customers.sort_unstable();
                    customers.dedup();
                    for customer in customers {
                        scopes.push((
                            limit.name.clone(),
                            format!("{}|customer:{customer}", limit.name),
                            limit.per.window_s(),
                        ));
                    }
                }
            }
        }
        scopes
    }
}

impl Limits {
    /// The charges of a set of calls (a pivot's commit steps), summed per
    /// scope: what approving them all would add to each limit.
    pub fn charges_of_calls(
        &self,
        calls: &[(&str, Option<&MoneyArgs>, &Value)],
        run_id: Uuid,
        agent: &str,
    ) -> Vec<Charge> {
        let mut summed: Vec<Charge> = Vec::new();
        for (tool, money, args) in calls {
            let Ok(charges) = self.charges(tool, *money, args, run_id, agent) else {
                continue;
            };
            for charge in charges.step.charges {
                match summed.iter_mut().find(|c| c.scope == charge.scope) {
                    Some(same) => same.amount = same.amount.saturating_add(charge.amount),
                    None => summed.push(charge),
                }
            }
        }
        summed
    }

    /// Whose usage a scope is and over what window, as a person reads it:
    /// "billing-bot, last 24 hours", "this run", "customer cus_ada, last
    /// 24 hours".
    pub fn scope_in_words(&self, charge_limit: &str, scope: &str) -> String {
        let whose = match scope.split_once('|').map(|(_, w)| w) {
            Some(w) if w.starts_with("run:") => "this run".to_owned(),
            Some(w) => w
                .strip_prefix("agent:")
                .map(str::to_owned)
                .or_else(|| w.strip_prefix("customer:").map(|c| format!("customer {c}")))
                .unwrap_or_else(|| w.to_owned()),
            None => scope.to_owned(),
        };
        match self.named(charge_limit).map(|l| l.per) {
            Some(Per::AgentHour) => format!("{whose}, last hour"),
            Some(Per::AgentDay | Per::CustomerDay) => format!("{whose}, last 24 hours"),
            _ => whose,
        }
    }
}

/// The amount and currency a call moves.
fn money_of(declared: &MoneyArgs, args: &Value) -> Result<(i64, String), CallMistake> {
    let amount = match args.get(&declared.amount) {
        Some(value) => value.as_i64().ok_or_else(|| CallMistake {
            field: declared.amount.clone(),
            problem: format!(
                "must be a whole number of minor units (cents), like 4900; got {value}"
            ),
        })?,
        None => {
            return Err(CallMistake {
                field: declared.amount.clone(),
                problem: "is missing: this tool moves money, and limits count the amount \
                          (in minor units, like 4900)"
                    .into(),
            })
        }
    };
    if amount < 0 {
        return Err(CallMistake {
            field: declared.amount.clone(),
            problem: "must not be negative".into(),
        });
    }
    let from_args = declared
        .currency
        .as_ref()
        .and_then(|field| args.get(field))
        .filter(|v| !v.is_null());
    let currency = match (from_args, &declared.currency_is) {
        (Some(Value::String(code)), _) if known_currency(code) => code.to_ascii_lowercase(),
        (Some(other), _) => {
            return Err(CallMistake {
                field: declared.currency.clone().unwrap_or_default(),
                problem: format!("must be an ISO 4217 currency code, like \"usd\"; got {other}"),
            })
        }
        (None, Some(fixed)) => fixed.to_ascii_lowercase(),
        (None, None) => {
            return Err(CallMistake {
                field: declared.currency.clone().unwrap_or_default(),
                problem: "is missing: this tool moves money, and limits need its currency".into(),
            })
        }
    };
    Ok((amount, currency))
}

fn customer_of(field: &str, args: &Value, limit: &Limit) -> Result<String, CallMistake> {
    match args.get(field) {
        Some(Value::String(customer)) if !customer.trim().is_empty() => Ok(customer.clone()),
        Some(Value::Number(n)) => Ok(n.to_string()),
        _ => Err(CallMistake {
            field: field.to_owned(),
            problem: format!(
                "is missing: the limit `{}` counts per customer and reads the customer from it",
                limit.name
            ),
        }),
    }
}

/// An ISO 4217 code, in any case.
pub fn known_currency(code: &str) -> bool {
    iso_currency::Currency::from_code(&code.to_ascii_uppercase()).is_some()
}

/// Reads `[limits]`: each mistake names the limit and the field.
pub fn read_limits(
    section: &toml::Table,
    tools: &BTreeMap<String, ToolShape>,
    mistakes: &mut Vec<LimitMistake>,
) -> Limits {
    let mut limits = Limits::default();
    let mut say = |limit: &str, field: &'static str, problem: String| {
        mistakes.push((limit.to_owned(), field, problem))
    };
    for (kind, entries) in section {
        if !["money", "recipients", "calls"].contains(&kind.as_str()) {
            say(
                kind,
                "(section)",
                format!("`{kind}` is not a kind of limit (money, recipients, calls)"),
            );
            continue;
        }
        let Some(entries) = entries.as_array() else {
            say(
                kind,
                "(section)",
                format!("must be a list of limits: write each as [[limits.{kind}]]"),
            );
            continue;
        };
        for (position, entry) in entries.iter().enumerate() {
            let label = entry
                .get("name")
                .and_then(toml::Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| format!("{kind} #{}", position + 1));
            let Some(table) = entry.as_table() else {
                say(&label, "(entry)", "must be a table".into());
                continue;
            };
            if let Some(limit) = read_limit(kind, &label, table, tools, &mut say) {
                if limits.named(&limit.name).is_some() {
                    say(
                        &label,
                        "name",
                        "two limits have this name; each needs its own".into(),
                    );
                    continue;
                }
                limits.list.push(limit);
            }
        }
    }
    limits
}

fn read_limit(
    kind: &str,
    label: &str,
    table: &toml::Table,
    tools: &BTreeMap<String, ToolShape>,
    say: &mut impl FnMut(&str, &'static str, String),
) -> Option<Limit> {
    let fields: &[&str] = match kind {
        "money" => &["name", "per", "max", "currency", "tools", "customer"],
        "recipients" => &["name", "per", "max", "tools"],
        _ => &["name", "per", "max", "tools"],
    };
    let mut fine = true;
    for key in table.keys() {
        if !fields.contains(&key.as_str()) {
            say(
                label,
                "(entry)",
                format!(
                    "`{key}` is not a field of a {kind} limit ({})",
                    fields.join(", ")
                ),
            );
            fine = false;
        }
    }
    let pers: &[Per] = match kind {
        "money" => &[Per::Run, Per::AgentHour, Per::AgentDay, Per::CustomerDay],
        "recipients" => &[Per::Call, Per::Run],
        _ => &[Per::Run, Per::AgentHour],
    };
    let allowed = pers
        .iter()
        .map(|p| p.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let per = match table.get("per").and_then(toml::Value::as_str) {
        Some(text) => match pers.iter().find(|p| p.as_str() == text) {
            Some(per) => Some(*per),
            None => {
                say(
                    label,
                    "per",
                    format!("`{text}` is not a window for a {kind} limit ({allowed})"),
                );
                None
            }
        },
        None => {
            say(label, "per", format!("missing; one of {allowed}"));
            None
        }
    };
    let max = match table.get("max") {
        Some(toml::Value::Integer(max)) if *max > 0 => Some(*max),
        Some(_) => {
            say(
                label,
                "max",
                match kind {
                    "money" => {
                        "must be a whole number of minor units above zero, like 50000 for $500.00"
                    }
                    _ => "must be a whole number above zero",
                }
                .into(),
            );
            None
        }
        None => {
            say(label, "max", "missing".into());
            None
        }
    };
    let measure = match kind {
        "money" => match table.get("currency").and_then(toml::Value::as_str) {
            Some(code) if known_currency(code) => Some(Measure::Money {
                currency: code.to_ascii_lowercase(),
            }),
            Some(code) => {
                say(
                    label,
                    "currency",
                    format!("`{code}` is not an ISO 4217 currency code (usd, eur, jpy …)"),
                );
                None
            }
            None => {
                say(label, "currency", "missing; like \"usd\"".into());
                None
            }
        },
        "recipients" => Some(Measure::Recipients),
        _ => Some(Measure::Calls),
    };
    let named_tools = match table.get("tools") {
        None => None,
        Some(value) => match value.as_array().map(|items| {
            items
                .iter()
                .map(|i| i.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
        }) {
            Some(Some(names)) if !names.is_empty() => Some(names),
            _ => {
                say(
                    label,
                    "tools",
                    "must be a list of tool names, like [\"refund\"]".into(),
                );
                return None;
            }
        },
    };
    let tools_counted: Vec<String> = match (&named_tools, kind) {
        (Some(names), _) => {
            for name in names {
                match tools.get(name) {
                    None => {
                        say(
                            label,
                            "tools",
                            format!("names tool `{name}`, which is not declared"),
                        );
                        fine = false;
                    }
                    Some(spec) if kind == "money" && spec.money.is_none() => {
                        say(
                            label,
                            "tools",
                            format!(
                                "names tool `{name}`, which declares no money argument (money = {{ amount = \"…\", currency = \"…\" }})"
                            ),
                        );
                        fine = false;
                    }
                    Some(spec) if spec.pure => {
                        say(
                            label,
                            "tools",
                            format!("names tool `{name}`, which is pure: its calls have no effect to count"),
                        );
                        fine = false;
                    }
                    Some(_) => {}
                }
            }
            names.clone()
        }
        (None, "money") => tools
            .values()
            .filter(|spec| spec.money.is_some())
            .map(|spec| spec.name.clone())
            .collect(),
        (None, "recipients") => tools
            .values()
            .filter(|spec| !spec.pure && RECIPIENT_FIELDS.iter().any(|f| has_argument(spec, f)))
            .map(|spec| spec.name.clone())
            .collect(),
        (None, _) => {
            say(
                label,
                "tools",
                "missing; a calls limit names the tools it counts, like [\"send_email\"]".into(),
            );
            return None;
        }
    };
    if tools_counted.is_empty() {
        say(
            label,
            "tools",
            format!("no declared tool is counted by this limit (no tool has {kind} to count)"),
        );
        fine = false;
    }
    let customer = match (per, table.get("customer")) {
        (Some(Per::CustomerDay), Some(toml::Value::String(field))) => {
            for name in &tools_counted {
                if let Some(spec) = tools.get(name) {
                    if !has_argument(spec, field) {
                        say(
                            label,
                            "customer",
                            format!("names argument `{field}`, which tool `{name}` does not have"),
                        );
                        fine = false;
                    }
                }
            }
            Some(field.clone())
        }
        (Some(Per::CustomerDay), _) => {
            say(
                label,
                "customer",
                "missing; a customer/day limit names the argument the customer is read from, like customer = \"customer\"".into(),
            );
            None
        }
        (_, Some(_)) => {
            say(
                label,
                "customer",
                "only a customer/day limit reads a customer".into(),
            );
            None
        }
        (_, None) => None,
    };
    let (Some(per), Some(max), Some(measure), true) = (per, max, measure, fine) else {
        return None;
    };
    if per == Per::CustomerDay && customer.is_none() {
        return None;
    }
    let name = match table.get("name") {
        Some(toml::Value::String(name)) if !name.trim().is_empty() && !name.contains('|') => {
            name.clone()
        }
        Some(_) => {
            say(
                label,
                "name",
                "must be a non-empty name without `|`, like \"refunds\"".into(),
            );
            return None;
        }
        None => format!("{} per {}", measure.kind(), per.as_str()),
    };
    Some(Limit {
        name,
        measure,
        per,
        max,
        tools: tools_counted,
        customer,
    })
}

/// Whether a tool has this argument: its schema lists it (a tool with no
/// schema may take any).
pub fn has_argument(spec: &ToolShape, field: &str) -> bool {
    match spec.schema.as_ref().and_then(|s| s.get("properties")) {
        Some(properties) => properties.get(field).is_some(),
        None => spec.schema.is_none(),
    }
}

/// A tool's `money` declaration checked against its schema.
pub fn money_mistakes(spec: &ToolShape) -> Vec<(&'static str, String)> {
    let Some(money) = &spec.money else {
        return Vec::new();
    };
    let mut found = Vec::new();
    if spec.pure {
        found.push((
            "money",
            "a pure tool moves no money; only a tool with an effect declares money".to_owned(),
        ));
    }
    if !has_argument(spec, &money.amount) {
        found.push((
            "money.amount",
            format!(
                "names argument `{}`, which the tool does not have",
                money.amount
            ),
        ));
    } else if let Some(kind) = spec
        .schema
        .as_ref()
        .and_then(|s| s.pointer(&format!("/properties/{}/type", money.amount)))
    {
        if kind != "integer" {
            found.push((
                "money.amount",
                format!(
                    "argument `{}` is {kind} in the schema; money is a whole number of minor units (type = \"integer\")",
                    money.amount
                ),
            ));
        }
    }
    match (&money.currency, &money.currency_is) {
        (None, None) => found.push((
            "money",
            "names neither a currency argument (currency = \"…\") nor a fixed currency (currency_is = \"usd\")".to_owned(),
        )),
        (Some(field), _) if !has_argument(spec, field) => found.push((
            "money.currency",
            format!("names argument `{field}`, which the tool does not have"),
        )),
        _ => {}
    }
    if let Some(code) = &money.currency_is {
        if !known_currency(code) {
            found.push((
                "money.currency_is",
                format!("`{code}` is not an ISO 4217 currency code (usd, eur, jpy …)"),
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipients_are_counted_once_each_across_fields() {
        let args = serde_json::json!({
            "to": ["a@example.com", "B@example.com"],
            "cc": "b@example.com, c@example.com",
            "bcc": ["d@example.com"],
        });
        assert_eq!(recipients_of(&args), 4);
    }
}
