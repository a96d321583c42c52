//! The MCP gateway: any agent that speaks the Model Context Protocol gets
//! the harness's protection without a line of its code changed.
//!
//! `/mcp` (streamable HTTP, the official Rust SDK) lists the tools file's
//! agent-callable tools and runs each call through the engine, exactly as
//! `/api/v1/runs/{run}/calls` does. An MCP client sends no step and names
//! no run in its calls, so:
//!
//! - **The run** is named once, in the client's server configuration: the
//!   header `X-Saga-Run: <label>` on `/mcp`, or the path
//!   `/mcp/runs/<label>` for clients that cannot set headers. It is created
//!   on first use, with the same per-agent label idempotency as
//!   `POST /api/v1/runs`.
//! - **The step** is the gateway's to choose (the cursor rule): a call of
//!   tool T goes to the oldest step of T in the run whose last answer was
//!   not final (unknown, not executed, awaiting approval), so a retry,
//!   reworded or not, reads that step's recorded or reconciled outcome and
//!   never makes a second effect. Otherwise it is a new step.
//!
//! The pure tool `saga_run` gives the model the run's log, so a resumed
//! agent rebuilds its context from the log, not from its transcript.

pub mod upstream;

use crate::saga::answer::{outcome_words, AskAgain};
use crate::saga::class::{Phase, ToolClass};
use crate::saga::engine::{CallOutcome, Engine, OutcomeKind, Refusal};
use crate::saga::input;
use crate::saga::model::{plan_edits, Actor, Approval, NewRun, Step};
use crate::saga::pivot::PlannedCall;
use crate::saga::registry::{Registry, ToolSpec};
use crate::saga::status::{ApprovalStatus, RunStatus};
use crate::saga::store::SagaStore;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
    CreateTaskResult, DetailedTask, GetTaskParams, GetTaskResult, Implementation, JsonObject,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Task, TaskPayload,
    TaskStatus, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{json, Value};
use std::sync::Arc;
use uuid::Uuid;

/// The header that names the run on `/mcp`.
pub const RUN_HEADER: &str = "x-saga-run";

/// The pure tool that reads the run's log.
pub const RUN_TOOL: &str = "saga_run";

/// The tool that asks a person to approve the run's irreversible steps.
pub const PIVOT_TOOL: &str = "saga_propose_pivot";

/// The tool that takes back everything the run did, by its ways back.
pub const UNWIND_TOOL: &str = "saga_unwind";

/// The tool that says the run is done.
pub const COMPLETE_TOOL: &str = "saga_complete";

/// The agent an MCP request was authenticated as (set by the router's
/// bearer check before the request reaches the gateway).
#[derive(Clone, Debug)]
pub struct McpAgent(pub String);

/// The run label from `/mcp/runs/<label>`.
#[derive(Clone, Debug)]
pub struct PathRun(pub String);

/// `saga_propose_pivot`'s arguments.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Proposal {
    summary: String,
    commit: Vec<PlannedCall>,
}

/// Who is calling, as the request says.
struct Caller {
    agent: String,
    label: Option<String>,
    origin: Option<String>,
    /// Cancelled when the client withdraws the request.
    gave_up: tokio_util::sync::CancellationToken,
}

/// One gateway per MCP session; all share the engine.
#[derive(Clone)]
pub struct Gateway {
    engine: Arc<Engine>,
    tools: Arc<Vec<Tool>>,
    /// Runs already named, by (agent, label), shared by every session; the
    /// least recently used forgotten first (and read from the store again
    /// when named again).
    runs: Arc<std::sync::Mutex<lru::LruCache<(String, String), Uuid>>>,
}

/// How many named runs the gateway remembers.
const KNOWN_RUNS: std::num::NonZeroUsize = std::num::NonZeroUsize::new(10_000).unwrap();

impl Gateway {
    pub fn new(engine: Arc<Engine>, registry: &Registry) -> Gateway {
        let mut tools: Vec<Tool> = registry
            .tools()
            .filter(|spec| !spec.way_back_only && !spec.gated)
            .map(tool_of)
            .collect();
        tools.push(run_tool());
        let commit_steps: Vec<&str> = registry
            .tools()
            .filter(|spec| spec.class == ToolClass::Irreversible && !spec.way_back_only)
            .map(|spec| spec.name.as_str())
            .collect();
        tools.push(pivot_tool(&commit_steps));
        tools.push(unwind_tool());
        tools.push(complete_tool());
        Gateway {
            engine,
            tools: Arc::new(tools),
            runs: Arc::new(std::sync::Mutex::new(lru::LruCache::new(KNOWN_RUNS))),
        }
    }

