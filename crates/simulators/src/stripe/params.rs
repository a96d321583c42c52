//! Form and query parameters in Stripe's bracket notation, and which
//! parameters each endpoint takes.

use super::*;

/// Form or query parameters in Stripe's bracket notation
/// (`metadata[saga_key]=…`, `payment_method_types[]=card`).
#[derive(Debug, Default)]
pub(super) struct Params(pub(super) Vec<(String, String)>);

impl Params {
    pub(super) fn from_form(body: &Bytes) -> Result<Self, ApiError> {
        let text = std::str::from_utf8(body)
            .map_err(|_| ApiError::invalid("Invalid request: the body is not UTF-8."))?;
        Params::from_text(text)
    }

    pub(super) fn from_text(text: &str) -> Result<Self, ApiError> {
        let mut pairs = Vec::new();
        for part in text.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = part.split_once('=').unwrap_or((part, ""));
            pairs.push((decode(name)?, decode(value)?));
        }
        Ok(Params(pairs))
    }

    /// The last value given for `name`, as Stripe takes it.
    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub(super) fn required(&self, name: &str) -> Result<&str, ApiError> {
        self.get(name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| ApiError::missing(name))
    }

    pub(super) fn integer(&self, name: &str) -> Result<Option<i64>, ApiError> {
        let Some(text) = self.get(name) else {
            return Ok(None);
        };
        let value: i64 = text.parse().map_err(|_| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("parameter_invalid_integer"),
                &format!("Invalid integer: {text}"),
            )
            .param(name)
        })?;
        if value < 1 {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("parameter_invalid_integer"),
                "This value must be greater than or equal to 1.",
            )
            .param(name));
        }
        Ok(Some(value))
    }

    pub(super) fn boolean(&self, name: &str) -> Result<bool, ApiError> {
        match self.get(name) {
            None | Some("false") => Ok(false),
            Some("true") => Ok(true),
            Some(other) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("parameter_invalid_boolean"),
                &format!("Invalid boolean: {other}"),
            )
            .param(name)),
        }
    }

    pub(super) fn one_of(&self, name: &str, allowed: &[&str]) -> Result<Option<String>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(value) if allowed.contains(&value) => Ok(Some(value.to_owned())),
            Some(value) => Err(ApiError::invalid(&format!(
                "Invalid {name}: must be one of {}; got {value:?}",
                allowed.join(", ")
            ))
            .param(name)),
        }
    }

    /// `metadata[k]=v` pairs; an empty value unsets the key.
    pub(super) fn metadata(&self) -> BTreeMap<String, String> {
        let mut metadata = BTreeMap::new();
        for (name, value) in &self.0 {
            if let Some(key) = name
                .strip_prefix("metadata[")
                .and_then(|k| k.strip_suffix(']'))
            {
                metadata.insert(key.to_owned(), value.clone());
            }
        }
        metadata
    }

    pub(super) fn check_metadata(&self) -> Result<(), ApiError> {
        for (key, value) in self.metadata() {
            if key.is_empty() || key.len() > 40 || key.contains(['[', ']']) {
                return Err(ApiError::invalid(&format!(
                    "Invalid metadata key {key:?}: keys are 1 to 40 characters without square brackets."
                ))
                .param(&format!("metadata[{key}]")));
            }
            if value.len() > 500 {
                return Err(ApiError::invalid(&format!(
                    "Invalid metadata[{key}]: values can be at most 500 characters."
                ))
                .param(&format!("metadata[{key}]")));
            }
        }
        Ok(())
    }

    /// Stripe refuses parameters an endpoint does not know.
    pub(super) fn check_known(&self, known: &[&str]) -> Result<(), ApiError> {
        for (name, _) in &self.0 {
            let top = name.split('[').next().unwrap_or(name);
            if !known.contains(&top) && top != "expand" {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    Some("parameter_unknown"),
                    &format!("Received unknown parameter: {name}"),
                )
                .param(name));
            }
        }
        Ok(())
    }

    pub(super) fn list_values(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(n, _)| {
                n.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('['))
            })
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// The parameters in a canonical order, for comparing a retry with the
    /// request its key was first used with.
    pub(super) fn sorted(&self) -> Vec<(String, String)> {
        let mut pairs = self.0.clone();
        pairs.sort();
        pairs
    }

    pub(super) fn limit(&self) -> Result<usize, ApiError> {
        match self.integer("limit")? {
            None => Ok(10),
            Some(n) if n <= 100 => Ok(n as usize),
            Some(_) => Err(
                ApiError::invalid("This value must be less than or equal to 100.").param("limit"),
            ),
        }
    }
}

pub(super) fn decode(text: &str) -> Result<String, ApiError> {
    percent_encoding::percent_decode_str(&text.replace('+', " "))
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| ApiError::invalid("Invalid request: a parameter is not valid UTF-8."))
}

pub(super) const CREATE_PARAMS: &[&str] = &[
    "amount",
    "currency",
    "customer",
    "payment_method",
    "payment_method_types",
    "payment_method_options",
    "automatic_payment_methods",
    "confirm",
    "capture_method",
    "confirmation_method",
    "description",
    "receipt_email",
    "metadata",
    "return_url",
    "off_session",
    "setup_future_usage",
    "statement_descriptor",
    "statement_descriptor_suffix",
    "shipping",
    "error_on_requires_action",
    "mandate_data",
    "on_behalf_of",
    "transfer_data",
    "transfer_group",
    "application_fee_amount",
    "use_stripe_sdk",
    "radar_options",
];
