//! Tests of the round through both callers' entry points (prepare →
//! estimates → decide), by topic.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::testkit::{arb_view, estimates, helpful_temporal, job, linear, node, view};
use super::*;
use crate::job::JobState;
use crate::node::NodeState;
use crate::policy::by_name;
use crate::policy::{MergeMode, Replica};
use crate::queue::Queues;

mod families_and_sizes;
mod merges;
mod nodes_and_profiling;
mod properties;
mod queues;
mod rules;

fn run(v: &ClusterView, policy: &str, cfg: &RoundConfig) -> Decision {
    let policy = by_name(policy).unwrap();
    let p = prepare(v, policy.as_ref(), cfg);
    let e = estimates(&p, 3600.0);
    decide(v, &p, &e, policy.as_ref(), cfg).unwrap()
}

pub(super) fn two_queues(ga: u32, la: Option<u32>, gb: u32, lb: Option<u32>) -> Queues {
    let q = |name: &str, g: u32, l: Option<u32>| crate::queue::QueueSpec {
        name: name.into(),
        parent: None,
        guaranteed_gpus: g,
        over_quota_weight: 1.0,
        limit_gpus: l,
        models: vec![],
        users: vec![],
        merge_across_queues: false,
    };
    Queues::new(vec![q("a", ga, la), q("b", gb, lb)]).unwrap()
}

/// GPUs each queue's jobs hold after the round (a group counts once
/// for each queue among its jobs).
pub(super) fn usage(v: &ClusterView, o: &RoundOutcome) -> BTreeMap<String, u32> {
    let mut u = BTreeMap::new();
    for g in &o.groups {
        let qs: BTreeSet<&str> = g.jobs.iter().map(|&j| v.jobs[j].queue.as_str()).collect();
        for q in qs {
            *u.entry(q.to_string()).or_default() += g.gpus.len() as u32;
        }
    }
    u
}
