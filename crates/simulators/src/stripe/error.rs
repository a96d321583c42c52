//! Stripe's error shape (`{"error": {"type", "code", "message", "param"}}`).

use super::*;

/// A Stripe API error, and whether the idempotency layer saves it.
#[derive(Debug)]
pub(super) struct ApiError {
    pub(super) status: StatusCode,
    pub(super) fields: Map<String, Value>,
    pub(super) saved: bool,
}

impl ApiError {
    pub(super) fn new(status: StatusCode, kind: &str, code: Option<&str>, message: &str) -> Self {
        let mut fields = Map::new();
        if let Some(code) = code {
            fields.insert("code".into(), json!(code));
            fields.insert(
                "doc_url".into(),
                json!(format!(
                    "https://stripe.com/docs/error-codes/{}",
                    code.replace('_', "-")
                )),
            );
        }
        fields.insert("message".into(), json!(message));
        fields.insert("type".into(), json!(kind));
        ApiError {
            status,
            fields,
            saved: false,
        }
    }

    /// A 400 `invalid_request_error` without a code.
    pub(super) fn invalid(message: &str) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            None,
            message,
        )
    }

    pub(super) fn with(mut self, field: &str, value: Value) -> Self {
        self.fields.insert(field.to_owned(), value);
        self
    }

    pub(super) fn param(self, name: &str) -> Self {
        self.with("param", json!(name))
    }

    /// The endpoint ran and this is its answer: a retry with the same key
    /// gets it again.
    pub(super) fn saved(mut self) -> Self {
        self.saved = true;
        self
    }

    pub(super) fn missing(param: &str) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("parameter_missing"),
            &format!("Missing required param: {param}."),
        )
        .param(param)
    }

    pub(super) fn no_such(object: &str, id: &str, param: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("resource_missing"),
            &format!("No such {object}: '{id}'"),
        )
        .param(param)
    }

    pub(super) fn body(&self) -> Value {
        json!({"error": self.fields})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}
