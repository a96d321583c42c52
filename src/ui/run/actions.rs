//! What a person does on the run page: each a server function behind a
//! plain form (decide the pivot, edit a commit step, decide a held step,
//! answer a question, unwind).

use super::*;

#[server(endpoint = "run_detail")]
pub async fn run_detail(id: String) -> Result<RunSheet, ServerFnError> {
    let user = crate::ui::ssr::signed_in().await?;
    let state = crate::ui::ssr::app_state()?;
    // `/runs/<label>` opens the run an agent named so.
    let run_id = match uuid::Uuid::parse_str(&id) {
        Ok(run_id) => run_id,
        Err(_) => super::ssr::run_labelled(&state, &id)
            .await
            .map_err(crate::ui::ssr::internal)?
            .map_err(|why| crate::ui::ssr::refused(axum::http::StatusCode::NOT_FOUND, why))?,
    };
    super::ssr::detail(&state, run_id, &user)
        .await
        .map_err(crate::ui::ssr::internal)?
        .ok_or_else(|| {
            crate::ui::ssr::refused(axum::http::StatusCode::NOT_FOUND, "There is no such run.")
        })
}

#[server(endpoint = "decide_pivot")]
pub async fn decide_pivot(
    run: String,
    approval: i64,
    digest: String,
    decision: String,
    // Only the Reject form has it; the agent and the audit trail get it.
    #[server(default)] reason: Option<String>,
) -> Result<(), ServerFnError> {
    use crate::saga::status::InWords;
    // A viewer is refused before anything is read.
    let user = crate::ui::ssr::decider().await?;
    // Also where the browser is sent back to: a run id, never other text.
    let run = crate::ui::ssr::run_id(&run)?;
    let state = crate::ui::ssr::app_state()?;
    let approve = crate::ui::ssr::choice("decision", &decision, "approve", "reject")?;
    if let Some(why) = reason.as_deref().and_then(crate::ui::ssr::unstorable) {
        crate::ui::ssr::back_to::<String, String>(&format!("/runs/{run}"), Err(why.into())).await;
        return Ok(());
    }
    let done = match state.engine.approval_of_run(run, approval).await {
        Ok(row) => {
            let (person, right) = crate::ui::ssr::deciding_on(&state, &row, &user).await?;
            let decided = state
                .engine
                .decide_pivot_because(
                    approval,
                    &digest,
                    approve,
                    &person,
                    crate::saga::model::Via::Dashboard,
                    reason.as_deref(),
                )
                .await;
            if decided.is_ok() {
                crate::ui::ssr::note_right(&state, run, &person, &right).await;
            }
            decided
        }
        Err(refused) => Err(refused),
    };
    crate::ui::ssr::back_to(
        &format!("/runs/{run}"),
        done.map(|run| {
            format!(
                "Pivot {}. The run is now {}.",
                if approve { "approved" } else { "rejected" },
                run.status.in_words()
            )
        }),
    )
    .await;
    Ok(())
}

#[server(endpoint = "edit_pivot_step")]
pub async fn edit_pivot_step(
    run: String,
    approval: i64,
    digest: String,
    step: i64,
    args: String,
) -> Result<(), ServerFnError> {
    // A viewer is refused before anything is read.
    let user = crate::ui::ssr::decider().await?;
    let run = crate::ui::ssr::run_id(&run)?;
    let state = crate::ui::ssr::app_state()?;
    let done = match serde_json::from_str::<serde_json::Value>(&args) {
        Err(e) => Err(format!(
            "The arguments of step {step} are not JSON ({e}); nothing was changed."
        )),
        Ok(args) => match state.engine.approval_of_run(run, approval).await {
            Ok(row) => {
                let (person, _) = crate::ui::ssr::deciding_on(&state, &row, &user).await?;
                state
                    .engine
                    .edit_pivot(approval, &digest, step, args, &person)
                    .await
                    .map_err(|refusal| format!("{refusal}; nothing was changed."))
            }
            Err(refusal) => Err(refusal.to_string()),
        },
    };
    crate::ui::ssr::back_to(
        &format!("/runs/{run}"),
        done.map(|approval| {
            let edits = crate::saga::model::plan_edits(&approval.plan);
            format!(
                "Saved: {}. Read the edited plan, then approve or reject it.",
                edits.last().map(|e| e.summary()).unwrap_or_default()
            )
        }),
    )
    .await;
    Ok(())
}

