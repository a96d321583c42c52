//! Failpoints: named places in the engine where a test can make the process
//! die at once, as a power cut or `kill -9` would, to prove that the saga
//! log brings every run back without doubling or losing an effect.
//!
//! Inert unless `SAGA_FAILPOINT=NAME[:NTH][:stop]` is set when the process
//! starts: then the NTH time (1 by default) execution reaches the failpoint
//! `NAME`, the process aborts — no destructors, no flush, no graceful
//! shutdown. With `:stop` it freezes instead (it sends itself SIGSTOP, as
//! a long GC pause, a VM migration or a debugger would) and carries on
//! from there when the test continues it. Nothing else reads the variable;
//! an operator never sets it.
//!
//! The names, in the order a call meets them:
//! - `dispatch.before_intent`: a new step is about to commit its INTENDED row;
//! - `dispatch.before_call`: the INTENDED row is on disk, nothing is sent;
//! - `dispatch.before_outcome`: the call came back, its outcome is not written;
//! - `unwind.before_compensation_intent`: a compensation row is about to be written;
//! - `unwind.before_compensation_call`: the compensation row is on disk, not sent;
//! - `unwind.before_compensation_outcome`: the compensation came back, not written;
//! - `pivot.after_approval`: the approval is committed, no commit step has run;
//! - `pivot.between_commit_steps`: a commit step is confirmed, the next not begun;
//! - `correction.before_outcome`: a correction went out, its outcome is not written.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

/// The environment variable that arms one failpoint.
pub const VARIABLE: &str = "SAGA_FAILPOINT";

/// Every failpoint the engine has, so a test (or a typo) can be checked.
pub const NAMES: &[&str] = &[
    "dispatch.before_intent",
    "dispatch.before_call",
    "dispatch.before_outcome",
    "unwind.before_compensation_intent",
    "unwind.before_compensation_call",
    "unwind.before_compensation_outcome",
    "pivot.after_approval",
    "pivot.between_commit_steps",
    "correction.before_outcome",
];

struct Armed {
    name: String,
    nth: u64,
    action: Action,
    hits: AtomicU64,
}

/// What an armed failpoint does when it fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Abort,
    Stop,
}

static ARMED: LazyLock<Option<Armed>> = LazyLock::new(|| {
    let spec = std::env::var(VARIABLE).ok()?;
    let (name, nth, action) = parse(&spec)?;
    Some(Armed {
        name,
        nth,
        action,
        hits: AtomicU64::new(0),
    })
});

/// `NAME`, `NAME:NTH` (NTH ≥ 1), each optionally followed by `:stop`;
/// anything else arms nothing.
fn parse(spec: &str) -> Option<(String, u64, Action)> {
    let spec = spec.trim();
    let (spec, action) = match spec.strip_suffix(":stop") {
        Some(rest) => (rest, Action::Stop),
        None => (spec, Action::Abort),
    };
    let (name, nth) = match spec.split_once(':') {
        Some((name, nth)) => (name, nth.trim().parse().ok().filter(|n| *n >= 1)?),
        None => (spec, 1),
    };
    NAMES
        .contains(&name)
        .then(|| (name.to_owned(), nth, action))
}

/// Execution reached failpoint `name`: dies here if it is the armed one
/// and this is its NTH hit; otherwise does nothing.
pub fn hit(name: &'static str) {
    let Some(armed) = ARMED.as_ref() else {
        return;
    };
    if armed.name != name {
        return;
    }
    let count = armed.hits.fetch_add(1, Ordering::SeqCst) + 1;
    if count != armed.nth {
        return;
    }
    match armed.action {
        Action::Abort => {
            // stderr is unbuffered: the line is out before the process is gone.
            eprintln!("failpoint {name} fired on hit {count}: aborting");
            std::process::abort();
        }
        Action::Stop => {
            eprintln!("failpoint {name} fired on hit {count}: stopping");
            // The whole process stops (every thread) until SIGCONT.
            let stopped = std::process::Command::new("kill")
                .args(["-STOP", &std::process::id().to_string()])
                .status();
            eprintln!("failpoint {name}: continued ({stopped:?})");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failpoint_is_named_and_optionally_counted() {
        assert_eq!(
            parse("dispatch.before_call"),
            Some(("dispatch.before_call".into(), 1, Action::Abort))
        );
        assert_eq!(
            parse("pivot.between_commit_steps:3"),
            Some(("pivot.between_commit_steps".into(), 3, Action::Abort))
        );
        assert_eq!(
            parse("dispatch.before_call:2:stop"),
            Some(("dispatch.before_call".into(), 2, Action::Stop))
        );
    }

    #[test]
    fn unknown_names_and_bad_counts_arm_nothing() {
        assert_eq!(parse("dispatch.before_lunch"), None);
        assert_eq!(parse("dispatch.before_call:0"), None);
        assert_eq!(parse("dispatch.before_call:x"), None);
        assert_eq!(parse(""), None);
    }

    #[test]
    fn an_unarmed_process_passes_every_failpoint() {
        // The test binary never sets the variable.
        for name in NAMES {
            hit(name);
        }
    }
}
