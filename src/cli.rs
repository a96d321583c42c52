//! The command-line entry: parse, run one command, turn failures into a
//! message and an exit code. `anyhow` lives here and nowhere deeper.

use crate::auth;
use crate::config::{Cli, Command, DatabaseArgs, TokenCommand, UserCommand};
use crate::saga::class::Role;
use crate::server::Application;

use crate::store;
use anyhow::{bail, Context};
use clap::Parser;
use std::io::{BufRead, IsTerminal};
use std::process::ExitCode;

pub async fn main() -> ExitCode {
    let cli = Cli::parse();
    #[cfg(feature = "bench")]
    let quiet = if matches!(cli.command, Command::Bench(_)) {
        crate::ops::logging::BENCH_FILTER
    } else {
        crate::ops::logging::DEFAULT_FILTER
    };
    #[cfg(not(feature = "bench"))]
    let quiet = crate::ops::logging::DEFAULT_FILTER;
    let export = match crate::ops::logging::init(cli.log_format, quiet, cli.otlp_endpoint.as_ref())
    {
        Ok(export) => export,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    let code = match run(cli.command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", message(&err));
            ExitCode::FAILURE
        }
    };
    if let Some(export) = export {
        export.finish();
    }
    code
}

/// The error and its causes on one line, each said once: many errors
/// already quote their cause, and `{:#}` would print it a second time.
fn message(err: &anyhow::Error) -> String {
    let mut message = err.to_string();
    for cause in err.chain().skip(1) {
        let cause = cause.to_string();
        if !message.contains(&cause) {
            message.push_str(": ");
            message.push_str(&cause);
        }
    }
    message
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(args) => {
            let app = Application::build(args).await?;
            eprintln!("saga-harness listening on http://{}", app.local_addr());
            app.serve_until_signal().await
        }
        Command::Migrate(database) => {
            open(&database).await?;
            eprintln!(
                "migrations applied to {}",
                store::redact(&database.database_url)
            );
            Ok(())
        }
        Command::User(UserCommand::Add {
            username,
            role,
            password_stdin,
            database,
        }) => {
            let role: Role = role.parse()?;
            let username = username.trim().to_owned();
            if username.is_empty() {
                bail!("--username cannot be empty");
            }
            let password = read_password(password_stdin)?;
            let hash = auth::hash_password(&password)?;
            let opened = open(&database).await?;
            let user = opened.saga_store().add_user(&username, &hash, role).await?;
            eprintln!("added {} ({})", user.username, user.role);
            Ok(())
        }
        Command::User(UserCommand::Remove { username, database }) => {
            let opened = open(&database).await?;
            let user = opened.saga_store().remove_user(username.trim()).await?;
            eprintln!("removed {} ({})", user.username, user.role);
            Ok(())
        }
        Command::User(UserCommand::Role {
            username,
            role,
            database,
        }) => {
            let role: Role = role.parse()?;
            let opened = open(&database).await?;
            let user = opened.saga_store().set_role(username.trim(), role).await?;
            eprintln!("{} is now {}", user.username, user.role);
            Ok(())
        }
        Command::User(UserCommand::Group {
            change,
            username,
            group,
            database,
        }) => {
            let group = group.trim();
            if group.is_empty() || group.contains(char::is_whitespace) {
                bail!("{group:?} is not a group name: one word, like billing-leads");
            }
            let opened = open(&database).await?;
            let user = opened
                .saga_store()
                .set_group(username.trim(), group, change == "add")
                .await?;
            eprintln!(
                "{} is in: {}",
                user.username,
                if user.groups.is_empty() {
                    "no group".to_owned()
                } else {
                    user.groups.join(", ")
                }
            );
            Ok(())
        }
        Command::Token(TokenCommand::Revoke { agent, database }) => {
            let opened = open(&database).await?;
            let revoked = opened.saga_store().revoke_tokens(agent.trim()).await?;
            if revoked == 0 {
                bail!("agent {} has no live token", agent.trim());
            }
            eprintln!("revoked {revoked} token(s) of agent {}", agent.trim());
            Ok(())
        }
        Command::Token(TokenCommand::Create {
            agent,
            label,
            database,
        }) => {
            let agent = agent.trim().to_owned();
            if agent.is_empty() {
                bail!("--agent cannot be empty");
            }
            let token = auth::new_api_token();
            let opened = open(&database).await?;
            opened
                .saga_store()
                .add_api_token(&agent, &auth::token_hash(&token), label.as_deref())
                .await?;
            eprintln!("token for agent {agent} (shown once; only its hash is stored):");
            println!("{token}");
            Ok(())
        }
        Command::Doctor(args) => {
            let report = crate::ops::doctor::examine(
                args.tools.as_deref(),
                &args.database.database_url,
                &args.sign_in,
            )
            .await;
            print!("{}", report.text());
            match report.fixes() {
                0 => Ok(()),
                n => bail!("{n} thing(s) to fix, listed above"),
            }
        }
        #[cfg(feature = "simulators")]
        Command::Demo(args) => crate::demo::run(args).await,
        #[cfg(feature = "simulators")]
        Command::Eval(args) => crate::eval::run(args).await,
        Command::Prune(args) => {
            let opened = open(&args.database).await?;
            let store = opened.saga_store();
            let pass = crate::ops::retention::prune(
                &*store,
                chrono::Utc::now(),
                args.older_than,
                args.archive.as_deref(),
                args.dry_run,
                args.share,
                |so_far| {
                    eprintln!(
                        "… {} runs looked at, {} {}",
                        so_far.looked_at,
                        so_far.pruned,
                        if args.dry_run { "to prune" } else { "pruned" }
                    )
                },
            )
            .await?;
            eprintln!("{}", pass.summary(args.dry_run));
            if let (Some(archive), false) = (&args.archive, args.dry_run) {
                eprintln!("archived to {}", archive.display());
            }
            Ok(())
        }
        #[cfg(feature = "bench")]
        Command::Bench(args) => crate::bench::run(args).await,
        #[cfg(feature = "simulators")]
        Command::Sim(args) => {
            let sims = crate::sim::bundle::Simulators::start(args.ip, args.first_port).await?;
            for (name, url) in sims.addresses() {
                println!("{name:<10} {url}");
            }
            eprintln!("each HTTP simulator serves GET /_sim/ledger and POST /_sim/faults; Ctrl-C stops them");
            tokio::signal::ctrl_c().await?;
            Ok(())
        }
    }
}

async fn open(database: &DatabaseArgs) -> anyhow::Result<store::Opened> {
    store::open_with(&database.database_url, &database.store)
        .await
        .with_context(|| format!("opening {}", store::redact(&database.database_url)))
}

fn read_password(from_stdin: bool) -> anyhow::Result<String> {
    let password = if from_stdin || !std::io::stdin().is_terminal() {
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut line)
            .context("reading the password from standard input")?;
        line.trim_end_matches(['\r', '\n']).to_owned()
    } else {
        let first = rpassword::prompt_password("password: ").context("reading the password")?;
        let again = rpassword::prompt_password("again: ").context("reading the password")?;
        if first != again {
            bail!("the two passwords differ");
        }
        first
    };
    Ok(password)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_already_quoted_is_not_repeated() {
        let quoted = std::io::Error::other("disk on fire");
        let err = anyhow::Error::new(quoted).context("reading the tools file: disk on fire");
        assert_eq!(message(&err), "reading the tools file: disk on fire");
        let err = anyhow::anyhow!("no such table").context("opening the log");
        assert_eq!(message(&err), "opening the log: no such table");
    }
}