#[server(endpoint = "decide_step")]
pub async fn decide_step(
    run: String,
    approval: i64,
    digest: String,
    decision: String,
) -> Result<(), ServerFnError> {
    // A viewer is refused before anything is read.
    let user = crate::ui::ssr::decider().await?;
    // Also where the browser is sent back to: a run id, never other text.
    let run = crate::ui::ssr::run_id(&run)?;
    let state = crate::ui::ssr::app_state()?;
    let approve = crate::ui::ssr::choice("decision", &decision, "approve", "reject")?;
    let done = match state.engine.approval_of_run(run, approval).await {
        Ok(row) => {
            let (person, right) = crate::ui::ssr::deciding_on(&state, &row, &user).await?;
            let decided = state
                .engine
                .decide_step(
                    approval,
                    &digest,
                    approve,
                    &person,
                    crate::saga::model::Via::Dashboard,
                )
                .await;
            if decided.is_ok() {
                crate::ui::ssr::note_right(&state, run, &person, &right).await;
            }
            decided
        }
        Err(refused) => Err(refused),
    };
    crate::ui::ssr::back_to(
        &format!("/runs/{run}"),
        done.map(|step| {
            format!(
                "Step {} {}: {}.",
                step.step_idx,
                if approve { "approved" } else { "rejected" },
                crate::saga::status::InWords::in_words(step.status)
            )
        }),
    )
    .await;
    Ok(())
}

#[server(endpoint = "answer_question")]
pub async fn answer_question(
    run: String,
    step: i64,
    asked: String,
    happened: String,
) -> Result<(), ServerFnError> {
    let person = crate::ui::ssr::deciding_person().await?;
    let state = crate::ui::ssr::app_state()?;
    let run_id = crate::ui::ssr::run_id(&run)?;
    let yes = crate::ui::ssr::choice("happened", &happened, "yes", "no")?;
    let asked = crate::ui::ssr::asked_at(&asked)?;
    let done = state
        .engine
        .answer(run_id, step, yes, None, asked, &person)
        .await;
    crate::ui::ssr::back_to(
        &format!("/runs/{run}"),
        done.map(|step| {
            format!(
                "Recorded: step {} {}.",
                step.step_idx,
                if yes { "happened" } else { "did not happen" }
            )
        }),
    )
    .await;
    Ok(())
}

#[server(endpoint = "answer_compensation")]
pub async fn answer_compensation(
    run: String,
    step: i64,
    asked: String,
    undone: String,
) -> Result<(), ServerFnError> {
    let person = crate::ui::ssr::deciding_person().await?;
    let state = crate::ui::ssr::app_state()?;
    let run_id = crate::ui::ssr::run_id(&run)?;
    let yes = crate::ui::ssr::choice("undone", &undone, "yes", "no")?;
    let asked = crate::ui::ssr::asked_at(&asked)?;
    let done = state
        .engine
        .answer_compensation(run_id, step, yes, asked, &person)
        .await;
    crate::ui::ssr::back_to(
        &format!("/runs/{run}"),
        done.map(|c| {
            if yes {
                format!("Recorded: step {} is undone.", c.step_idx)
            } else {
                format!(
                    "Recorded: the undo of step {} did not happen; it was sent again ({}).",
                    c.step_idx,
                    crate::saga::status::InWords::in_words(c.status)
                )
            }
        }),
    )
    .await;
    Ok(())
}

#[server(endpoint = "unwind_run")]
pub async fn unwind_run(run: String, reason: String) -> Result<(), ServerFnError> {
    let person = crate::ui::ssr::deciding_person().await?;
    let state = crate::ui::ssr::app_state()?;
    let run_id = crate::ui::ssr::run_id(&run)?;
    if reason.trim().is_empty() {
        crate::ui::ssr::back_to::<String, String>(
            &format!("/runs/{run}"),
            Err("Say why the run is unwound.".into()),
        )
        .await;
        return Ok(());
    }
    if let Some(why) = crate::ui::ssr::unstorable(&reason) {
        crate::ui::ssr::back_to::<String, String>(&format!("/runs/{run}"), Err(why.into())).await;
        return Ok(());
    }
    let done = state.engine.unwind(run_id, &person, reason.trim()).await;
    crate::ui::ssr::back_to(
        &format!("/runs/{run}"),
        done.map(|run| {
            format!(
                "Unwound: the run is now {}.",
                crate::saga::status::InWords::in_words(run.status)
            )
        }),
    )
    .await;
    Ok(())
}
