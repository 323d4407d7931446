//! Jobs over several nodes (gangs): a group's GPUs become one assignment
//! per node in rank order, and every gang gets a rendezvous port for its
//! rank 0 (`MASTER_PORT`, docs/trainer-contract.md).
//!
//! Ports: a port names one *run* of a gang (its processes from start to
//! stop). A gang keeps its port while the plan keeps its processes: the
//! same parts (nodes, GPUs, ranks) as the plan in force, and no new merge
//! that restarts them. Every other start (its first, a retry, a resume, a
//! new layout) takes a port that neither this plan nor the plan in force
//! holds on its rank-0 host, and that no rank 0 still alive there holds
//! (its agent reports the port of every process of a gang: a run the plan
//! in force no longer has, a re-queued gang's, may still be going away),
//! probing the range from an offset hashed from the job, its layout and its
//! incarnation (the sequence number of the job's newest event, which every
//! stop moves on). So the processes of a new run never reach a rank 0 of
//! the run before that is still going away (a rendezvous still listening, a
//! torch TCPStore until its process exits) and rejoin it, as they could
//! when the lowest free port went straight back to a retried gang; and the
//! port of one start is the same in the look-ahead's standby hint and in
//! the plan that starts it, unless a process holding it went or came
//! between the two. Uniqueness is per host address
//! (several nodes may share one address, as the fake cluster of the tests
//! does).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;

use fmsched_core::{JobId, NodeId};

use super::inputs::NodePart;
use crate::persistence::Assignment;
use crate::registry::LiveNode;
use fmsched_proto::v1 as pb;

/// The rendezvous ports held by a gang's rank 0 whose process is still
/// alive (starting, running or checkpointing, as its agent last reported),
/// by the host address `address` gives its node.
pub(crate) fn ports_alive(
    nodes: &[LiveNode],
    address: impl Fn(&NodeId) -> String,
) -> BTreeSet<(String, u16)> {
    ports_alive_in(
        nodes
            .iter()
            .map(|n| (&n.record.id, n.observed_tasks.as_slice())),
        address,
    )
}

/// [`ports_alive`] over each node's reported processes.
fn ports_alive_in<'a>(
    nodes: impl IntoIterator<Item = (&'a NodeId, &'a [pb::ObservedTask])>,
    address: impl Fn(&NodeId) -> String,
) -> BTreeSet<(String, u16)> {
    nodes
        .into_iter()
        .flat_map(|(node, tasks)| {
            let host = address(node);
            tasks
                .iter()
                .filter(|t| t.rank_offset == 0 && crate::registry::process_alive(t))
                .filter_map(|t| u16::try_from(t.master_port).ok().filter(|&p| p > 0))
                .map(move |p| (host.clone(), p))
        })
        .collect()
}

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

/// A gang's parts: (node, GPUs, rank offset) in rank order.
type Layout = Vec<(NodeId, Vec<String>, u32)>;

fn layouts(plan: &[Assignment]) -> BTreeMap<JobId, Layout> {
    let mut out: BTreeMap<JobId, Layout> = BTreeMap::new();
    for a in plan.iter().filter(|a| !a.profile) {
        out.entry(a.job).or_default().push((
            a.node.clone(),
            a.gpus.iter().map(|g| g.0.clone()).collect(),
            a.rank_offset,
        ));
    }
    for l in out.values_mut() {
        l.sort_by_key(|p| p.2);
    }
    out
}

/// FNV-1a of a run's identity: stable across processes and versions.
fn offset_of(job: JobId, layout: &Layout, incarnation: i64, len: u64) -> u64 {
    let mut h = fmsched_core::hash::Fnv1a::new();
    h.write(job.to_string().as_bytes());
    for (node, gpus, rank) in layout {
        h.write(node.as_str().as_bytes());
        for g in gpus {
            h.write(g.as_bytes());
        }
        h.write(&rank.to_le_bytes());
    }
    h.write(&incarnation.to_le_bytes());
    h.finish() % len.max(1)
}

