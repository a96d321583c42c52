//! The corrections inbox (R10): every correction waiting for a person,
//! widest audience first (public, then customers, then partners, finance,
//! the team), each with the effect it corrects, who receives it and the
//! pre-written text, which may be edited before it is sent. Sending goes
//! through the saga log under the correction's own key; dismissing needs a
//! reason.

use super::{Notice, TopBar};
use crate::saga::status::{CorrectionStatus, InWords, StepStatus};
use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InboxItem {
    pub id: i64,
    pub run_id: String,
    pub run_title: String,
    pub step_idx: i64,
    pub tool: String,
    pub audience: String,
    pub status: CorrectionStatus,
    /// The send's own lifecycle once it has been attempted.
    pub send_status: Option<StepStatus>,
    /// The effect being corrected, in words.
    pub effect: String,
    pub effect_args: String,
    pub recipients: Vec<String>,
    pub message: String,
    pub key: String,
    pub age: String,
    /// Why the run was taken back, and by whom: why this correction exists.
    pub why: Option<String>,
    /// The subject line it goes out with, when it goes out as an email.
    pub subject: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Inbox {
    pub items: Vec<InboxItem>,
    pub may_decide: bool,
}

#[component]
pub fn InboxPage() -> impl IntoView {
    let query = use_query_map();
    let live = super::live_tick();
    let inbox = Resource::new(move || live.get(), |_| corrections_inbox());
    view! {
        <Title text="Corrections · Saga Harness"/>
        <TopBar/>
        <main class="page">
            <h1>"Corrections waiting for sign-off"</h1>
            <p class="lede">"Ranked by who saw the original effect: the public first, then customers, partners, finance and the team."</p>
            <Notice query/>
            <Suspense fallback=|| view! { <p>"Loading corrections…"</p> }>
                <ErrorBoundary fallback=|errors| view! {
                    <p class="error" role="alert">
                        {move || errors.get().into_iter().map(|(_, e)| super::error_words(&e)).collect::<Vec<_>>().join("; ")}
                    </p>
                }>
                    {move || Suspend::new(async move { inbox.await.map(inbox_view) })}
                </ErrorBoundary>
            </Suspense>
        </main>
    }
}

/// Who saw the original effect, as a heading says it.
fn audience_heading(audience: &str) -> &'static str {
    match audience {
        "public" => "The public",
        "customer" => "Customers",
        "partner" => "Partners",
        "finance" => "Finance",
        _ => "The team",
    }
}

fn inbox_view(inbox: Inbox) -> AnyView {
    if inbox.items.is_empty() {
        return view! { <p class="empty">"Nothing to sign off. Corrections appear here when an unwind reverses something people outside the team saw."</p> }.into_any();
    }
    let may = inbox.may_decide;
    // The queue comes ranked; each audience keeps its place in the rank.
    let mut groups: Vec<(String, Vec<InboxItem>)> = Vec::new();
    for item in inbox.items {
        match groups
            .iter_mut()
            .find(|(audience, _)| *audience == item.audience)
        {
            Some((_, items)) => items.push(item),
            None => groups.push((item.audience.clone(), vec![item])),
        }
    }
    view! {
        <nav class="groups" aria-label="Audiences">
            {groups.iter().map(|(audience, items)| view! {
                <a href=format!("#audience-{audience}")>{audience_heading(audience)} " · " {items.len()}</a>
            }).collect_view()}
        </nav>
        {groups.into_iter().map(|(audience, items)| view! {
            <section class="audience-group" id=format!("audience-{audience}")>
                <h2>{audience_heading(&audience)} " · " {items.len()} {if items.len() == 1 { " correction" } else { " corrections" }}</h2>
                <ol class="inbox">
                    {items.into_iter().map(|item| correction_card(item, may)).collect_view()}
                </ol>
            </section>
        }).collect_view()}
    }
    .into_any()
}

