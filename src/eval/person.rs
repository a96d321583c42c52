//! The support lead of a scenario: signed in to the dashboard as an
//! approver, reading the run page as a person would, and doing what the
//! scenario says at the pivot and at held steps (approve, approve with
//! edits, reject, or nothing until the approval expires).

use super::scenario::{Decision, Person};
use crate::saga::status::ApprovalStatus;
use crate::ui::run::RunSheet;
use std::collections::BTreeSet;
use std::time::Duration;

pub struct Lead {
    http: reqwest::Client,
    site: String,
    username: String,
    password: String,
    person: Person,
    /// Approvals already decided (or left to expire).
    done: BTreeSet<i64>,
    /// What the lead did, in order, for the scorecard.
    pub acts: Vec<String>,
}

impl Lead {
    pub fn new(site: &str, username: &str, password: &str, person: Person) -> Lead {
        Lead {
            http: reqwest::Client::builder()
                .cookie_store(true)
                .redirect(reqwest::redirect::Policy::none())
                .pool_idle_timeout(crate::serving::CLIENT_POOL_IDLE)
                .timeout(Duration::from_secs(10))
                .build()
                .expect("a client with static settings builds"),
            site: site.to_owned(),
            username: username.to_owned(),
            password: password.to_owned(),
            person,
            done: BTreeSet::new(),
            acts: Vec::new(),
        }
    }

    async fn post(
        &self,
        endpoint: &str,
        form: &[(&str, &str)],
    ) -> reqwest::Result<reqwest::Response> {
        self.http
            .post(format!("{}/api/{endpoint}", self.site))
            .header("origin", &self.site)
            .header("accept", "text/html,application/xhtml+xml")
            .form(form)
            .send()
            .await
    }

    async fn sign_in(&self) -> bool {
        self.post(
            "login",
            &[
                ("username", self.username.as_str()),
                ("password", self.password.as_str()),
            ],
        )
        .await
        .is_ok_and(|r| {
            r.headers()
                .get("location")
                .is_some_and(|l| l.as_bytes() == b"/")
        })
    }

    /// The run page's content, as the dashboard reads it.
    async fn sheet(&self, label: &str) -> Option<RunSheet> {
        let response = self
            .http
            .post(format!("{}/api/run_detail", self.site))
            .header("origin", &self.site)
            .form(&[("id", label)])
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.json().await.ok()
    }

    /// Watches the run named `label` until the task is dropped, deciding
    /// what waits for a person.
    pub async fn watch(
        mut self,
        label: String,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> Vec<String> {
        let mut signed_in = false;
        while !*stop.borrow() {
            if !signed_in {
                // A restarted harness keeps its sessions in the database;
                // signing in again costs nothing when it did not.
                signed_in = self.sign_in().await;
            }
            if signed_in {
                match self.sheet(&label).await {
                    Some(sheet) => self.decide(&sheet).await,
                    None => signed_in = self.sign_in().await,
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.acts
    }

    /// Waits, up to `limit`, until the run has nothing in flight: no step
    /// intended or unknown, no commit or unwind rolling.
    pub async fn wait_settled(&self, label: &str, limit: Duration) {
        use crate::saga::status::{RunStatus, StepStatus};
        let deadline = std::time::Instant::now() + limit;
        let mut signed_in = false;
        while std::time::Instant::now() < deadline {
            if !signed_in {
                signed_in = self.sign_in().await;
            }
            if let Some(sheet) = self.sheet(label).await {
                let moving = matches!(sheet.status, RunStatus::Committing | RunStatus::Unwinding);
                let open = sheet
                    .steps
                    .iter()
                    .any(|s| matches!(s.status, StepStatus::Intended | StepStatus::Unknown));
                if !moving && !open {
                    return;
                }
            } else if signed_in {
                // No such run (the agent made none), or the harness is
                // between lives: nothing to wait for in the first case.
                signed_in = self.sign_in().await;
                if signed_in {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn decide(&mut self, sheet: &RunSheet) {
        if let Some(pivot) = &sheet.pivot {
            if pivot.status == ApprovalStatus::Pending && !self.done.contains(&pivot.approval_id) {
                let mut digest = pivot.digest.clone();
                if self.person.pivot == Decision::ApproveWithEdits {
                    for (tool, args) in self.person.edits.clone() {
                        let Some(step) = pivot.commit.iter().find(|c| c.words.tool == tool) else {
                            self.acts
                                .push(format!("found no commit step of {tool} to edit"));
                            continue;
                        };
                        let mut edited: serde_json::Value =
                            serde_json::from_str(&step.args).unwrap_or_default();
                        if let (Some(into), Some(from)) = (edited.as_object_mut(), args.as_object())
                        {
                            for (field, value) in from {
                                into.insert(field.clone(), value.clone());
                            }
                        }
                        let sent = self
                            .post(
                                "edit_pivot_step",
                                &[
                                    ("run", sheet.id.as_str()),
                                    ("approval", &pivot.approval_id.to_string()),
                                    ("digest", &digest),
                                    ("step", &step.step.to_string()),
                                    ("args", &edited.to_string()),
                                ],
                            )
                            .await;
                        self.acts.push(format!(
                            "edited commit step {} ({tool}){}",
                            step.step,
                            if sent.is_ok() {
                                ""
                            } else {
                                ": the dashboard did not answer"
                            }
                        ));
                    }
                    // An edit changes the plan's digest: read it again.
                    match self.sheet(&sheet.id).await.and_then(|s| s.pivot) {
                        Some(fresh) => digest = fresh.digest,
                        None => return,
                    }
                }
                self.act_on(
                    "decide_pivot",
                    "pivot",
                    sheet,
                    pivot.approval_id,
                    &digest,
                    self.person.pivot,
                )
                .await;
            }
        }
        for held in &sheet.held {
            if !self.done.contains(&held.approval_id) {
                self.act_on(
                    "decide_step",
                    &format!("held step {} ({})", held.step_idx, held.words.tool),
                    sheet,
                    held.approval_id,
                    &held.digest,
                    self.person.held,
                )
                .await;
            }
        }
    }

    async fn act_on(
        &mut self,
        endpoint: &str,
        what: &str,
        sheet: &RunSheet,
        approval: i64,
        digest: &str,
        decision: Decision,
    ) {
        let choice = match decision {
            Decision::Approve | Decision::ApproveWithEdits => "approve",
            Decision::Reject => "reject",
            Decision::Expire => {
                self.done.insert(approval);
                self.acts.push(format!("left the {what} to expire"));
                return;
            }
        };
        let approval_text = approval.to_string();
        let mut form = vec![
            ("run", sheet.id.as_str()),
            ("approval", approval_text.as_str()),
            ("digest", digest),
            ("decision", choice),
        ];
        if endpoint == "decide_pivot" && choice == "reject" {
            form.push(("reason", "the scenario's lead says no"));
        }
        if self.post(endpoint, &form).await.is_ok() {
            self.done.insert(approval);
            let done = if choice == "approve" {
                "approved"
            } else {
                "rejected"
            };
            self.acts.push(format!("{done} the {what}"));
        }
    }
}