    fn store(&self) -> &Arc<dyn SagaStore> {
        self.engine.store()
    }

    /// The agent, the run label and the origin (scheme and host, for links
    /// to the dashboard) of this request.
    fn caller(ctx: &RequestContext<RoleServer>) -> Result<Caller, McpError> {
        let parts = ctx.extensions.get::<axum::http::request::Parts>();
        let agent = parts
            .and_then(|p| p.extensions.get::<McpAgent>())
            .map(|a| a.0.clone())
            .ok_or_else(|| McpError::invalid_request("no agent: send a bearer token", None))?;
        let label = parts.and_then(|p| {
            p.extensions
                .get::<PathRun>()
                .map(|r| r.0.clone())
                .or_else(|| {
                    p.headers
                        .get(RUN_HEADER)
                        .and_then(|v| v.to_str().ok())
                        .map(str::trim)
                        .filter(|v| !v.is_empty())
                        .map(str::to_owned)
                })
        });
        let origin = parts.and_then(|p| {
            let host = p.headers.get(axum::http::header::HOST)?.to_str().ok()?;
            let scheme = p
                .headers
                .get("x-forwarded-proto")
                .and_then(|v| v.to_str().ok())
                .filter(|s| matches!(*s, "http" | "https"))
                .unwrap_or("http");
            Some(format!("{scheme}://{host}"))
        });
        Ok(Caller {
            agent,
            label,
            origin,
            gave_up: ctx.ct.clone(),
        })
    }