fn correction_card(item: InboxItem, may: bool) -> impl IntoView {
    let send = ServerAction::<SendCorrection>::new();
    let dismiss = ServerAction::<DismissCorrection>::new();
    let pending = item.status == CorrectionStatus::Pending;
    let text_id = format!("message-{}", item.id);
    let reason_id = format!("reason-{}", item.id);
    view! {
        <li class=format!("panel correction audience-{}", item.audience) id=format!("correction-{}", item.id)>
            <div class="call-head">
                <span class=super::status_class(item.status.as_str()) title=item.status.as_str()>{item.status.in_words()}</span>
                {item.send_status.map(|s| {
                    let class = super::status_class(s.as_str());
                    view! { <span class=class title=s.as_str()>"sending: " {s.in_words()}</span> }
                })}
                <span class="muted">{item.age.clone()} " ago"</span>
            </div>
            <h3>
                {item.effect.clone()}
                " · "
                <a href=format!("/runs/{}", item.run_id)>{item.run_title.clone()}</a>
            </h3>
            {item.why.clone().map(|why| view! { <p class="why-line">"Why: the run was taken back: " {why}</p> })}
            <details class="exact">
                <summary>"Technical details"</summary>
                <p class="muted">"Step " {item.step_idx} " · " <code>{item.tool.clone()}</code> " · correction key " <code class="key">{item.key.clone()}</code></p>
                <pre class="args">{item.effect_args.clone()}</pre>
            </details>
            {item.subject.clone().map(|subject| view! { <p>"Subject: " <strong>{subject}</strong></p> })}
            <p>"To: " <strong>{if item.recipients.is_empty() { "nobody yet".to_owned() } else { item.recipients.join(", ") }}</strong></p>
            {if may && pending {
                view! {
                    <ActionForm action=send attr:class="correction-form">
                        <input type="hidden" name="id" value=item.id/>
                        <label for=text_id.clone()>"Message (edit before sending)"</label>
                        <textarea id=text_id name="message" rows="4" required>{super::textarea_text(item.message.clone())}</textarea>
                        <button type="submit" class="approve">"Send"</button>
                    </ActionForm>
                    <ActionForm action=dismiss attr:class="inline-form">
                        <input type="hidden" name="id" value=item.id/>
                        <label for=reason_id.clone()>"Reason to dismiss"</label>
                        <input id=reason_id type="text" name="reason" required placeholder="why no correction is needed"/>
                        <button type="submit" class="reject">"Dismiss"</button>
                    </ActionForm>
                }.into_any()
            } else if may && item.send_status == Some(StepStatus::Unknown) {
                view! {
                    <blockquote>{item.message.clone()}</blockquote>
                    <UnknownSendQuestion id=item.id message=item.message.clone()/>
                }.into_any()
            } else if may {
                view! {
                    <blockquote>{item.message.clone()}</blockquote>
                    <ActionForm action=send attr:class="inline-form">
                        <input type="hidden" name="id" value=item.id/>
                        <input type="hidden" name="message" value=item.message.clone()/>
                        <button type="submit">"Send again under the same key"</button>
                    </ActionForm>
                }.into_any()
            } else {
                view! { <blockquote>{item.message.clone()}</blockquote> }.into_any()
            }}
        </li>
    }
}

/// A signed-off correction whose send is UNKNOWN: the connection dropped
/// after the message left, and the channel may have no lookup (SMTP). A
/// person who can check (the recipient's mailbox, the provider's log) says
/// whether it went out; "no" lets it be sent again under the same key.
#[component]
fn UnknownSendQuestion(id: i64, message: String) -> impl IntoView {
    let answer = ServerAction::<AnswerCorrectionSend>::new();
    let check = ServerAction::<SendCorrection>::new();
    view! {
        <div class="question" role="group" aria-label="Did this correction go out?">
            <p>
                <strong>"Did this correction reach its recipients?"</strong>
                " The send was cut off after the message left, so the harness cannot tell. Check with the recipient or the provider, then answer."
            </p>
            <div class="decide">
                <ActionForm action=answer attr:class="inline-form">
                    <input type="hidden" name="id" value=id/>
                    <input type="hidden" name="went_out" value="yes"/>
                    <button type="submit">"It went out"</button>
                </ActionForm>
                <ActionForm action=answer attr:class="inline-form">
                    <input type="hidden" name="id" value=id/>
                    <input type="hidden" name="went_out" value="no"/>
                    <button type="submit">"It did not go out"</button>
                </ActionForm>
                <ActionForm action=check attr:class="inline-form">
                    <input type="hidden" name="id" value=id/>
                    <input type="hidden" name="message" value=message/>
                    <button type="submit">"Ask the system again"</button>
                </ActionForm>
            </div>
        </div>
    }
}

