//! The subset of Stripe's search query language the simulator
//! understands, and its parser.

use super::*;

/// The subset of Stripe's search query language the simulator understands:
/// `field:value` clauses on `metadata['key']`, `status`, `customer`,
/// `currency` and `amount`, joined by spaces / `AND`, or by `OR`, each
/// optionally negated with `-`. Anything else is refused as Stripe refuses
/// a query it cannot parse.
#[derive(Debug, PartialEq)]
pub(super) struct SearchQuery {
    pub(super) clauses: Vec<Clause>,
    pub(super) any: bool,
}

#[derive(Debug, PartialEq)]
pub(super) struct Clause {
    pub(super) negated: bool,
    pub(super) field: Field,
    pub(super) value: String,
}

#[derive(Debug, PartialEq)]
pub(super) enum Field {
    Metadata(String),
    Status,
    Customer,
    Currency,
    Amount,
}

impl SearchQuery {
    pub(super) fn parse(text: &str) -> Result<Self, ApiError> {
        let refuse = |why: &str| {
            ApiError::invalid(&format!(
                "Invalid search query {text:?}: {why}. See https://stripe.com/docs/search#search-query-language."
            ))
            .param("query")
        };
        let mut parser = Cursor {
            chars: text.chars().collect(),
            at: 0,
        };
        let mut clauses = Vec::new();
        let mut joiners = Vec::new();
        loop {
            parser.skip_spaces();
            if parser.done() {
                break;
            }
            if !clauses.is_empty() {
                let word = parser.peek_word();
                if word.eq_ignore_ascii_case("and") || word.eq_ignore_ascii_case("or") {
                    joiners.push(word.to_ascii_lowercase());
                    parser.at += word.chars().count();
                    parser.skip_spaces();
                } else {
                    joiners.push("and".into());
                }
            }
            let negated = parser.eat('-');
            let name = parser.identifier();
            let field = match name.as_str() {
                "metadata" => {
                    if !parser.eat('[') {
                        return Err(refuse(
                            "metadata needs a key in brackets, as metadata['key']",
                        ));
                    }
                    let key = parser
                        .quoted()
                        .ok_or_else(|| refuse("a metadata key must be quoted"))?;
                    if !parser.eat(']') {
                        return Err(refuse("unclosed metadata key"));
                    }
                    Field::Metadata(key)
                }
                "status" => Field::Status,
                "customer" => Field::Customer,
                "currency" => Field::Currency,
                "amount" => Field::Amount,
                "" => return Err(refuse("expected a field")),
                other => {
                    return Err(refuse(&format!(
                        "the field `{other}` is not supported for payment_intents"
                    )))
                }
            };
            if !parser.eat(':') {
                return Err(refuse("only the `:` operator is supported here"));
            }
            let value = match field {
                Field::Amount => parser
                    .number()
                    .ok_or_else(|| refuse("amount takes a number"))?,
                _ => parser
                    .quoted()
                    .ok_or_else(|| refuse("string values must be quoted"))?,
            };
            clauses.push(Clause {
                negated,
                field,
                value,
            });
        }
        if clauses.is_empty() {
            return Err(refuse("the query is empty"));
        }
        let any = joiners.iter().any(|j| j == "or");
        if any && joiners.iter().any(|j| j == "and") {
            return Err(refuse("AND and OR cannot be combined in one query"));
        }
        Ok(SearchQuery { clauses, any })
    }

    pub(super) fn matches(&self, intent: &Intent) -> bool {
        let hit = |clause: &Clause| {
            let found = match &clause.field {
                Field::Metadata(key) => intent
                    .metadata
                    .get(key)
                    .is_some_and(|v| v.eq_ignore_ascii_case(&clause.value)),
                Field::Status => intent.status.as_str() == clause.value,
                Field::Customer => intent.customer.as_deref() == Some(clause.value.as_str()),
                Field::Currency => intent.currency.eq_ignore_ascii_case(&clause.value),
                Field::Amount => intent.amount.to_string() == clause.value,
            };
            found != clause.negated
        };
        if self.any {
            self.clauses.iter().any(hit)
        } else {
            self.clauses.iter().all(hit)
        }
    }
}

pub(super) struct Cursor {
    pub(super) chars: Vec<char>,
    pub(super) at: usize,
}

impl Cursor {
    pub(super) fn done(&self) -> bool {
        self.at >= self.chars.len()
    }

    pub(super) fn skip_spaces(&mut self) {
        while self.chars.get(self.at).is_some_and(|c| c.is_whitespace()) {
            self.at += 1;
        }
    }

    pub(super) fn eat(&mut self, wanted: char) -> bool {
        if self.chars.get(self.at) == Some(&wanted) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    pub(super) fn peek_word(&self) -> String {
        self.chars[self.at..]
            .iter()
            .take_while(|c| c.is_ascii_alphabetic())
            .collect()
    }

    pub(super) fn identifier(&mut self) -> String {
        let word: String = self.chars[self.at..]
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric() || **c == '_' || **c == '.')
            .collect();
        self.at += word.chars().count();
        word
    }

    pub(super) fn number(&mut self) -> Option<String> {
        let digits: String = self.chars[self.at..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        self.at += digits.chars().count();
        (!digits.is_empty()).then_some(digits)
    }

    /// A string in single or double quotes; a backslash escapes the next
    /// character.
    pub(super) fn quoted(&mut self) -> Option<String> {
        let quote = *self
            .chars
            .get(self.at)
            .filter(|c| **c == '\'' || **c == '"')?;
        self.at += 1;
        let mut out = String::new();
        loop {
            let c = *self.chars.get(self.at)?;
            self.at += 1;
            match c {
                '\\' => {
                    out.push(*self.chars.get(self.at)?);
                    self.at += 1;
                }
                c if c == quote => return Some(out),
                c => out.push(c),
            }
        }
    }
}
