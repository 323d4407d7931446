//! Jobs over several nodes (gangs): a group's GPUs become one assignment
//! per node in rank order, and every gang gets a rendezvous port for its
//! rank 0 (`MASTER_PORT`, docs/trainer-contract.md).
//!
//! Ports: a gang keeps the port it had while its rank 0 stays on a host
//! and no other gang's rank 0 there holds it; a new gang takes the lowest
//! port of `scheduling.gang_ports` free on its rank-0 host. A port is a
//! job's only while it runs: the next plan without the job frees it.
//! Uniqueness is per host address (several nodes may share one address,
//! as the fake cluster of the tests does).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;

use fmsched_core::{JobId, NodeId};

use super::inputs::NodePart;
use crate::persistence::Assignment;

/// The assignments of `jobs` (a group's trainers) on `parts`.
pub(crate) fn assignments(jobs: &[JobId], parts: &[NodePart], profile: bool) -> Vec<Assignment> {
    jobs.iter()
        .flat_map(|&job| {
            parts.iter().map(move |p| Assignment {
                job,
                node: p.node.clone(),
                gpus: p.gpus.clone(),
                profile,
                rank_offset: p.rank_offset,
                master_port: None,
            })
        })
        .collect()
}

/// Gives every gang (a job with assignments on several nodes) a
/// rendezvous port on the address of its rank-0 node (see the module
/// docs); `previous` is the plan in force. Returns the jobs no port was
/// left for (they must not run: their assignments are removed).
pub(crate) fn assign_ports(
    plan: &mut Vec<Assignment>,
    previous: &[Assignment],
    address: impl Fn(&NodeId) -> String,
    range: &RangeInclusive<u16>,
) -> Vec<JobId> {
    let mut nodes: BTreeMap<JobId, usize> = BTreeMap::new();
    for a in plan.iter().filter(|a| !a.profile) {
        *nodes.entry(a.job).or_default() += 1;
    }
    // Each gang's rank-0 host.
    let host: BTreeMap<JobId, String> = plan
        .iter()
        .filter(|a| !a.profile && a.rank_offset == 0 && nodes.get(&a.job).is_some_and(|&n| n > 1))
        .map(|a| (a.job, address(&a.node)))
        .collect();
    let before: BTreeMap<JobId, (String, u16)> = previous
        .iter()
        .filter(|a| !a.profile && a.rank_offset == 0)
        .filter_map(|a| Some((a.job, (address(&a.node), a.master_port?))))
        .collect();
    let mut taken: BTreeSet<(String, u16)> = BTreeSet::new();
    let mut port: BTreeMap<JobId, u16> = BTreeMap::new();
    // Kept first, so a new gang never takes a running one's port.
    for (job, h) in &host {
        if let Some((old_host, p)) = before.get(job)
            && old_host == h
            && range.contains(p)
            && taken.insert((h.clone(), *p))
        {
            port.insert(*job, *p);
        }
    }
    let mut starved = Vec::new();
    for (job, h) in &host {
        if port.contains_key(job) {
            continue;
        }
        match range.clone().find(|p| !taken.contains(&(h.clone(), *p))) {
            Some(p) => {
                taken.insert((h.clone(), p));
                port.insert(*job, p);
            }
            None => starved.push(*job),
        }
    }
    plan.retain(|a| !starved.contains(&a.job));
    for a in plan.iter_mut() {
        a.master_port = port.get(&a.job).copied().filter(|_| !a.profile);
    }
    starved
}

#[cfg(test)]
mod tests {
    use super::*;
    use fmsched_core::GpuUuid;

    fn job(n: u8) -> JobId {
        format!("01a30000-0000-7000-8000-0000000000{n:02}")
            .parse()
            .unwrap()
    }

    fn node(n: &str) -> NodeId {
        NodeId::try_from(n.to_string()).unwrap()
    }

    fn part(n: &str, gpus: u32, rank_offset: u32) -> NodePart {
        NodePart {
            view_node: 0,
            node: node(n),
            gpus: (0..gpus).map(|g| GpuUuid(format!("{n}-G{g}"))).collect(),
            rank_offset,
        }
    }

    /// Nodes a and b share a host, c is another one.
    fn addr(n: &NodeId) -> String {
        match n.as_str() {
            "c" => "10.0.0.3".into(),
            _ => "10.0.0.1".into(),
        }
    }

    #[test]
    fn a_group_over_nodes_is_one_assignment_per_node_in_rank_order() {
        let a = assignments(&[job(1)], &[part("a", 4, 0), part("b", 4, 4)], false);
        let got: Vec<(&str, usize, u32)> = a
            .iter()
            .map(|x| (x.node.as_str(), x.gpus.len(), x.rank_offset))
            .collect();
        assert_eq!(got, vec![("a", 4, 0), ("b", 4, 4)]);
    }

    /// Gangs get distinct ports per rank-0 host, keep theirs across plans,
    /// and a job on one node gets none.
    #[test]
    fn gangs_get_ports_per_host_and_keep_them() {
        let range = 29500..=29502;
        let mut plan = [
            assignments(&[job(1)], &[part("a", 4, 0), part("c", 4, 4)], false),
            assignments(&[job(2)], &[part("b", 2, 0), part("c", 2, 2)], false),
            assignments(&[job(3)], &[part("c", 2, 0), part("a", 2, 2)], false),
            assignments(&[job(4)], &[part("a", 1, 0)], false),
        ]
        .concat();
        assert!(assign_ports(&mut plan, &[], addr, &range).is_empty());
        let port = |plan: &[Assignment], j: JobId| {
            let ports: BTreeSet<Option<u16>> = plan
                .iter()
                .filter(|a| a.job == j)
                .map(|a| a.master_port)
                .collect();
            assert_eq!(ports.len(), 1, "every part of a job has the same port");
            ports.into_iter().next().unwrap()
        };
        // a and b share 10.0.0.1: jobs 1 and 2 differ; job 3's rank 0 is on c.
        assert_eq!(port(&plan, job(1)), Some(29500));
        assert_eq!(port(&plan, job(2)), Some(29501));
        assert_eq!(port(&plan, job(3)), Some(29500));
        assert_eq!(port(&plan, job(4)), None, "one node: no rendezvous port");
        // Next plan: job 1 is gone, a new gang 5 comes; 2 and 3 keep theirs.
        let previous = plan.clone();
        let mut next = [
            assignments(&[job(5)], &[part("a", 4, 0), part("c", 2, 4)], false),
            assignments(&[job(2)], &[part("b", 2, 0), part("c", 2, 2)], false),
            assignments(&[job(3)], &[part("c", 2, 0), part("a", 2, 2)], false),
        ]
        .concat();
        assert!(assign_ports(&mut next, &previous, addr, &range).is_empty());
        assert_eq!(port(&next, job(2)), Some(29501), "kept");
        assert_eq!(port(&next, job(3)), Some(29500), "kept");
        assert_eq!(port(&next, job(5)), Some(29500), "job 1's, freed");
    }

    /// With every port of a host taken, a new gang there waits (its
    /// assignments are removed) rather than sharing a port.
    #[test]
    fn a_gang_without_a_free_port_does_not_run() {
        let range = 29500..=29500;
        let mut plan = [
            assignments(&[job(1)], &[part("a", 4, 0), part("c", 4, 4)], false),
            assignments(&[job(2)], &[part("b", 2, 0), part("c", 2, 2)], false),
        ]
        .concat();
        assert_eq!(assign_ports(&mut plan, &[], addr, &range), vec![job(2)]);
        assert!(plan.iter().all(|a| a.job == job(1)));
    }
}
