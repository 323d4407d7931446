//! The trainer contract's side channels: reports on the agent's socket,
//! files written atomically, and the lease end in the control file.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context;
use fmsched_core::trainer::{Control, Report, env};
use tokio::io::AsyncWriteExt;

use crate::var;

/// Writes report lines to the socket (or standard output without one).
pub(crate) enum Reporter {
    Socket(tokio::net::UnixStream),
    Stdout,
}

impl Reporter {
    pub(crate) async fn send(&mut self, r: &Report) {
        let line = r.to_line();
        match self {
            Reporter::Socket(s) => {
                if s.write_all(line.as_bytes()).await.is_err() {
                    eprintln!("fake-trainer: report socket closed; reporting on stdout");
                    *self = Reporter::Stdout;
                    print!("{line}");
                }
            }
            Reporter::Stdout => {
                print!("{line}");
                let _ = std::io::stdout().flush();
            }
        }
    }
}

pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// The lease end in the control file, re-read when the file changes: due
/// once per lease end, when it is at most `ahead` seconds away.
#[derive(Default)]
pub(crate) struct LeaseWatch {
    pub(crate) seen: Option<std::time::SystemTime>,
    pub(crate) end: Option<f64>,
    pub(crate) done_for: Option<f64>,
}

impl LeaseWatch {
    /// Seconds left when a checkpoint is due now.
    pub(crate) fn due(&mut self, control: Option<&std::path::Path>, ahead: f64) -> Option<f64> {
        let path = control?;
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        if modified.is_some() && modified != self.seen {
            self.seen = modified;
            self.end = std::fs::read_to_string(path)
                .ok()
                .and_then(|t| serde_json::from_str::<Control>(&t).ok())
                .and_then(|c| c.lease_end);
        }
        let end = self.end.filter(|&e| Some(e) != self.done_for)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_secs_f64();
        let left = end - now;
        (left <= ahead).then(|| {
            self.done_for = Some(end);
            left
        })
    }
}

/// The report socket (standard output without one).
pub(crate) async fn connect_reporter() -> Reporter {
    match var(env::REPORT_SOCKET) {
        Some(p) => match tokio::net::UnixStream::connect(&p).await {
            Ok(s) => Reporter::Socket(s),
            Err(e) => {
                eprintln!("fake-trainer: cannot connect {p}: {e}; reporting on stdout");
                Reporter::Stdout
            }
        },
        None => Reporter::Stdout,
    }
}
