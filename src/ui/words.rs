//! One call as a lead reads it, the same on every page that asks a person
//! to decide: the sentence, its badges (class, audience, reach, gated), the
//! way back in words, a warning when the arguments hide characters, and the
//! exact arguments one click away.

use crate::saga::words::CallInWords;
use leptos::prelude::*;

/// The call's sentence and badges, the way back and the disclosure with
/// the exact arguments. `key` is shown in the disclosure when known.
#[component]
pub fn CallWords(words: CallInWords, #[prop(optional)] key: Option<String>) -> impl IntoView {
    let audience = words.audience.as_str();
    view! {
        <div class="call">
            <p class="sentence">{words.sentence.clone()}</p>
            <p class="call-head">
                <code class="tool">{words.tool.clone()}</code>
                <span class="badge">{words.class.as_str()}</span>
                <span class=format!("badge audience-{audience}")>{audience}</span>
                {words.reach.clone().map(|reach| view! { <span class="badge reach">"reaches " {reach}</span> })}
                {words.gated.then(|| view! { <span class="badge gated">"gated"</span> })}
            </p>
            {words.hidden_characters.then(|| view! {
                <p class="bad hidden-characters" role="alert">
                    "Hidden or control characters in this call: they are shown as \\u{…} below. Check them before deciding."
                </p>
            })}
            <p class="way-back">{words.if_undone.clone()}</p>
            <details class="exact">
                <summary>"Exact arguments"</summary>
                <pre class="args">{words.exact.clone()}</pre>
                {key.map(|key| view! { <p class="muted">"Key " <code>{key}</code></p> })}
            </details>
        </div>
    }
}
