//! Newtype identifiers, so a job id can never be passed where a node id is
//! expected.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Identifier of a job, assigned by the scheduler at submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub Uuid);

impl JobId {
    /// A fresh, time-ordered id (UUIDv7: sorts by submission time).
    pub fn new_v7() -> Self {
        Self(Uuid::now_v7())
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for JobId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s.trim()).map(JobId)
    }
}

/// Identifier of a node (chosen by its agent; defaults to the hostname).
/// Restricted to `[A-Za-z0-9._-]`, 1–253 characters, like a DNS name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct NodeId(String);

impl NodeId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for NodeId {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        if s.is_empty() || s.len() > 253 {
            return Err(format!("must be 1-253 characters, got {}", s.len()));
        }
        if let Some(c) = s
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(format!(
                "contains {c:?}; only letters, digits, '.', '_' and '-' are allowed"
            ));
        }
        Ok(NodeId(s))
    }
}

impl From<NodeId> for String {
    fn from(id: NodeId) -> String {
        id.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// NVML UUID of one GPU (e.g. `GPU-5e3c…`), unique across the cluster.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GpuUuid(pub String);

impl fmt::Display for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Name of an authenticated user (the owner of jobs).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UserName(pub String);

impl fmt::Display for UserName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_id_rejects_bad_characters_and_lengths() {
        assert!(NodeId::try_from("gpu-node-01.rack3".to_string()).is_ok());
        assert!(NodeId::try_from(String::new()).is_err());
        assert!(
            NodeId::try_from("a b".to_string())
                .unwrap_err()
                .contains("' '")
        );
        assert!(NodeId::try_from("x".repeat(254)).is_err());
    }

    #[test]
    fn job_ids_are_time_ordered() {
        let a = JobId::new_v7();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = JobId::new_v7();
        assert!(a < b);
        assert_eq!(a.to_string().parse::<JobId>().unwrap(), a);
    }
}