/// Gives every gang (a job with assignments on several nodes) a
/// rendezvous port on the address of its rank-0 node (see the module
/// docs); `previous` is the plan in force, `incarnation` the sequence
/// number of a job's newest event (it moves on whenever the job stops),
/// `restarted` the jobs whose processes this plan restarts on the same
/// parts (a new merge), `alive` the ports rank-0 processes still hold
/// ([`ports_alive`]). Returns the jobs no port was left for (they must
/// not run: their assignments are removed).
pub(crate) fn assign_ports(
    plan: &mut Vec<Assignment>,
    previous: &[Assignment],
    address: impl Fn(&NodeId) -> String,
    range: &RangeInclusive<u16>,
    incarnation: impl Fn(JobId) -> i64,
    restarted: &BTreeSet<JobId>,
    alive: &BTreeSet<(String, u16)>,
) -> Vec<JobId> {
    let now = layouts(plan);
    let before = layouts(previous);
    // Each gang's rank-0 host.
    let host: BTreeMap<JobId, String> = now
        .iter()
        .filter(|(_, l)| l.len() > 1)
        .map(|(&job, l)| (job, address(&l[0].0)))
        .collect();
    // Every port the plan in force holds (its runs may still be going), and
    // every port a live rank 0 holds (a run no plan has any more may still
    // be going away). A run the plan keeps keeps its own.
    let mut port_before: BTreeMap<JobId, u16> = BTreeMap::new();
    let mut taken: BTreeSet<(String, u16)> = alive.clone();
    for a in previous.iter().filter(|a| !a.profile && a.rank_offset == 0) {
        if let Some(p) = a.master_port {
            port_before.insert(a.job, p);
            taken.insert((address(&a.node), p));
        }
    }
    let mut port: BTreeMap<JobId, u16> = BTreeMap::new();
    // Runs the plan keeps keep their ports.
    for (job, h) in &host {
        if let Some(&p) = port_before.get(job)
            && before.get(job) == now.get(job)
            && !restarted.contains(job)
            && range.contains(&p)
        {
            taken.insert((h.clone(), p));
            port.insert(*job, p);
        }
    }
    let (first, len) = (
        u64::from(*range.start()),
        u64::from(range.end().saturating_sub(*range.start())) + 1,
    );
    let mut starved = Vec::new();
    for (job, h) in &host {
        if port.contains_key(job) {
            continue;
        }
        let from = offset_of(*job, &now[job], incarnation(*job), len);
        let free = (0..len)
            .map(|i| (first + (from + i) % len) as u16)
            .find(|p| !taken.contains(&(h.clone(), *p)));
        match free {
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

    /// Every part of a job has the same port (None for a job on one node).
    fn port(plan: &[Assignment], j: JobId) -> Option<u16> {
        let ports: BTreeSet<Option<u16>> = plan
            .iter()
            .filter(|a| a.job == j)
            .map(|a| a.master_port)
            .collect();
        assert_eq!(ports.len(), 1, "every part of a job has the same port");
        ports.into_iter().next().unwrap()
    }

    fn ports(plan: &mut Vec<Assignment>, previous: &[Assignment], seq: i64) -> Vec<JobId> {
        assign_ports(
            plan,
            previous,
            addr,
            &(29500..=29999),
            |_| seq,
            &BTreeSet::new(),
            &BTreeSet::new(),
        )
    }

    /// Gangs get distinct ports per rank-0 host; a run the next plan keeps
    /// (the same parts) keeps its port, a new one never takes a port the
    /// plan in force holds; a job on one node gets none.
    #[test]
    fn gangs_get_ports_per_host_and_keep_them_while_they_run() {
        let mut plan = [
            assignments(&[job(1)], &[part("a", 4, 0), part("c", 4, 4)], false),
            assignments(&[job(2)], &[part("b", 2, 0), part("c", 2, 2)], false),
            assignments(&[job(3)], &[part("c", 2, 0), part("a", 2, 2)], false),
            assignments(&[job(4)], &[part("a", 1, 0)], false),
        ]
        .concat();
        assert!(ports(&mut plan, &[], 1).is_empty());
        // a and b share 10.0.0.1: jobs 1 and 2 differ; job 3's rank 0 is on c.
        let (p1, p2, p3) = (
            port(&plan, job(1)),
            port(&plan, job(2)),
            port(&plan, job(3)),
        );
        assert!(p1.is_some() && p2.is_some() && p3.is_some());
        assert_ne!(p1, p2, "one host, two gangs");
        assert_eq!(port(&plan, job(4)), None, "one node: no rendezvous port");
        // Next plan: job 1 is gone, a new gang 5 comes; 2 and 3 keep theirs.
        let previous = plan.clone();
        let mut next = [
            assignments(&[job(5)], &[part("a", 4, 0), part("c", 2, 4)], false),
            assignments(&[job(2)], &[part("b", 2, 0), part("c", 2, 2)], false),
            assignments(&[job(3)], &[part("c", 2, 0), part("a", 2, 2)], false),
        ]
        .concat();
        assert!(ports(&mut next, &previous, 2).is_empty());
        assert_eq!(port(&next, job(2)), p2, "kept");
        assert_eq!(port(&next, job(3)), p3, "kept");
        let p5 = port(&next, job(5));
        assert!(p5 != p1 && p5 != p2, "job 1's run may still be going");
        // The same inputs give the same ports (a standby hint and the plan
        // that starts it agree).
        let mut again = next.clone();
        assert!(ports(&mut again, &previous, 2).is_empty());
        assert_eq!(again, next);
    }

    /// A run that changes its parts, or that a new merge restarts on the
    /// same parts, is a new run: it takes a new port, never its old one.
    #[test]
    fn a_gang_that_starts_again_takes_a_new_port() {
        let range = 29500..=29999;
        let mut plan = assignments(&[job(1)], &[part("a", 4, 0), part("c", 4, 4)], false);
        assert!(ports(&mut plan, &[], 1).is_empty());
        let old = port(&plan, job(1));
        // Rank 0 stays on a; the other part moves from c to b.
        let mut moved = assignments(&[job(1)], &[part("a", 4, 0), part("b", 4, 4)], false);
        assert!(ports(&mut moved, &plan, 1).is_empty());
        assert_ne!(port(&moved, job(1)), old, "a new layout");
        // Same parts, but restarted by a new merge.
        let mut merged = plan.clone();
        let restarted = BTreeSet::from([job(1)]);
        assert!(
            assign_ports(
                &mut merged,
                &plan,
                addr,
                &range,
                |_| 1,
                &restarted,
                &BTreeSet::new()
            )
            .is_empty()
        );
        assert_ne!(port(&merged, job(1)), old, "restarted by a merge");
    }

    /// A gang retried or resumed after it stopped (the plan before does not
    /// hold it, and with its last rank 0 gone nothing says which port that
    /// run had) starts from
    /// another offset: the same port comes back to one job's next run
    /// about once in the range's length (500 ports here), where the lowest
    /// free port gave a retried gang its old port every time.
    #[test]
    fn a_gang_restarted_after_a_stop_rarely_gets_its_last_port_again() {
        let runs: Vec<Option<u16>> = (0..400)
            .map(|seq| {
                let mut plan = assignments(&[job(1)], &[part("a", 4, 0), part("c", 4, 4)], false);
                assert!(ports(&mut plan, &[], seq).is_empty());
                port(&plan, job(1))
            })
            .collect();
        let repeats = runs.windows(2).filter(|w| w[0] == w[1]).count();
        assert!(
            repeats <= 4,
            "{repeats} of 399 restarts got their last port"
        );
        let distinct: BTreeSet<_> = runs.iter().collect();
        assert!(
            distinct.len() > 200,
            "spread over the range: {}",
            distinct.len()
        );
    }

    /// A rank 0 its agent still reports alive keeps its port from every new
    /// run on its host, whatever the plans say: a re-queued gang's last run
    /// (in no plan any more) may still be going away. Its other parts, a
    /// rank 0 that has exited, and a job on one node hold nothing.
    #[test]
    fn a_gang_never_gets_a_port_a_live_rank_0_still_holds() {
        let task = |port: u32, rank_offset: u32, phase: pb::TaskPhase| pb::ObservedTask {
            master_port: port,
            rank_offset,
            phase: phase as i32,
            ..Default::default()
        };
        let (a, c) = (node("a"), node("c"));
        let on_a = [
            task(29510, 0, pb::TaskPhase::Running),
            task(29511, 0, pb::TaskPhase::Checkpointing),
            task(29512, 0, pb::TaskPhase::Succeeded),
            task(29513, 0, pb::TaskPhase::Suspended),
            task(0, 0, pb::TaskPhase::Running),
        ];
        let on_c = [
            task(29514, 4, pb::TaskPhase::Running),
            task(29515, 0, pb::TaskPhase::Starting),
        ];
        let alive = ports_alive_in([(&a, &on_a[..]), (&c, &on_c[..])], addr);
        assert_eq!(
            alive,
            BTreeSet::from([
                ("10.0.0.1".to_string(), 29510),
                ("10.0.0.1".to_string(), 29511),
                ("10.0.0.3".to_string(), 29515),
            ])
        );
        // A range of two ports, one held by a live rank 0: each of 50
        // restarts of a gang with rank 0 on a takes the other.
        let range = 29510..=29511;
        let held = BTreeSet::from([("10.0.0.1".to_string(), 29510)]);
        for seq in 0..50 {
            let mut plan = assignments(&[job(1)], &[part("a", 4, 0), part("c", 4, 4)], false);
            assert!(
                assign_ports(
                    &mut plan,
                    &[],
                    addr,
                    &range,
                    |_| seq,
                    &BTreeSet::new(),
                    &held
                )
                .is_empty()
            );
            assert_eq!(port(&plan, job(1)), Some(29511), "restart {seq}");
        }
        // A run the plan keeps is the live one: it keeps its port.
        let mut kept = assignments(&[job(1)], &[part("a", 4, 0), part("c", 4, 4)], false);
        for a in &mut kept {
            a.master_port = Some(29510);
        }
        let mut next = kept.clone();
        assert!(
            assign_ports(
                &mut next,
                &kept,
                addr,
                &range,
                |_| 0,
                &BTreeSet::new(),
                &held
            )
            .is_empty()
        );
        assert_eq!(port(&next, job(1)), Some(29510));
        // Both held: the gang waits.
        let full = BTreeSet::from([
            ("10.0.0.1".to_string(), 29510),
            ("10.0.0.1".to_string(), 29511),
        ]);
        let mut plan = assignments(&[job(1)], &[part("a", 4, 0), part("c", 4, 4)], false);
        assert_eq!(
            assign_ports(&mut plan, &[], addr, &range, |_| 0, &BTreeSet::new(), &full),
            vec![job(1)]
        );
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
        let starved = assign_ports(
            &mut plan,
            &[],
            addr,
            &range,
            |_| 0,
            &BTreeSet::new(),
            &BTreeSet::new(),
        );
        assert_eq!(starved.len(), 1, "one port for two gangs on one host");
        assert!(plan.iter().all(|a| a.job != starved[0]));
        // The one that got it keeps it; the other still waits.
        let previous = plan.clone();
        let mut next = [
            assignments(&[job(1)], &[part("a", 4, 0), part("c", 4, 4)], false),
            assignments(&[job(2)], &[part("b", 2, 0), part("c", 2, 2)], false),
        ]
        .concat();
        let again = assign_ports(
            &mut next,
            &previous,
            addr,
            &range,
            |_| 0,
            &BTreeSet::new(),
            &BTreeSet::new(),
        );
        assert_eq!(again, starved);
    }
}
