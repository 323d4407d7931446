//! The node registry: registrations with their GPUs and node tokens'
//! hashes, liveness states, and node events.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use fmsched_core::{GpuUuid, NodeId, NodeState};

use crate::persistence::{
    ErrorClass, Fence, Persistence, PersistenceError, check_fence, classify, corrupt, db_err,
    with_retries,
};

/// Appends to a node's history (nothing when the node is not registered).
pub(crate) async fn node_event_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    node: &NodeId,
    kind: &str,
    message: &str,
    now: DateTime<Utc>,
    op: &'static str,
) -> Result<(), PersistenceError> {
    sqlx::query(
        "INSERT INTO node_events (node_id, at, kind, message)
         SELECT $1, $2, $3, $4 WHERE EXISTS (SELECT 1 FROM nodes WHERE id = $1)",
    )
    .bind(node.as_str())
    .bind(now)
    .bind(kind)
    .bind(message)
    .execute(&mut **tx)
    .await
    .map_err(db_err(op))?;
    Ok(())
}

#[derive(Clone, Debug, PartialEq)]
pub struct GpuRecord {
    pub uuid: GpuUuid,
    pub index: u32,
    pub model: String,
    pub memory_total_bytes: u64,
    pub pci_bus_id: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeRecord {
    pub id: NodeId,
    pub hostname: String,
    /// Where its peers reach it ('' = the hostname): the `MASTER_ADDR` of a
    /// gang whose rank 0 runs there.
    pub address: String,
    pub agent_version: String,
    pub gpu_backend: String,
    pub labels: BTreeMap<String, String>,
    pub state: NodeState,
    pub registered_at: DateTime<Utc>,
    pub last_heartbeat_at: DateTime<Utc>,
    pub gpus: Vec<GpuRecord>,
}

/// A `nodes` row as stored.
#[derive(sqlx::FromRow)]
struct NodeRow {
    id: String,
    hostname: String,
    address: String,
    agent_version: String,
    gpu_backend: String,
    labels: serde_json::Value,
    state: String,
    registered_at: DateTime<Utc>,
    last_heartbeat_at: DateTime<Utc>,
}

/// A `gpus` row as stored.
#[derive(sqlx::FromRow)]
struct GpuRow {
    uuid: String,
    node_id: String,
    idx: i32,
    model: String,
    memory_total_bytes: i64,
    pci_bus_id: String,
}

impl Persistence {
    /// The SHA-256 (hex) of a node's token; None when the node is unknown
    /// or has not enrolled with the join token yet.
    pub async fn node_token_sha256(
        &self,
        node: &NodeId,
    ) -> Result<Option<String>, PersistenceError> {
        sqlx::query_scalar::<_, Option<String>>("SELECT token_sha256 FROM nodes WHERE id = $1")
            .bind(node.as_str())
            .fetch_optional(&self.pool)
            .await
            .map(Option::flatten)
            .map_err(db_err("node_token_sha256"))
    }

    /// Writes one node event (the node must be registered), fenced.
    pub async fn node_event(
        &self,
        node: &NodeId,
        kind: &str,
        message: &str,
        fence: &Fence,
        now: DateTime<Utc>,
    ) -> Result<(), PersistenceError> {
        const OP: &str = "node_event";
        with_retries(OP, || async {
            let mut tx = self.pool.begin().await.map_err(db_err(OP))?;
            check_fence(&mut tx, fence, OP).await?;
            node_event_in(&mut tx, node, kind, message, now, OP).await?;
            tx.commit().await.map_err(db_err(OP))?;
            Ok(())
        })
        .await
    }

