//! The leader lease (one row): acquired, renewed and resigned with a
//! growing epoch, so a replica that lost it is fenced out of every write.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::persistence::{Fence, Persistence, PersistenceError, db_err};

/// Leadership among scheduler replicas: a lease in Postgres with an expiry
/// the leader renews, taken over by a standby once it lapses, and an epoch
/// that grows with every new term (table `leader_lease`). The database's
/// clock decides expiry. This process also keeps a deadline on its own
/// monotonic clock, taken *before* each renewal is sent, so it stops acting
/// as the leader no later than the database stops believing it is — a
/// process frozen past its lease (SIGSTOP, a long GC-like stall, a VM
/// pause) finds its deadline passed the moment it runs again.
pub struct LeaderLease {
    pool: PgPool,
    holder: Arc<str>,
    ttl: Duration,
    /// (epoch, local deadline) while this process holds the lease.
    held: std::sync::Mutex<Option<(i64, std::time::Instant)>>,
}

impl LeaderLease {
    /// `holder` names this replica (unique among the replicas; a restarted
    /// process of the same replica takes its lease over); `ttl` is how long
    /// a renewal lasts.
    pub fn new(p: &Persistence, holder: String, ttl: Duration) -> Self {
        Self {
            pool: p.pool.clone(),
            holder: holder.into(),
            ttl,
            held: std::sync::Mutex::new(None),
        }
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    fn held(&self) -> Option<(i64, std::time::Instant)> {
        *self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_held(&self, v: Option<(i64, std::time::Instant)>) {
        *self.held.lock().unwrap_or_else(|p| p.into_inner()) = v;
    }

    /// Renews the lease this process holds, or takes it when it lapsed or
    /// when this process, new, finds it held under its replica's name by an
    /// earlier process (a replica restarted after a crash leads again at
    /// once instead of waiting for its old lease; a process that held a term
    /// and lost it never takes it back this way). Taking it starts a new term: the epoch grows, also for
    /// this process when its own lease lapsed before it renewed, so nothing
    /// an earlier term started can commit. Returns the epoch while this
    /// process leads, None while another does. A database error keeps the
    /// local deadline: leadership then ends when it passes.
    pub async fn refresh(&self) -> Result<Option<i64>, PersistenceError> {
        let mine = self.held().map_or(-1, |(e, _)| e);
        let sent = std::time::Instant::now();
        let got: Option<i64> = sqlx::query_scalar(
            "UPDATE leader_lease SET
                epoch = CASE WHEN holder = $1 AND epoch = $2 AND expires_at > clock_timestamp()
                             THEN epoch ELSE epoch + 1 END,
                holder = $1,
                expires_at = clock_timestamp() + make_interval(secs => $3)
             WHERE (holder = $1 AND epoch = $2 AND expires_at > clock_timestamp())
                OR expires_at <= clock_timestamp()
                OR (holder = $1 AND $2 = -1)
             RETURNING epoch",
        )
        .bind(&*self.holder)
        .bind(mine)
        .bind(self.ttl.as_secs_f64())
        .fetch_optional(&self.pool)
        .await
        .map_err(db_err("leader_lease"))?;
        self.set_held(got.map(|e| (e, sent + self.ttl)));
        Ok(got)
    }

    /// The fence of this process's term, while its deadline has not passed.
    pub fn fence(&self) -> Option<Fence> {
        let (epoch, deadline) = self.held()?;
        (std::time::Instant::now() < deadline).then(|| Fence {
            holder: self.holder.clone(),
            epoch,
        })
    }

    /// Gives the lease up at once (a graceful shutdown), so a standby takes
    /// over without waiting for it to expire.
    pub async fn resign(&self) {
        let Some((epoch, _)) = self.held() else {
            return;
        };
        self.set_held(None);
        let _ = sqlx::query(
            "UPDATE leader_lease SET expires_at = clock_timestamp() WHERE holder = $1 AND epoch = $2",
        )
        .bind(&*self.holder)
        .bind(epoch)
        .execute(&self.pool)
        .await;
    }
}
