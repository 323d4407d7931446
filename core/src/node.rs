//! Node liveness: `Available → Suspect → Offline` by time since the last
//! heartbeat (docs/architecture.md, "Liveness").

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    Available,
    /// Missed heartbeats for longer than `suspect_after`; nothing new is
    /// placed on it, but its jobs keep their GPUs.
    Suspect,
    /// Silent for longer than `offline_after`; its jobs go back to the queue.
    Offline,
}

impl NodeState {
    pub const ALL: [NodeState; 3] = [NodeState::Available, NodeState::Suspect, NodeState::Offline];

    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Available => "available",
            NodeState::Suspect => "suspect",
            NodeState::Offline => "offline",
        }
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for NodeState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        NodeState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown node state {s:?}"))
    }
}

/// Grace periods of the liveness rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Liveness {
    pub suspect_after: Duration,
    pub offline_after: Duration,
}

impl Liveness {
    /// State a node should be in given when it last heart-beat.
    /// A clock that went backwards counts as "just heard from".
    pub fn state_at(&self, last_heartbeat: DateTime<Utc>, now: DateTime<Utc>) -> NodeState {
        let silent = (now - last_heartbeat).to_std().unwrap_or(Duration::ZERO);
        if silent >= self.offline_after {
            NodeState::Offline
        } else if silent >= self.suspect_after {
            NodeState::Suspect
        } else {
            NodeState::Available
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_thresholds() {
        let l = Liveness {
            suspect_after: Duration::from_secs(10),
            offline_after: Duration::from_secs(30),
        };
        let t0 = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .to_utc();
        let at = |s: i64| t0 + chrono::Duration::seconds(s);
        assert_eq!(l.state_at(t0, at(0)), NodeState::Available);
        assert_eq!(l.state_at(t0, at(9)), NodeState::Available);
        assert_eq!(l.state_at(t0, at(10)), NodeState::Suspect);
        assert_eq!(l.state_at(t0, at(29)), NodeState::Suspect);
        assert_eq!(l.state_at(t0, at(30)), NodeState::Offline);
        assert_eq!(l.state_at(t0, at(-5)), NodeState::Available);
    }
}