    /// Records a (re-)registration: the node row, its GPUs (replacing the
    /// previous list) and an event, in one transaction. The node becomes
    /// Available. With a fence, only while that fence leads. `enrolled`:
    /// the SHA-256 of the node token just issued (the node enrolled with
    /// the join token); it replaces, and so revokes, any earlier one.
    pub async fn register_node(
        &self,
        n: &NodeRecord,
        enrolled: Option<&str>,
        fence: Option<&Fence>,
        now: DateTime<Utc>,
    ) -> Result<(), PersistenceError> {
        const OP: &str = "register_node";
        let labels = serde_json::to_value(&n.labels).map_err(|e| corrupt(OP, e.to_string()))?;
        let uuids: Vec<&str> = n.gpus.iter().map(|g| g.uuid.0.as_str()).collect();
        let idx: Vec<i32> = n.gpus.iter().map(|g| g.index as i32).collect();
        let models: Vec<&str> = n.gpus.iter().map(|g| g.model.as_str()).collect();
        let mem: Vec<i64> = n.gpus.iter().map(|g| g.memory_total_bytes as i64).collect();
        let pci: Vec<&str> = n.gpus.iter().map(|g| g.pci_bus_id.as_str()).collect();
        with_retries(OP, || async {
            let mut tx = self.pool.begin().await.map_err(db_err(OP))?;
            if let Some(f) = fence {
                check_fence(&mut tx, f, OP).await?;
            }
            sqlx::query(
                "INSERT INTO nodes (id, hostname, agent_version, gpu_backend, labels, state,
                                    registered_at, last_heartbeat_at, state_changed_at, address)
                 VALUES ($1, $2, $3, $4, $5, 'available', $6, $6, $6, $7)
                 ON CONFLICT (id) DO UPDATE SET
                    hostname = EXCLUDED.hostname, address = EXCLUDED.address,
                    agent_version = EXCLUDED.agent_version,
                    gpu_backend = EXCLUDED.gpu_backend, labels = EXCLUDED.labels,
                    state = 'available', registered_at = EXCLUDED.registered_at,
                    last_heartbeat_at = EXCLUDED.last_heartbeat_at,
                    state_changed_at = CASE WHEN nodes.state = 'available'
                                            THEN nodes.state_changed_at ELSE EXCLUDED.state_changed_at END",
            )
            .bind(n.id.as_str())
            .bind(&n.hostname)
            .bind(&n.agent_version)
            .bind(&n.gpu_backend)
            .bind(&labels)
            .bind(now)
            .bind(&n.address)
            .execute(&mut *tx)
            .await
            .map_err(db_err(OP))?;
            // A GPU moved from another node (re-cabled host) is taken over.
            sqlx::query("DELETE FROM gpus WHERE node_id = $1 OR uuid = ANY($2)")
                .bind(n.id.as_str())
                .bind(&uuids)
                .execute(&mut *tx)
                .await
                .map_err(db_err(OP))?;
            sqlx::query(
                "INSERT INTO gpus (uuid, node_id, idx, model, memory_total_bytes, pci_bus_id)
                 SELECT u, $1, i, m, b, p FROM UNNEST($2::text[], $3::int[], $4::text[], $5::bigint[], $6::text[])
                      AS t(u, i, m, b, p)",
            )
            .bind(n.id.as_str())
            .bind(&uuids)
            .bind(&idx)
            .bind(&models)
            .bind(&mem)
            .bind(&pci)
            .execute(&mut *tx)
            .await
            .map_err(|e| match classify(&e) {
                ErrorClass::UniqueViolation => PersistenceError::Conflict(format!("node {}: duplicate GPU index", n.id)),
                _ => db_err(OP)(e),
            })?;
            let registered = format!("{} GPUs, agent {}, backend {}", n.gpus.len(), n.agent_version, n.gpu_backend);
            node_event_in(&mut tx, &n.id, "registered", &registered, now, OP).await?;
            if let Some(hash) = enrolled {
                let before: Option<String> =
                    sqlx::query_scalar("SELECT token_sha256 FROM nodes WHERE id = $1 FOR UPDATE")
                        .bind(n.id.as_str())
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(db_err(OP))?;
                sqlx::query("UPDATE nodes SET token_sha256 = $2 WHERE id = $1")
                    .bind(n.id.as_str())
                    .bind(hash)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err(OP))?;
                let message = if before.is_some() {
                    "enrolled again with the join token: a new node token was issued and the previous one revoked"
                } else {
                    "enrolled with the join token: node token issued"
                };
                node_event_in(&mut tx, &n.id, "enrolled", message, now, OP).await?;
            }
            tx.commit().await.map_err(db_err(OP))?;
            Ok(())
        })
        .await
    }

    /// Persists a liveness transition with the heartbeat time that drove it
    /// (with a fence, only while that fence leads).
    pub async fn set_node_state(
        &self,
        id: &NodeId,
        state: NodeState,
        last_heartbeat_at: DateTime<Utc>,
        fence: Option<&Fence>,
        now: DateTime<Utc>,
    ) -> Result<(), PersistenceError> {
        const OP: &str = "set_node_state";
        with_retries(OP, || async {
            let mut tx = self.pool.begin().await.map_err(db_err(OP))?;
            if let Some(f) = fence {
                check_fence(&mut tx, f, OP).await?;
            }
            let n = sqlx::query(
                "UPDATE nodes SET state = $2, last_heartbeat_at = GREATEST(last_heartbeat_at, $3),
                        state_changed_at = $4
                 WHERE id = $1",
            )
            .bind(id.as_str())
            .bind(state.as_str())
            .bind(last_heartbeat_at)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(db_err(OP))?
            .rows_affected();
            if n == 0 {
                return Err(PersistenceError::NotFound(format!("node {id}")));
            }
            node_event_in(&mut tx, id, "state_changed", state.as_str(), now, OP).await?;
            tx.commit().await.map_err(db_err(OP))?;
            Ok(())
        })
        .await
    }

    pub async fn list_nodes(&self) -> Result<Vec<NodeRecord>, PersistenceError> {
        const OP: &str = "list_nodes";
        let nodes = sqlx::query_as::<_, NodeRow>(
            "SELECT id, hostname, address, agent_version, gpu_backend, labels, state, registered_at, last_heartbeat_at
             FROM nodes ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        let gpus = sqlx::query_as::<_, GpuRow>(
            "SELECT uuid, node_id, idx, model, memory_total_bytes, pci_bus_id FROM gpus ORDER BY node_id, idx",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?;
        let mut by_node: BTreeMap<String, Vec<GpuRecord>> = BTreeMap::new();
        for g in gpus {
            by_node.entry(g.node_id).or_default().push(GpuRecord {
                uuid: GpuUuid(g.uuid),
                index: g.idx as u32,
                model: g.model,
                memory_total_bytes: g.memory_total_bytes as u64,
                pci_bus_id: g.pci_bus_id,
            });
        }
        nodes
            .into_iter()
            .map(|r| {
                Ok(NodeRecord {
                    gpus: by_node.remove(&r.id).unwrap_or_default(),
                    id: NodeId::try_from(r.id).map_err(|e| corrupt(OP, e))?,
                    hostname: r.hostname,
                    address: r.address,
                    agent_version: r.agent_version,
                    gpu_backend: r.gpu_backend,
                    labels: serde_json::from_value(r.labels)
                        .map_err(|e| corrupt(OP, e.to_string()))?,
                    state: r.state.parse().map_err(|e: String| corrupt(OP, e))?,
                    registered_at: r.registered_at,
                    last_heartbeat_at: r.last_heartbeat_at,
                })
            })
            .collect()
    }

    /// Node history (newest last), for tests and operators.
    pub async fn node_event_kinds(
        &self,
        id: &NodeId,
    ) -> Result<Vec<(String, String)>, PersistenceError> {
        const OP: &str = "node_events";
        sqlx::query_as("SELECT kind, message FROM node_events WHERE node_id = $1 ORDER BY seq")
            .bind(id.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(db_err(OP))
    }
}
