//! Sending a correction (R10): a person signs it off (possibly edited),
//! which freezes the text; the send is an irreversible step with its own
//! `correct:` key; an unknown send becomes a "did this happen?" question,
//! never a second letter.

use super::connector::{outcome_of_lookup, LookupError};
use super::engine::{Engine, Refusal};
use super::model::*;
use super::status::{CorrectionStatus, StepStatus};
use super::store::StoreError;
use serde_json::json;

impl Engine {
    /// Signs off and sends correction `id`. `edited` replaces the text if
    /// it is still pending. Re-sending a correction whose send is unsettled
    /// looks it up instead of sending again.
    pub async fn send_correction(
        &self,
        id: i64,
        edited: Option<&str>,
        person: &Actor,
    ) -> Result<Correction, Refusal> {
        let mut correction = self.correction(id).await?;
        let _serialised = self.serialise(correction.run_id).await?;
        if correction.status == CorrectionStatus::Pending {
            if let Some(text) = edited.filter(|t| *t != correction.message) {
                correction = self.store().edit_correction(id, text, person).await?;
            }
            if correction.recipients.is_empty() {
                return Err(StoreError::Invalid(format!(
                    "correction {id} names no recipient: it cannot be sent; dismiss it with a reason instead"
                ))
                .into());
            }
            correction = self
                .store()
                .move_correction(
                    id,
                    CorrectionStatus::Pending,
                    CorrectionStatus::Approved,
                    None,
                    person,
                )
                .await?;
        }
        if correction.status != CorrectionStatus::Approved {
            return Ok(correction);
        }
        let spec = self.spec(&correction.tool)?;
        let Some(channel) = spec
            .correction_channel(correction.audience)
            .map(str::to_owned)
        else {
            return Err(StoreError::Invalid(format!(
                "{} declares no channel for its corrections",
                correction.tool
            ))
            .into());
        };
        let args = json!({"to": correction.recipients, "body": correction.message});
        let sent = match correction.send_status.unwrap_or(StepStatus::NotExecuted) {
            StepStatus::NotExecuted => {
                let intended = self
                    .store()
                    .settle_correction_send(
                        id,
                        Outcome::moving(StepStatus::NotExecuted, StepStatus::Intended),
                        Durability::Durable,
                        person,
                    )
                    .await?;
                self.confirm_lease(correction.run_id).await?;
                let outcome = self.send(&channel, &intended.idempotency_key, &args).await;
                crate::failpoint::hit("correction.before_outcome");
                self.store()
                    .settle_correction_send(id, outcome, Durability::Durable, person)
                    .await?
            }
            status @ (StepStatus::Intended | StepStatus::Unknown) => {
                match self
                    .look_up(&channel, &correction.idempotency_key, &args, spec.settle_ms)
                    .await
                {
                    // Not found: nothing went out, and a person may send it again.
                    Ok(found) => {
                        self.store()
                            .settle_correction_send(
                                id,
                                outcome_of_lookup(status, found),
                                Durability::Durable,
                                person,
                            )
                            .await?
                    }
                    Err(LookupError::Unsupported | LookupError::Unavailable(_))
                        if status == StepStatus::Intended =>
                    {
                        self.store()
                            .settle_correction_send(
                                id,
                                Outcome::moving(StepStatus::Intended, StepStatus::Unknown),
                                Durability::Durable,
                                person,
                            )
                            .await?
                    }
                    Err(_) => correction,
                }
            }
            _ => correction,
        };
        Ok(sent)
    }

    /// A person's answer about a correction whose send is unknown.
    pub async fn answer_correction(
        &self,
        id: i64,
        happened: bool,
        person: &Actor,
    ) -> Result<Correction, Refusal> {
        let to = if happened {
            StepStatus::Confirmed
        } else {
            StepStatus::NotExecuted
        };
        Ok(self
            .store()
            .settle_correction_send(
                id,
                Outcome::moving(StepStatus::Unknown, to),
                Durability::Durable,
                person,
            )
            .await?)
    }

    async fn correction(&self, id: i64) -> Result<Correction, Refusal> {
        self.store().correction(id).await?.ok_or_else(|| {
            StoreError::NotFound {
                what: format!("correction {id}"),
            }
            .into()
        })
    }
}