    /// The run this client named, created on first use (and remembered:
    /// a run's label and agent never change).
    async fn run_of(&self, agent: &str, label: &str) -> Result<Uuid, String> {
        if label.contains('\0') {
            return Err(input::InputMistake::Nul.to_string());
        }
        input::within("run label", label, input::MAX_LABEL_CHARS).map_err(|m| m.to_string())?;
        let named = (agent.to_owned(), label.to_owned());
        if let Some(id) = self
            .runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&named)
        {
            return Ok(*id);
        }
        let (run, _) = self
            .store()
            .create_run(NewRun {
                agent: agent.to_owned(),
                label: Some(label.to_owned()),
                purpose: format!("MCP client run {label:?}"),
            })
            .await
            .map_err(|e| crate::incident::store_words("MCP tool call", &e))?;
        self.runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .put(named, run.id);
        Ok(run.id)
    }

    /// A call, answered; with the run it went to, once named.
    async fn call(
        &self,
        caller: &Caller,
        label: &str,
        tool: &str,
        args: Value,
    ) -> (CallToolResult, Option<Uuid>) {
        let run_id = match self.run_of(&caller.agent, label).await {
            Ok(id) => id,
            Err(why) => return (refused(&why), None),
        };
        (self.call_in(caller, run_id, tool, args).await, Some(run_id))
    }

    async fn call_in(
        &self,
        caller: &Caller,
        run_id: Uuid,
        tool: &str,
        args: Value,
    ) -> CallToolResult {
        let agent = caller.agent.as_str();
        let page = caller
            .origin
            .as_ref()
            .map(|origin| format!("{origin}/runs/{run_id}"));
        if tool == RUN_TOOL {
            return self.run_log(agent, run_id).await;
        }
        if tool == PIVOT_TOOL {
            return self.pivot(agent, run_id, args, page.as_deref()).await;
        }
        if tool == UNWIND_TOOL {
            return self.unwind(agent, run_id, args).await;
        }
        if tool == COMPLETE_TOOL {
            return match self.engine.complete(agent, run_id).await {
                Ok(run) => result(
                    format!("the run is {}", run.status),
                    Some(json!({"run_status": run.status.as_str()})),
                    false,
                ),
                Err(refusal) => refused(&refusal_words(&refusal)),
            };
        }
        let listening = || !caller.gave_up.is_cancelled();
        match self
            .engine
            .call_choosing_step(agent, run_id, tool, args, &listening)
            .await
        {
            Ok(outcome) => answer(tool, &outcome, page.as_deref()),
            Err(refusal) => refused(&refusal_words(&refusal)),
        }
    }

    /// `saga_propose_pivot`. Like any other call, a second call reads the
    /// first one's state rather than acting again: while a plan waits,
    /// calling again answers where it stands (a reworded plan does not
    /// replace the one a person may be reading); once decided, it answers
    /// the decision and the commit steps' outcomes.
    async fn pivot(
        &self,
        agent: &str,
        run_id: Uuid,
        args: Value,
        page: Option<&str>,
    ) -> CallToolResult {
        let run = match self.engine.agents_run(agent, run_id).await {
            Ok(run) => run,
            Err(refusal) => return refused(&refusal_words(&refusal)),
        };
        let standing = match run.pivot_approval_id {
            Some(id) => match self.store().approval(id).await {
                Ok(approval) => approval.filter(|a| a.status != ApprovalStatus::Superseded),
                Err(e) => return refused(&crate::incident::store_words("MCP tool call", &e)),
            },
            None => None,
        };
        let approval = match standing {
            Some(approval) if approval.status != ApprovalStatus::Pending => {
                return self.pivot_decided(agent, run_id, &approval).await;
            }
            Some(approval) => approval,
            None => {
                let proposal: Proposal = match serde_json::from_value(args) {
                    Ok(proposal) => proposal,
                    Err(e) => {
                        return refused(&format!(
                            "the arguments are {{\"summary\": text, \"commit\": [{{\"tool\": name, \"args\": {{…}}}}]}}: {e}"
                        ))
                    }
                };
                if let Err(mistake) =
                    input::within("summary", &proposal.summary, input::MAX_TEXT_CHARS)
                {
                    return refused(&mistake.to_string());
                }
                match self
                    .engine
                    .propose_pivot(agent, run_id, &proposal.summary, proposal.commit)
                    .await
                {
                    Ok(approval) => approval,
                    Err(refusal) => return refused(&refusal_words(&refusal)),
                }
            }
        };
        let text = format!(
            "awaiting_approval: the plan waits for a person's approval; nothing in it was sent \
             and the run takes no other call until then. {}Call {PIVOT_TOOL} again later \
             to read the decision and the commit's outcome.",
            page.map(|page| format!("A support lead decides at {page}. "))
                .unwrap_or_default()
        );
        let structured = json!({
            "outcome": "awaiting_approval",
            "approval_id": approval.id,
            "summary": approval.summary,
            "plan": approval.plan,
            "expires_at": approval.expires_at,
        });
        result(text, Some(structured), false)
    }

    /// A decided pivot, as the model reads it: approved with the commit
    /// steps' outcomes; rejected by a person; or expired, which nobody
    /// decided.
    async fn pivot_decided(
        &self,
        agent: &str,
        run_id: Uuid,
        approval: &Approval,
    ) -> CallToolResult {
        let (run, steps, _) = match self.engine.agents_view(agent, run_id).await {
            Ok(view) => view,
            Err(refusal) => return refused(&refusal_words(&refusal)),
        };
        let commit: Vec<&Step> = steps
            .iter()
            .filter(|s| s.phase == Phase::AfterPivot)
            .collect();
        let by = approval
            .decided_by
            .as_ref()
            .map(|who| who.name().to_owned())
            .unwrap_or_default();
        let (outcome, mut text, is_error) = match approval.status {
            ApprovalStatus::Approved => (
                "approved",
                format!("approved by {by}; the commit steps ran through the log:"),
                false,
            ),
            ApprovalStatus::Expired => (
                "expired",
                "expired: nobody decided before the deadline, so nothing in the plan was sent \
                 and the staged steps are undone. Nobody rejected it: propose again in a new run \
                 if it is still wanted"
                    .to_owned(),
                true,
            ),
            _ => (
                "rejected",
                format!(
                    "rejected by {by}{}: nothing in the plan was sent and the staged steps are \
                     undone. Go on without it",
                    approval
                        .note
                        .as_deref()
                        .map(|note| format!(" ({note})"))
                        .unwrap_or_default()
                ),
                true,
            ),
        };
        let edits = plan_edits(&approval.plan);
        for edit in &edits {
            text.push_str(&format!(
                "\nBefore deciding, {}; the plan {} its arguments as {}",
                edit.summary(),
                if approval.status == ApprovalStatus::Approved {
                    "ran with"
                } else {
                    "had"
                },
                edit.after
            ));
        }
        for step in &commit {
            text.push_str(&format!(
                "\nstep {}: {} — {}",
                step.step_idx,
                step.tool,
                OutcomeKind::of(step.status).as_str()
            ));
            if let Some(reference) = &step.external_ref {
                text.push_str(&format!(" ({reference})"));
            }
        }
        let structured = json!({
            "outcome": outcome,
            "approval_id": approval.id,
            "decided_by": by,
            "decided_at": approval.decided_at,
            "run_status": run.status.as_str(),
            "edits": edits,
            "commit": commit.iter().map(|s| json!({
                "step": s.step_idx,
                "tool": s.tool,
                "outcome": OutcomeKind::of(s.status).as_str(),
                "external_ref": s.external_ref,
                "result": s.result,
                "error": s.error,
            })).collect::<Vec<_>>(),
        });
        result(text, Some(structured), is_error)
    }

    /// `saga_unwind`: every step of the run taken back by its way back, in
    /// reverse order; a second call reads where the unwind stands.
    async fn unwind(&self, agent: &str, run_id: Uuid, args: Value) -> CallToolResult {
        let reason = args
            .get("reason")
            .and_then(Value::as_str)
            .map(str::trim)
            .unwrap_or_default();
        if reason.is_empty() {
            return refused("say why the run is unwound: `reason` cannot be empty");
        }
        if let Err(mistake) = input::within("reason", reason, input::MAX_TEXT_CHARS) {
            return refused(&mistake.to_string());
        }
        let unwound = match self.engine.agents_run(agent, run_id).await {
            // Already taken back, or waiting on a person: read, not redo.
            Ok(run) if matches!(run.status, RunStatus::Unwound | RunStatus::NeedsAttention) => {
                Ok(run)
            }
            Ok(run) => {
                self.engine
                    .unwind(run.id, &Actor::Agent(agent.to_owned()), reason)
                    .await
            }
            Err(refusal) => Err(refusal),
        };
        let run = match unwound {
            Ok(run) => run,
            Err(refusal) => return refused(&refusal_words(&refusal)),
        };
        let log = self.run_log(agent, run_id).await;
        let mut text = format!(
            "the run is {}{}",
            run.status,
            if run.status == RunStatus::NeedsAttention {
                ": a way back needs a person, who has been asked"
            } else {
                ""
            }
        );
        for block in &log.content {
            if let Some(line) = block.as_text() {
                text.push('\n');
                text.push_str(&line.text);
            }
        }
        result(text, log.structured_content, false)
    }

    /// `saga_run`: the run's log, for a model.
    async fn run_log(&self, agent: &str, run_id: Uuid) -> CallToolResult {
        let (run, steps, cursor) = match self.engine.agents_view(agent, run_id).await {
            Ok(view) => view,
            Err(refusal) => return refused(&refusal_words(&refusal)),
        };
        let mut lines = vec![format!(
            "Run {:?} ({}), {} step(s) logged.",
            run.label.clone().unwrap_or_default(),
            run.status,
            steps.len()
        )];
        let mut logged = Vec::new();
        let outcomes = match self.engine.outcome_kinds(&steps).await {
            Ok(outcomes) => outcomes,
            Err(refusal) => return refused(&refusal_words(&refusal)),
        };
        for (step, outcome) in steps.iter().zip(outcomes) {
            let mut line = format!(
                "step {}: {} — {}",
                step.step_idx,
                step.tool,
                outcome.as_str()
            );
            if let Some(reference) = &step.external_ref {
                line.push_str(&format!(" ({reference})"));
            }
            if step.owed_to_agent {
                line.push_str(&format!(
                    "; not final yet: call {} again to read its outcome",
                    step.tool
                ));
            }
            lines.push(line);
            logged.push(json!({
                "step": step.step_idx,
                "tool": step.tool,
                "outcome": outcome.as_str(),
                "external_ref": step.external_ref,
                "args": step.args,
                "result": step.result,
                "error": step.error,
            }));
        }
        let structured = json!({
            "run": {"id": run.id, "label": run.label, "status": run.status.as_str()},
            "steps": logged,
            "next_step": cursor.next_step,
        });
        result(lines.join("\n"), Some(structured), false)
    }
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new(
            "saga-harness",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(
            "Every tool with side effects runs through a write-ahead saga log: each call is \
                 recorded before it is sent, keyed so that it never happens twice. If a call's \
                 outcome is unknown, call the same tool again (reworded or not): you get the \
                 recorded outcome, never a second effect. Call saga_run to read what this run \
                 has done so far.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items((*self.tools).clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let caller = Self::caller(&ctx)?;
        if self.get_tool(&request.name).is_none() {
            return Err(McpError::invalid_params(
                format!("no tool named {:?}", request.name),
                None,
            ));
        }
        let Some(label) = caller.label.clone() else {
            return Ok(refused(
                "this MCP server does not know which run you are in: configure the client with \
                 the header X-Saga-Run: <label>, or the URL /mcp/runs/<label>",
            )
            .into());
        };
        let args = Value::Object(request.arguments.unwrap_or_default());
        // The agent API's own checks: one rule for both front doors.
        if let Err(mistake) = input::check_value(&args) {
            return Ok(refused(&mistake.to_string()).into());
        }
        let (answer, run_id) = self.call(&caller, &label, &request.name, args).await;
        if ctx.ct.is_cancelled() {
            // The client gave up after the engine answered and before the
            // answer left: the step stays owed, so its retry reads this
            // outcome, not a new effect.
            let step = answer
                .structured_content
                .as_ref()
                .and_then(|s| s["step"].as_i64());
            if let (Some(run_id), Some(step)) = (run_id, step) {
                if let Err(error) = self.store().set_owed_to_agent(run_id, step, true).await {
                    tracing::warn!(%error, %run_id, step, "a withdrawn call's step is not marked owed");
                }
            }
        }
        let tasks = ctx
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks());
        match run_id.and_then(|run| held_task(run, &request.name, &answer)) {
            // A client that can poll gets a task that ends when a person
            // decides; any other reads the same by calling again.
            Some(task_id) if tasks => {
                let now = chrono::Utc::now().to_rfc3339();
                let task = Task::new(task_id, TaskStatus::Working, now.clone(), now)
                    .with_status_message(text_of(&answer))
                    .with_poll_interval_ms(TASK_POLL_MS);
                Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
            }
            // A client that can open a link for its user is asked to, so the
            // person who decides sees the page now; the call stays held and
            // its answer says to call again.
            Some(task_id) => {
                if let (Some(origin), Some(run_id)) = (&caller.origin, run_id) {
                    let page = format!("{origin}/runs/{run_id}");
                    if let Ok(page) = url::Url::parse(&page) {
                        let asked = ctx
                            .peer
                            .elicit_url_with_timeout(
                                "A support lead must approve this call before anything is \
                                 sent. Open the run's page to decide, or pass it on.",
                                page,
                                task_id,
                                Some(ELICITATION_WAIT),
                            )
                            .await;
                        if let Err(error) = asked {
                            tracing::debug!(%error, "no link opened for a held call");
                        }
                    }
                }
                Ok(answer.into())
            }
            None => Ok(answer.into()),
        }
    }

    /// `tasks/get`: the held call's state, read as a second call would read
    /// it (never a new effect): working while it waits for a person, then
    /// completed with the call's answer.
    async fn get_task(
        &self,
        request: GetTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let caller = Self::caller(&ctx)?;
        let unknown = || McpError::invalid_params(format!("no task {:?}", request.task_id), None);
        let held = HeldTask::parse(&request.task_id).ok_or_else(unknown)?;
        let run = self
            .engine
            .agents_run(&caller.agent, held.run_id)
            .await
            .map_err(|_| unknown())?;
        let answer = match &held.step {
            None => self.call_in(&caller, run.id, PIVOT_TOOL, json!({})).await,
            Some((step_idx, tool)) => {
                let steps = self.store().steps(run.id).await.map_err(|e| {
                    let incident = crate::incident::Incident::record("MCP task read", &e);
                    McpError::internal_error(incident.message(), None)
                })?;
                let step = steps
                    .into_iter()
                    .find(|s| s.step_idx == *step_idx && s.tool == *tool)
                    .ok_or_else(unknown)?;
                let page = caller
                    .origin
                    .as_ref()
                    .map(|origin| format!("{origin}/runs/{}", run.id));
                match self
                    .engine
                    .call(&caller.agent, run.id, tool, step.args, Some(*step_idx))
                    .await
                {
                    Ok(outcome) => answer(tool, &outcome, page.as_deref()),
                    Err(refusal) => refused(&refusal_words(&refusal)),
                }
            }
        };
        let now = chrono::Utc::now().to_rfc3339();
        let task = Task::new(
            request.task_id.clone(),
            TaskStatus::Working,
            run.created_at.to_rfc3339(),
            now,
        )
        .with_poll_interval_ms(TASK_POLL_MS);
        let detailed = if held_task(run.id, held.tool(), &answer).is_some() {
            DetailedTask::new(
                task.with_status_message(text_of(&answer)),
                TaskPayload::Working,
            )
        } else {
            let Ok(Value::Object(result)) = serde_json::to_value(&answer) else {
                return Err(McpError::internal_error(
                    "an answer that is not an object",
                    None,
                ));
            };
            DetailedTask::new(task, TaskPayload::Completed { result })
        };
        Ok(GetTaskResult::new(detailed))
    }

    /// A person decides a held call; an agent cannot withdraw it.
    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        Err(McpError::invalid_request(
            format!(
                "task {:?} waits for a person's decision, which is made in the dashboard; it \
                 cannot be withdrawn from here (unwind the run with {UNWIND_TOOL} instead)",
                request.task_id
            ),
            None,
        ))
    }
}

