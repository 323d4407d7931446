//! Jobs over several nodes: torchrun's variables, rank 0's rendezvous and
//! the other ranks following it.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use fmsched_core::trainer::{Report, env};
use tokio::io::AsyncWriteExt;

use crate::report::Reporter;
use crate::var;

/// This process's place in a job over several nodes (torchrun's
/// variables, docs/trainer-contract.md).
pub(crate) struct GangEnv {
    pub(crate) nnodes: u32,
    pub(crate) node_rank: u32,
    pub(crate) master: String,
    pub(crate) timeout: Duration,
}

impl GangEnv {
    pub(crate) fn from_env() -> anyhow::Result<Option<GangEnv>> {
        let nnodes: u32 = var(env::NNODES).and_then(|n| n.parse().ok()).unwrap_or(1);
        if nnodes <= 1 {
            return Ok(None);
        }
        let node_rank: u32 = var(env::NODE_RANK)
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("{} > 1 but {} is not set", env::NNODES, env::NODE_RANK))?;
        let addr = var(env::MASTER_ADDR)
            .with_context(|| format!("{} > 1 but {} is not set", env::NNODES, env::MASTER_ADDR))?;
        let port = var(env::MASTER_PORT)
            .with_context(|| format!("{} > 1 but {} is not set", env::NNODES, env::MASTER_PORT))?;
        let timeout = Duration::from_secs_f64(
            var("FMSCHED_FAKE_RENDEZVOUS_TIMEOUT_S")
                .and_then(|t| t.parse().ok())
                .unwrap_or(60.0),
        );
        Ok(Some(GangEnv {
            nnodes,
            node_rank,
            master: format!("{addr}:{port}"),
            timeout,
        }))
    }
}

/// Rank 0's side of the rendezvous: listens at the master address and
/// waits for every other node's process. Returns their write halves and a
/// channel that names a node whose process went away.
pub(crate) async fn lead_rendezvous(
    g: &GangEnv,
) -> anyhow::Result<(
    Vec<tokio::net::tcp::OwnedWriteHalf>,
    tokio::sync::mpsc::UnboundedReceiver<u32>,
)> {
    use tokio::io::AsyncBufReadExt;
    let port = g.master.rsplit_once(':').map_or("", |p| p.1);
    let deadline = Instant::now() + g.timeout;
    // The port may still be held by this job's previous rank 0 for a moment.
    let listener = loop {
        match tokio::net::TcpListener::bind(format!("0.0.0.0:{port}")).await {
            Ok(l) => break l,
            Err(e) if Instant::now() < deadline => {
                eprintln!("fake-trainer: rendezvous: binding port {port}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => bail!("rendezvous: cannot listen on port {port}: {e}"),
        }
    };
    let (lost_tx, lost_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut followers = Vec::new();
    while followers.len() + 1 < g.nnodes as usize {
        let accepted = tokio::time::timeout_at(deadline.into(), listener.accept()).await;
        let Ok(Ok((stream, peer))) = accepted else {
            eprintln!(
                "fake-trainer: rendezvous at {} timed out after {:?}: {} of {} nodes joined",
                g.master,
                g.timeout,
                followers.len() + 1,
                g.nnodes
            );
            std::process::exit(4);
        };
        let (read, write) = stream.into_split();
        let mut lines = tokio::io::BufReader::new(read).lines();
        let node = match lines.next_line().await {
            Ok(Some(l)) => l.strip_prefix("hello ").and_then(|n| n.parse::<u32>().ok()),
            _ => None,
        };
        let Some(node) = node else {
            eprintln!("fake-trainer: rendezvous: {peer} did not say hello; ignored");
            continue;
        };
        eprintln!("fake-trainer: rendezvous: node {node} joined from {peer}");
        followers.push(write);
        let lost = lost_tx.clone();
        tokio::spawn(async move {
            while let Ok(Some(_)) = lines.next_line().await {}
            let _ = lost.send(node);
        });
    }
    eprintln!(
        "fake-trainer: rendezvous at {} complete: {} nodes",
        g.master, g.nnodes
    );
    Ok((followers, lost_rx))
}

/// A non-zero node's process: joins rank 0's rendezvous, then follows it
/// (see the module docs). Never returns.
pub(crate) async fn follow(
    g: &GangEnv,
    reporter: &mut Reporter,
    usr2: &mut tokio::signal::unix::Signal,
    term: &mut tokio::signal::unix::Signal,
) -> ! {
    use tokio::io::AsyncBufReadExt;
    let deadline = Instant::now() + g.timeout;
    eprintln!(
        "fake-trainer: node {} of {}: joining rank 0 at {}",
        g.node_rank, g.nnodes, g.master
    );
    let stream = loop {
        match tokio::net::TcpStream::connect(&g.master).await {
            Ok(s) => break s,
            // Rank 0 may not listen yet (its loader is still starting).
            // Stopped meanwhile, it goes at once (it trained nothing).
            Err(_) if Instant::now() < deadline => {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(10)) => {}
                    // Not joined: no checkpoint of rank 0's to report yet
                    // (consumed, so it is not taken for a later request).
                    _ = usr2.recv() => {}
                    _ = term.recv() => {
                        eprintln!("fake-trainer: stopped before joining rank 0 at {}", g.master);
                        std::process::exit(0);
                    }
                }
            }
            Err(e) => {
                eprintln!(
                    "fake-trainer: rendezvous at {} timed out after {:?}: {e}",
                    g.master, g.timeout
                );
                std::process::exit(4);
            }
        }
    };
    let (read, mut write) = stream.into_split();
    if write
        .write_all(format!("hello {}\n", g.node_rank).as_bytes())
        .await
        .is_err()
    {
        eprintln!("fake-trainer: rendezvous at {}: rank 0 went away", g.master);
        std::process::exit(5);
    }
    eprintln!(
        "fake-trainer: node {} of {} joined rank 0 at {}",
        g.node_rank, g.nnodes, g.master
    );
    let mut lines = tokio::io::BufReader::new(read).lines();
    let mut asked = false;
    loop {
        tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(l)) if l == "done" => {
                    eprintln!("fake-trainer: rank 0 finished the job");
                    std::process::exit(0);
                }
                Ok(Some(l)) => {
                    // "ckpt <iteration> <path>": reported when asked for one.
                    let mut it = l.splitn(3, ' ');
                    if let (Some("ckpt"), Some(i), Some(path)) = (it.next(), it.next(), it.next())
                        && asked
                    {
                        asked = false;
                        reporter.send(&Report::Checkpoint {
                            path: path.to_string(),
                            iteration: i.parse().unwrap_or(0),
                        }).await;
                    }
                }
                _ => {
                    eprintln!("fake-trainer: rank 0 at {} went away; exiting", g.master);
                    std::process::exit(5);
                }
            },
            _ = usr2.recv() => asked = true,
            _ = term.recv() => {
                eprintln!("fake-trainer: stopped (rank 0 writes the checkpoint)");
                std::process::exit(0);
            }
        }
    }
}