#[server(endpoint = "corrections_inbox")]
pub async fn corrections_inbox() -> Result<Inbox, ServerFnError> {
    let user = super::ssr::signed_in().await?;
    let state = super::ssr::app_state()?;
    let queue = state
        .store
        .correction_inbox()
        .await
        .map_err(super::ssr::internal)?;
    let now = chrono::Utc::now();
    let runs: Vec<uuid::Uuid> = queue.iter().map(|q| q.correction.run_id).collect();
    let reasons = state
        .store
        .unwind_reasons(&runs)
        .await
        .map_err(super::ssr::internal)?;
    let mut items = Vec::with_capacity(queue.len());
    for queued in queue {
        let c = queued.correction;
        let words = queued
            .original
            .as_ref()
            .map(|o| state.registry.in_words(&o.tool, &o.args, None));
        let reference = |o: &crate::saga::model::OriginalEffect| {
            super::lead_reference(o.external_ref.as_deref())
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        };
        let effect = match (&queued.original, &words, c.source) {
            (Some(original), Some(words), crate::saga::model::CorrectionSource::Step) => format!(
                "{}{}: done, and it cannot be undone",
                words.sentence,
                reference(original)
            ),
            (Some(original), Some(words), crate::saga::model::CorrectionSource::Compensation) => {
                format!(
                    "{}{}: taken back after {} saw it",
                    words.sentence,
                    reference(original),
                    audience_heading(c.audience.as_str()).to_lowercase()
                )
            }
            _ => "the step is missing from the log".into(),
        };
        items.push(InboxItem {
            id: c.id,
            run_id: c.run_id.to_string(),
            run_title: queued.run_title,
            step_idx: c.step_idx,
            tool: c.tool.clone(),
            audience: c.audience.as_str().to_owned(),
            status: c.status,
            send_status: c.send_status,
            effect,
            effect_args: words.map(|w| w.exact).unwrap_or_default(),
            recipients: c.recipients.clone(),
            message: c.message.clone(),
            key: c.idempotency_key.clone(),
            age: super::ssr::age(now - c.created_at),
            subject: email_subject(&state.registry, &c.tool, c.audience),
            why: reasons.get(&c.run_id).map(|event| {
                let why = super::run::ssr::unwind_why_of(event);
                format!("{} ({}, {})", why.reason, why.by, why.at)
            }),
        });
    }
    Ok(Inbox {
        items,
        may_decide: user.role.can_decide(),
    })
}

/// The subject a correction sent by email goes out with: the mail
/// connector's `subject` (corrections carry none of their own).
#[cfg(feature = "ssr")]
fn email_subject(
    registry: &crate::saga::registry::Registry,
    tool: &str,
    audience: crate::saga::class::Audience,
) -> Option<String> {
    let channel = registry.get(tool)?.correction_channel(audience)?;
    let connector = channel.split('.').next()?;
    if connector != "smtp" {
        return None;
    }
    Some(
        registry
            .connector_settings()
            .get(connector)
            .and_then(|settings| settings.get("subject"))
            .and_then(|subject| subject.as_str())
            .map_or_else(|| "(none)".to_owned(), str::to_owned),
    )
}

#[server(endpoint = "send_correction")]
pub async fn send_correction(id: i64, message: String) -> Result<(), ServerFnError> {
    let person = super::ssr::deciding_person().await?;
    let state = super::ssr::app_state()?;
    let message = message.replace("\r\n", "\n");
    if message.trim().is_empty() {
        super::ssr::back_to::<String, String>(
            "/corrections",
            Err("The message cannot be empty.".into()),
        )
        .await;
        return Ok(());
    }
    if let Some(why) = super::ssr::unstorable(&message) {
        super::ssr::back_to::<String, String>("/corrections", Err(why.into())).await;
        return Ok(());
    }
    let done = state
        .engine
        .send_correction(id, Some(message.trim()), &person)
        .await;
    super::ssr::back_to(
        "/corrections",
        done.map(|c| match c.send_status {
            Some(crate::saga::status::StepStatus::Confirmed) => {
                format!("Correction #{id} sent to {}.", c.recipients.join(", "))
            }
            Some(other) => format!(
                "Correction #{id} signed off; its send is {}.",
                other.in_words()
            ),
            None => format!("Correction #{id} is {}.", c.status.in_words()),
        }),
    )
    .await;
    Ok(())
}

#[server(endpoint = "dismiss_correction")]
pub async fn dismiss_correction(id: i64, reason: String) -> Result<(), ServerFnError> {
    let person = super::ssr::deciding_person().await?;
    let state = super::ssr::app_state()?;
    if reason.trim().is_empty() {
        super::ssr::back_to::<String, String>(
            "/corrections",
            Err("Say why the correction is dismissed.".into()),
        )
        .await;
        return Ok(());
    }
    if let Some(why) = super::ssr::unstorable(&reason) {
        super::ssr::back_to::<String, String>("/corrections", Err(why.into())).await;
        return Ok(());
    }
    let done = state
        .store
        .move_correction(
            id,
            CorrectionStatus::Pending,
            CorrectionStatus::Dismissed,
            Some(reason.trim()),
            &person,
        )
        .await;
    super::ssr::back_to(
        "/corrections",
        done.map(|_| format!("Correction #{id} dismissed: {}", reason.trim())),
    )
    .await;
    Ok(())
}

#[server(endpoint = "answer_correction_send")]
pub async fn answer_correction_send(id: i64, went_out: String) -> Result<(), ServerFnError> {
    let person = super::ssr::deciding_person().await?;
    let state = super::ssr::app_state()?;
    let yes = super::ssr::choice("went_out", &went_out, "yes", "no")?;
    let done = state.engine.answer_correction(id, yes, &person).await;
    super::ssr::back_to(
        "/corrections",
        done.map(|_| {
            if yes {
                format!("Recorded: correction #{id} went out.")
            } else {
                format!("Recorded: correction #{id} did not go out. Send it again when ready; it keeps its key.")
            }
        }),
    ).await;
    Ok(())
}