/// How long a held call waits for the client to show its user the link.
const ELICITATION_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// How often a client should poll a held call's task.
const TASK_POLL_MS: u64 = 2_000;

/// A held call as a task: `step:RUN:STEP:TOOL`, or `pivot:RUN`.
struct HeldTask {
    run_id: Uuid,
    step: Option<(i64, String)>,
}

impl HeldTask {
    fn parse(id: &str) -> Option<HeldTask> {
        let mut parts = id.splitn(4, ':');
        match (parts.next()?, parts.next()?.parse().ok()?) {
            ("pivot", run_id) if parts.next().is_none() => Some(HeldTask { run_id, step: None }),
            ("step", run_id) => {
                let step = parts.next()?.parse().ok()?;
                let tool = parts.next()?.to_owned();
                Some(HeldTask {
                    run_id,
                    step: Some((step, tool)),
                })
            }
            _ => None,
        }
    }

    fn tool(&self) -> &str {
        self.step
            .as_ref()
            .map_or(PIVOT_TOOL, |(_, tool)| tool.as_str())
    }
}

/// The task id of an answer that says the call waits for a person.
fn held_task(run_id: Uuid, tool: &str, answer: &CallToolResult) -> Option<String> {
    let structured = answer.structured_content.as_ref()?;
    if structured["outcome"] != "awaiting_approval" {
        return None;
    }
    if tool == PIVOT_TOOL {
        return Some(format!("pivot:{run_id}"));
    }
    let step = structured["step"].as_i64()?;
    Some(format!("step:{run_id}:{step}:{tool}"))
}

