//! Which scheduler replica leads, and the fence its writes carry.
//!
//! Leadership is a lease in Postgres (`persistence::LeaderLease`): the
//! leader renews it every `leader_refresh`, a standby takes it over once it
//! lapses (`leader_lease` after the last renewal), and every new term has a
//! larger epoch. A replica acts as the leader only while
//! - its lease is valid by its own monotonic clock (so a process frozen
//!   past its lease stops the moment it runs again, before it could renew),
//!   and
//! - it has taken over the cluster for that term (learned the nodes
//!   registered through the previous leader).
//!
//! Every leader-only write is fenced by the term's [`Fence`] in its own
//! transaction; the epoch travels in every plan and acknowledgement an
//! agent receives. Owns: the lease and the term. Does not own: agent
//! sessions (the registry) — it only tells the registry to drop them when
//! the term ends, so agents reconnect to the new leader.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use chrono::Utc;

use crate::persistence::{Fence, LeaderLease, Persistence};
use crate::registry::NodeRegistry;

pub struct Leadership {
    lease: LeaderLease,
    /// Epoch of the term this replica has taken over (0: none).
    term: AtomicI64,
}

impl Leadership {
    pub fn new(lease: LeaderLease) -> Self {
        Self {
            lease,
            term: AtomicI64::new(0),
        }
    }

    /// The fence of the current term, while this replica leads.
    pub fn fence(&self) -> Option<Fence> {
        let f = self.lease.fence()?;
        (self.term.load(Ordering::SeqCst) == f.epoch).then_some(f)
    }

    pub fn is_leader(&self) -> bool {
        self.fence().is_some()
    }

    /// The epoch of the term this replica leads (0 when it does not).
    pub fn epoch(&self) -> i64 {
        self.fence().map_or(0, |f| f.epoch)
    }

    pub fn holder(&self) -> &str {
        self.lease.holder()
    }

    /// One refresh: renews or takes the lease; a new term takes over the
    /// cluster first (the nodes registered through the previous leader get
    /// a fresh grace period), a term that ended drops every agent session.
    /// Returns whether this replica leads afterwards.
    pub async fn refresh(&self, persistence: &Persistence, registry: &NodeRegistry) -> bool {
        let held = self.term.load(Ordering::SeqCst);
        let epoch = match self.lease.refresh().await {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "leader lease not renewed");
                // The local deadline decides until the database answers.
                self.lease.fence().map(|f| f.epoch)
            }
        };
        match epoch {
            Some(e) if e == held => true,
            Some(e) => {
                if held != 0 {
                    self.lost(registry, held);
                }
                match persistence.list_nodes().await {
                    Ok(records) => registry.take_over(records, Utc::now()),
                    Err(err) => {
                        tracing::warn!(error = %err, "cannot load nodes; taking over later");
                        return false;
                    }
                }
                self.term.store(e, Ordering::SeqCst);
                tracing::warn!(epoch = e, holder = %self.holder(), "this replica is now the active scheduler");
                true
            }
            None => {
                if held != 0 {
                    self.lost(registry, held);
                }
                false
            }
        }
    }

    fn lost(&self, registry: &NodeRegistry, epoch: i64) {
        self.term.store(0, Ordering::SeqCst);
        let dropped = registry.close_all();
        tracing::error!(
            epoch,
            sessions = dropped,
            "lost the leader lease; standing by (agent sessions closed)"
        );
    }

    /// Gives the lease up (graceful shutdown).
    pub async fn resign(&self) {
        self.term.store(0, Ordering::SeqCst);
        self.lease.resign().await;
    }
}

/// Keeps refreshing leadership every `every` until aborted.
pub async fn run(
    leadership: Arc<Leadership>,
    persistence: Persistence,
    registry: Arc<NodeRegistry>,
    every: std::time::Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        leadership.refresh(&persistence, &registry).await;
    }
}
