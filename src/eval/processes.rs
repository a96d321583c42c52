//! The two kinds of process a scenario starts: the harness (this binary's
//! `serve`, killed and started again on the same database when the
//! scenario says) and the agent under test (a shell command in its own
//! process group, killed as a group at its time limit).

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// How a harness of this scenario is started.
#[derive(Clone)]
pub struct HarnessLaunch {
    pub port: u16,
    pub database_url: String,
    pub tools: PathBuf,
    pub log: PathBuf,
}

impl HarnessLaunch {
    pub fn site(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts `saga-harness serve` and waits until it is ready; with
    /// `crash_at_call`, it kills itself while its Nth call with an effect
    /// is in flight (the call went out, its answer is not written).
    pub async fn start(&self, crash_at_call: Option<u32>) -> anyhow::Result<Child> {
        let exe = std::env::current_exe().context("finding this binary to serve the harness")?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let mut command = Command::new(exe);
        command
            .arg("serve")
            .arg("--bind")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--database-url")
            .arg(&self.database_url)
            .arg("--tools")
            .arg(&self.tools)
            .arg("--public-url")
            .arg(self.site())
            .env_remove(crate::saga::failpoint::VARIABLE)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        if let Some(nth) = crash_at_call {
            command.env(
                crate::saga::failpoint::VARIABLE,
                format!("dispatch.before_outcome:{nth}"),
            );
        }
        let mut child = command.spawn().context("starting the harness")?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "the harness exited during start-up ({status}); its log is {}",
                    self.log.display()
                );
            }
            if let Ok(response) = http.get(format!("{}/readyz", self.site())).send().await {
                if response.status().is_success() {
                    return Ok(child);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "the harness was not ready within 60 s; its log is {}",
            self.log.display()
        )
    }
}

/// A free loopback port, for a harness that must come back on the same
/// address after a restart.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// How the agent's process ended.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AgentEnd {
    /// "exit 0", "exit 2", "killed at the time limit (90 s)", "did not start: …".
    pub how: String,
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    /// Processes of its group still running after it exited (killed then).
    pub left_behind: bool,
    pub seconds: f64,
}

/// Runs the agent command through the shell, in a process group of its
/// own, with `env` added; kills the whole group at `limit`, and any of its
/// children still running once it has exited.
pub async fn run_agent(
    command: &str,
    env: &[(&str, String)],
    limit: Duration,
    out: &Path,
    err: &Path,
) -> AgentEnd {
    let started = Instant::now();
    let spawned = (|| -> std::io::Result<Child> {
        let mut shell = Command::new("sh");
        shell
            .arg("-c")
            .arg(command)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(out)?)
            .stderr(std::fs::File::create(err)?)
            .process_group(0)
            .kill_on_drop(true);
        for (name, value) in env {
            shell.env(name, value);
        }
        shell.spawn()
    })();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            return AgentEnd {
                how: format!("did not start: {e}"),
                exit_code: None,
                timed_out: false,
                left_behind: false,
                seconds: started.elapsed().as_secs_f64(),
            }
        }
    };
    let group = child.id().map(|pid| pid as i32);
    let waited = tokio::time::timeout(limit, child.wait()).await;
    let seconds = started.elapsed().as_secs_f64();
    match waited {
        Ok(status) => {
            let code = status.ok().and_then(|s| s.code());
            // The shell is gone; anything still in its group was left behind.
            let left_behind = group.is_some_and(group_alive);
            if let Some(group) = group {
                kill_group(group);
            }
            AgentEnd {
                how: match code {
                    Some(code) => format!("exit {code}"),
                    None => "ended by a signal".into(),
                },
                exit_code: code,
                timed_out: false,
                left_behind,
                seconds,
            }
        }
        Err(_) => {
            if let Some(group) = group {
                kill_group(group);
            }
            let _ = child.wait().await;
            AgentEnd {
                how: format!("killed at the time limit ({} s)", limit.as_secs()),
                exit_code: None,
                timed_out: true,
                left_behind: false,
                seconds,
            }
        }
    }
}

/// Whether any process of the group is still running.
fn group_alive(group: i32) -> bool {
    std::process::Command::new("kill")
        .args(["-0", "--", &format!("-{group}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn kill_group(group: i32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{group}")])
        .stderr(Stdio::null())
        .status();
}