/// The words of an answer.
fn text_of(answer: &CallToolResult) -> String {
    answer
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|t| t.text.as_str()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A registry tool as MCP lists it: annotations from its class.
fn tool_of(spec: &ToolSpec) -> Tool {
    let what = match spec.class {
        ToolClass::Pure => "Reads only; no side effect.",
        ToolClass::Reversible => "Has a side effect the harness can undo.",
        ToolClass::Compensatable => "Has a side effect the harness can compensate.",
        ToolClass::Irreversible => {
            "Has a side effect that cannot be taken back: it waits for a person's approval."
        }
    };
    let description = match (&spec.description, &spec.display) {
        (Some(description), _) => format!("{description} {what}"),
        (None, Some(display)) => format!("{display}. {what}"),
        (None, None) => format!("{}. {what}", spec.name),
    };
    let pure = spec.class == ToolClass::Pure;
    let annotations = ToolAnnotations::new()
        .read_only(pure)
        .destructive(spec.class == ToolClass::Irreversible)
        .idempotent(!pure)
        .open_world(true);
    let schema = match &spec.schema {
        Some(Value::Object(schema)) => schema.clone(),
        _ => open_object(),
    };
    Tool::new(spec.name.clone(), description, Arc::new(schema)).with_annotations(annotations)
}

fn run_tool() -> Tool {
    Tool::new(
        RUN_TOOL,
        "This run's saga log: every step so far, its outcome and its external reference, and \
         which steps have no final outcome yet. Read it when you resume.",
        Arc::new(open_object()),
    )
    .with_annotations(
        ToolAnnotations::new()
            .read_only(true)
            .destructive(false)
            .idempotent(true)
            .open_world(false),
    )
}

/// A gateway tool that leads to effects that cannot be taken back (the
/// pivot's commit, an unwind's corrections), each made once under its key.
fn drives_effects() -> ToolAnnotations {
    ToolAnnotations::new()
        .read_only(false)
        .destructive(true)
        .idempotent(true)
        .open_world(true)
}

fn unwind_tool() -> Tool {
    let Value::Object(schema) = json!({
        "type": "object",
        "required": ["reason"],
        "properties": {"reason": {"type": "string", "description": "Why, for the people who read the log."}}
    }) else {
        unreachable!("a JSON object literal")
    };
    Tool::new(
        UNWIND_TOOL,
        "Takes back everything this run did, newest first, each by its pre-written way back \
         (cancel, refund, close), under its own key; people who saw an effect that cannot be \
         taken back get a correction a support lead signs off. Use it when the task cannot be \
         finished.",
        Arc::new(schema),
    )
    .with_annotations(drives_effects())
}

fn complete_tool() -> Tool {
    Tool::new(
        COMPLETE_TOOL,
        "Says this run's task is done. Refused while a call has no final outcome or a staged \
         effect (a draft, a hold) is still open: commit those through the pivot or unwind.",
        Arc::new(open_object()),
    )
    .with_annotations(
        ToolAnnotations::new()
            .read_only(false)
            .destructive(false)
            .idempotent(true)
            .open_world(false),
    )
}

/// The pivot as a tool: a summary for the person and the commit steps.
fn pivot_tool(commit_steps: &[&str]) -> Tool {
    let Value::Object(schema) = json!({
        "type": "object",
        "required": ["summary", "commit"],
        "properties": {
            "summary": {"type": "string", "description": "What the plan does and why, for the person who approves it."},
            "commit": {
                "type": "array",
                "minItems": 1,
                "description": "The irreversible calls to make once approved, in order.",
                "items": {
                    "type": "object",
                    "required": ["tool"],
                    "properties": {
                        "tool": {"type": "string"},
                        "args": {"type": "object"}
                    }
                }
            }
        }
    }) else {
        unreachable!("a JSON object literal")
    };
    let steps = if commit_steps.is_empty() {
        String::new()
    } else {
        format!(" Commit steps may call: {}.", commit_steps.join(", "))
    };
    Tool::new(
        PIVOT_TOOL,
        format!(
            "Asks a person to approve the run's irreversible calls (the pivot). Nothing in the \
             plan is sent until they approve; then the harness makes each call once, under its \
             own key. Stage everything that can be undone first.{steps}"
        ),
        Arc::new(schema),
    )
    .with_annotations(drives_effects())
}

fn open_object() -> JsonObject {
    let Value::Object(schema) = json!({"type": "object"}) else {
        unreachable!("a JSON object literal")
    };
    schema
}

/// The engine's answer, as the model reads it. The structured content is
/// the same object `/api/v1` answers with.
fn answer(tool: &str, outcome: &CallOutcome, page: Option<&str>) -> CallToolResult {
    let why = match &outcome.limit {
        Some(over) => Some(over.words.as_str()),
        None => outcome.error.as_deref(),
    };
    let words = outcome_words(outcome.outcome, AskAgain::Tool(tool), why, page);
    let mut text = format!("{}: {words}", outcome.outcome.as_str());
    if let Some(reference) = &outcome.external_ref {
        text.push_str(&format!(" (reference {reference})"));
    }
    let structured = serde_json::to_value(outcome).unwrap_or(Value::Null);
    let mut answer = result(text, Some(structured), outcome.outcome.is_final_no());
    if outcome.outcome == OutcomeKind::Confirmed {
        if let Some(found) = &outcome.result {
            answer.content.extend(result_blocks(found));
        }
    }
    answer
}

/// What the system answered, for a model that reads only text: an upstream
/// MCP tool's own content blocks, or the system's JSON.
fn result_blocks(found: &Value) -> Vec<ContentBlock> {
    found
        .get("content")
        .and_then(|content| serde_json::from_value::<Vec<ContentBlock>>(content.clone()).ok())
        .unwrap_or_else(|| vec![ContentBlock::text(found.to_string())])
}

/// Words for the model, and the same as data.
fn result(text: String, structured: Option<Value>, is_error: bool) -> CallToolResult {
    let content = vec![ContentBlock::text(text)];
    let mut result = if is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    result.structured_content = structured;
    result
}

/// A call the harness would not make, told to the model as a tool error.
fn refused(why: &str) -> CallToolResult {
    result(format!("refused: {why}"), None, true)
}

fn refusal_words(refusal: &Refusal) -> String {
    match refusal {
        // The gateway owns the cursor: say what the model can do instead.
        Refusal::StepUnresolved {
            waiting_for_person, ..
        } => {
            if *waiting_for_person {
                "an earlier call of this run waits for a person's approval; nothing new runs \
                 until it is decided"
                    .to_owned()
            } else {
                "an earlier call of this run has no final outcome yet; call that tool again to \
                 read it before anything new"
                    .to_owned()
            }
        }
        other => crate::incident::refusal_words("MCP tool call", other),
    }
}

/// `/mcp` and `/mcp/runs/{label}`, each behind the agent's bearer token.
pub fn router(state: &crate::state::AppState) -> axum::Router<crate::state::AppState> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
    let gateway = Gateway::new(state.engine.clone(), &state.registry);
    let service = StreamableHttpService::new(
        move || Ok(gateway.clone()),
        LocalSessionManager::default().into(),
        // Every request carries an agent's bearer token, which a page in a
        // browser cannot borrow: the host check against DNS rebinding is
        // not what protects this endpoint.
        StreamableHttpServerConfig::default().disable_allowed_hosts(),
    );
    axum::Router::new()
        .route_service("/mcp", service.clone())
        .route_service("/mcp/runs/{label}", service)
        .layer(tower_http::limit::RequestBodyLimitLayer::new(
            crate::api::MAX_BODY_BYTES,
        ))
        .layer(axum::middleware::from_fn(refuse_oversized))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ))
}

/// A message over the API's body limit is refused before it is read, with
/// a JSON-RPC error a client can show (a body without a length is cut at
/// the limit by the layer below).
async fn refuse_oversized(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let length = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if length.is_some_and(|n| n > crate::api::MAX_BODY_BYTES) {
        let error = json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": {
                "code": -32600,
                "message": format!(
                    "the message is over {} KiB; send smaller arguments",
                    crate::api::MAX_BODY_BYTES / 1024
                ),
            },
        });
        return (axum::http::StatusCode::PAYLOAD_TOO_LARGE, axum::Json(error)).into_response();
    }
    next.run(request).await
}

/// The bearer check in front of the gateway, and the run label from the
/// path, both handed to the gateway in the request's extensions.
async fn authenticate(
    axum::extract::State(state): axum::extract::State<crate::state::AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let (mut parts, body) = request.into_parts();
    let agent = match crate::api::Agent::through_outage(&mut parts, &state).await {
        Ok(agent) => agent.0,
        Err(refused) => {
            let mut response = refused.into_response();
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
            return response;
        }
    };
    parts.extensions.insert(McpAgent(agent));
    if let Some(raw) = parts.uri.path().strip_prefix("/mcp/runs/") {
        match percent_encoding::percent_decode_str(raw).decode_utf8() {
            Ok(label) if !label.trim().is_empty() => {
                parts.extensions.insert(PathRun(label.trim().to_owned()));
            }
            _ => {
                return (
                    axum::http::StatusCode::BAD_REQUEST,
                    "the run label in /mcp/runs/<label> must be UTF-8 text",
                )
                    .into_response()
            }
        }
    }
    next.run(axum::extract::Request::from_parts(parts, body))
        .await
}
