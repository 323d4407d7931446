//! Queues, priorities and preemption classes: the quota pass of the shared
//! round (the service and fmsim run the same code).
//!
//! Operators define queues in two levels (a department → its teams, as
//! Slurm partitions with QoS, or the KAI scheduler's queue tree): each has a
//! **guaranteed** number of GPUs, an **over-quota weight** for what is left
//! beyond the guarantees, an optional hard **limit**, the foundation models
//! its jobs may use (Ymir §9 per-FM quotas), its users, and whether its jobs
//! may merge with other queues' jobs.
//!
//! Every round, before the policy sees anything, [`apply`] decides:
//! 1. each queue's **deserved GPUs** — its guarantee (within what its jobs
//!    can use), then the rest of the cluster by weight among queues that
//!    want more, never above a limit: a water-fill, first over the
//!    departments, then over each department's teams within what it got;
//! 2. which of a queue's jobs are **admitted** — running non-preemptible
//!    jobs first (they keep their GPUs: pinned), then by priority (higher
//!    first), running before waiting, then by submission — while their
//!    smallest sizes fit in what the queue deserves. A running job that is
//!    not admitted is suspended from its checkpoint (a queue below its
//!    guarantee reclaims GPUs from over-quota queues, and a higher-priority
//!    job takes them from a lower one of its queue, in the same round); a
//!    waiting one waits, told why;
//! 3. a **cap** on each admitted job's GPUs so that the queue's jobs,
//!    together, never exceed what it deserves (extra GPUs above the
//!    smallest sizes go in admission order).
//!
//! The policy then schedules only the admitted jobs, each under its cap, on
//! the capacity the pinned jobs leave. So no queue exceeds its limit, one
//! below its guarantee with work gets its GPUs back within one round, and a
//! running non-preemptible job is never suspended by a policy.
//!
//! A non-preemptible job starts only within its queue's guarantee, and is
//! never merged (a merge suspends and restarts its jobs). With no queue
//! configured, every job is in one implicit queue: priorities and
//! non-preemptible jobs still act; when all jobs are alike (the same
//! priority, all preemptible) the pass changes nothing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::field_error::FieldError;

/// One queue as an operator configures it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSpec {
    /// Unique name (letters, digits, `-`, `_`, `.`).
    pub name: String,
    /// The department it belongs to (a top-level queue), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// GPUs it is promised whenever its jobs can use them.
    #[serde(default)]
    pub guaranteed_gpus: u32,
    /// Its share of the GPUs beyond all guarantees, relative to the other
    /// queues that want more (default 1).
    #[serde(default = "one")]
    pub over_quota_weight: f64,
    /// The most GPUs its jobs hold together (None: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_gpus: Option<u32>,
    /// The models its jobs may fine-tune (empty: any; a team's list is
    /// checked with its department's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Users whose jobs go here by default and who may submit here (empty:
    /// anyone may name it; admins may name any queue).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    /// Its jobs may merge with other queues' jobs (both queues must allow
    /// it); jobs of one queue always may.
    #[serde(default = "yes")]
    pub merge_across_queues: bool,
}

fn one() -> f64 {
    1.0
}

fn yes() -> bool {
    true
}

/// A validated set of queues (empty: no queues configured).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Queues {
    specs: Vec<QueueSpec>,
}

/// Why a job may not go where it asks, naming the spec field.
#[derive(Debug, PartialEq)]
pub enum QueueError {
    /// The job names a queue that does not exist or is a department.
    Unknown(FieldError),
    /// The user may not submit to it.
    NotMember(FieldError),
    /// The queue (or its department) does not allow the model.
    Model(FieldError),
}

impl QueueError {
    pub fn field_error(&self) -> &FieldError {
        match self {
            QueueError::Unknown(e) | QueueError::NotMember(e) | QueueError::Model(e) => e,
        }
    }
}

impl std::fmt::Display for QueueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.field_error().fmt(f)
    }
}

/// A queue name: 1-63 letters, digits, `-`, `_` or `.` (the one rule of
/// the configuration and of a job spec's `queue`).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl Queues {
    /// Validates a queue list; errors name the queue and the field
    /// (`queues[i].field`).
    pub fn new(specs: Vec<QueueSpec>) -> Result<Self, String> {
        let mut names = BTreeMap::new();
        for (i, q) in specs.iter().enumerate() {
            let at = |f: &str| format!("queues[{i}].{f}");
            if !valid_name(&q.name) {
                return Err(format!(
                    "{}: {:?} must be 1-63 letters, digits, '-', '_' or '.'",
                    at("name"),
                    q.name
                ));
            }
            if names.insert(q.name.clone(), i).is_some() {
                return Err(format!("{}: {:?} is defined twice", at("name"), q.name));
            }
            if !(q.over_quota_weight.is_finite() && q.over_quota_weight > 0.0) {
                return Err(format!(
                    "{}: {} must be a positive number",
                    at("over_quota_weight"),
                    q.over_quota_weight
                ));
            }
            if let Some(l) = q.limit_gpus
                && l < q.guaranteed_gpus
            {
                return Err(format!(
                    "{}: {l} is below guaranteed_gpus {}",
                    at("limit_gpus"),
                    q.guaranteed_gpus
                ));
            }
        }
        for (i, q) in specs.iter().enumerate() {
            let Some(p) = &q.parent else { continue };
            let at = format!("queues[{i}].parent");
            let Some(&pi) = names.get(p) else {
                return Err(format!("{at}: no queue is named {p:?}"));
            };
            if specs[pi].parent.is_some() {
                return Err(format!(
                    "{at}: {p:?} is itself a team of {:?}; queues have two levels (department → team)",
                    specs[pi].parent.as_deref().unwrap_or_default()
                ));
            }
            if !specs[pi].users.is_empty() {
                return Err(format!(
                    "{at}: {p:?} has users, but a department's jobs are in its teams; list the users on the teams"
                ));
            }
        }
        for (pi, p) in specs.iter().enumerate() {
            let children: Vec<&QueueSpec> = specs
                .iter()
                .filter(|c| c.parent.as_deref() == Some(p.name.as_str()))
                .collect();
            let sum: u32 = children.iter().map(|c| c.guaranteed_gpus).sum();
            if !children.is_empty() && sum > p.guaranteed_gpus && p.guaranteed_gpus > 0 {
                return Err(format!(
                    "queues[{pi}].guaranteed_gpus: {} is less than its teams' guarantees ({sum})",
                    p.guaranteed_gpus
                ));
            }
        }
        Ok(Self { specs })
    }

    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    pub fn specs(&self) -> &[QueueSpec] {
        &self.specs
    }

    pub fn get(&self, name: &str) -> Option<&QueueSpec> {
        self.specs.iter().find(|q| q.name == name)
    }

    /// A queue jobs may be submitted to: one without teams.
    fn is_leaf(&self, name: &str) -> bool {
        self.get(name).is_some() && !self.specs.iter().any(|c| c.parent.as_deref() == Some(name))
    }

    /// The queues jobs may land in (teams, and departments without teams).
    pub fn leaves(&self) -> impl Iterator<Item = &str> {
        self.specs
            .iter()
            .map(|q| q.name.as_str())
            .filter(|n| self.is_leaf(n))
    }

    /// The queue a job of `user` lands in: the one it names (checked), else
    /// the first queue listing the user, else the first queue open to
    /// everyone; `""` when no queue is configured.
    pub fn resolve(
        &self,
        named: &str,
        user: &str,
        admin: bool,
        model: &str,
    ) -> Result<String, QueueError> {
        if self.specs.is_empty() {
            if named.is_empty() {
                return Ok(String::new());
            }
            return Err(QueueError::Unknown(FieldError::new(
                "spec.queue",
                format!("{named:?} does not exist (no queues are configured)"),
            )));
        }
        let leaves: Vec<&QueueSpec> = self
            .specs
            .iter()
            .filter(|q| self.is_leaf(&q.name))
            .collect();
        let q = if named.is_empty() {
            leaves
                .iter()
                .find(|q| q.users.iter().any(|u| u == user))
                .or_else(|| leaves.iter().find(|q| q.users.is_empty()))
                .copied()
                .ok_or_else(|| {
                    QueueError::NotMember(FieldError::new(
                        "spec.queue",
                        format!(
                        "user {user:?} belongs to no queue and none is open to everyone; name one"
                    )))
                })?
        } else {
            let q = self.get(named).ok_or_else(|| {
                QueueError::Unknown(FieldError::new(
                    "spec.queue",
                    format!(
                        "{named:?} does not exist; queues: {}",
                        leaves
                            .iter()
                            .map(|q| q.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ))
            })?;
            if !self.is_leaf(named) {
                return Err(QueueError::Unknown(FieldError::new(
                    "spec.queue",
                    format!("{named:?} is a department; name one of its teams"),
                )));
            }
            if !admin && !q.users.is_empty() && !q.users.iter().any(|u| u == user) {
                return Err(QueueError::NotMember(FieldError::new(
                    "spec.queue",
                    format!("user {user:?} may not submit to {named:?}"),
                )));
            }
            q
        };
        for s in std::iter::once(q).chain(q.parent.as_deref().and_then(|p| self.get(p))) {
            if !s.models.is_empty() && !s.models.iter().any(|m| m == model) {
                return Err(QueueError::Model(FieldError::new(
                    "spec.model",
                    format!(
                        "queue {:?} may fine-tune only {}",
                        s.name,
                        s.models.join(", ")
                    ),
                )));
            }
        }
        Ok(q.name.clone())
    }

    /// May jobs of these two queues merge?
    pub fn may_merge(&self, a: &str, b: &str) -> bool {
        a == b
            || [a, b]
                .iter()
                .all(|q| self.get(q).is_none_or(|s| s.merge_across_queues))
    }
}

/// One job as the quota pass sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaJob {
    pub queue: String,
    pub priority: i32,
    pub preemptible: bool,
    /// Training GPUs it holds now.
    pub holds: u32,
    /// It may keep them (its nodes still take work): a running
    /// non-preemptible job is pinned to them.
    pub may_stay: bool,
    pub min_gpus: u32,
    /// The most it may be given (after the executor's own cap).
    pub max_gpus: u32,
    pub submitted_at: f64,
}

/// The pass's verdict for the round's candidate jobs (indices into the
/// slice given to [`apply`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuotaOutcome {
    /// Running non-preemptible jobs that keep their GPUs outside the
    /// policy.
    pub pinned: Vec<usize>,
    /// Jobs out of this round, and why.
    pub out: Vec<(usize, String)>,
    /// The most GPUs each admitted job may get (only where below its own
    /// maximum).
    pub caps: BTreeMap<usize, u32>,
    /// Each queue's deserved GPUs this round.
    pub deserved: BTreeMap<String, u32>,
    /// GPUs each queue's jobs could use (pinned ones at what they hold).
    pub demand: BTreeMap<String, u32>,
    /// With a rigid policy, its waiting jobs (all admitted: the policy
    /// picks among them within their queue's budget), and why one waits
    /// if its queue's budget runs out.
    pub short: Vec<(usize, String)>,
}

/// The quota pass (module docs). `total` is the training capacity of the
/// round, pinned jobs' GPUs included. With `rigid_policy` (a policy that runs a
/// job at its request or not at all), a waiting job that does not fit its
/// queue's share is left to the policy with a budget per queue
/// ([`QuotaOutcome::short`]), so the policy's own order picks among a
/// queue's waiting jobs; running jobs are admitted as without it.
pub fn apply(queues: &Queues, jobs: &[QuotaJob], total: u32, rigid_policy: bool) -> QuotaOutcome {
    let alike = jobs.windows(2).all(|w| w[0].priority == w[1].priority)
        && jobs.iter().all(|j| j.preemptible);
    if queues.is_empty() && alike {
        return QuotaOutcome::default();
    }
    // Demand of each leaf queue (what its jobs could use).
    let mut demand: BTreeMap<&str, u32> = BTreeMap::new();
    for j in jobs {
        *demand.entry(j.queue.as_str()).or_default() +=
            if is_pinned(j) { j.holds } else { j.max_gpus };
    }
    let deserved = deserved_gpus(queues, &demand, total);
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&jobs[a], &jobs[b]);
        is_pinned(y)
            .cmp(&is_pinned(x))
            .then(y.priority.cmp(&x.priority))
            .then((y.holds > 0).cmp(&(x.holds > 0)))
            .then(x.submitted_at.total_cmp(&y.submitted_at))
            .then(a.cmp(&b))
    });
    let mut out = QuotaOutcome {
        deserved: deserved.iter().map(|(q, &d)| (q.to_string(), d)).collect(),
        demand: demand.iter().map(|(q, &d)| (q.to_string(), d)).collect(),
        ..Default::default()
    };
    // Admission: smallest sizes within what the queue deserves.
    let mut used: BTreeMap<&str, u32> = BTreeMap::new();
    let mut rigid: BTreeMap<&str, u32> = BTreeMap::new(); // non-preemptible GPUs
    let mut admitted: Vec<usize> = Vec::new();
    for &k in &order {
        let j = &jobs[k];
        let q = j.queue.as_str();
        let d = deserved.get(q).copied().unwrap_or(0);
        let u = used.entry(q).or_default();
        let spec = queues.get(q);
        let name = if q.is_empty() { "the cluster" } else { q };
        if is_pinned(j) {
            *u += j.holds;
            *rigid.entry(q).or_default() += j.holds;
            out.pinned.push(k);
            continue;
        }
        if !j.preemptible {
            let g = spec.map_or(total, |s| s.guaranteed_gpus);
            let r = rigid.entry(q).or_default();
            if *r + j.max_gpus > g {
                out.out.push((
                    k,
                    format!(
                        "waiting: a non-preemptible job runs only within {}'s guarantee of {g} GPUs \
                         ({} held by non-preemptible jobs; it asks up to {})",
                        queue_name(name),
                        *r,
                        j.max_gpus
                    ),
                ));
                continue;
            }
            *r += j.max_gpus;
        }
        let terms = spec.map_or(String::new(), |s| {
            let limit = s
                .limit_gpus
                .map_or(String::new(), |l| format!(", limit {l}"));
            format!(" (guarantee {}{limit})", s.guaranteed_gpus)
        });
        let fits = *u + j.min_gpus <= d;
        if fits {
            *u += j.min_gpus;
            admitted.push(k);
        }
        if rigid_policy && j.holds == 0 {
            // The policy picks among the queue's waiting jobs within its
            // budget; whichever it leaves out waits for this reason.
            out.short.push((
                k,
                format!(
                    "waiting: {} may use {d} GPUs this round{terms}, taken by the jobs it runs \
                     and those the policy puts first",
                    queue_name(name)
                ),
            ));
            if !fits {
                admitted.push(k);
            }
        } else if !fits {
            let why = format!(
                "{} may use {d} GPUs this round{terms}, all taken by its earlier or higher-priority jobs",
                queue_name(name)
            );
            out.out.push((
                k,
                if j.holds > 0 {
                    format!("preempted: {why}; suspended from its checkpoint")
                } else {
                    format!("waiting: {why}")
                },
            ));
        }
    }
    // Caps: the GPUs above the smallest sizes, in admission order.
    let mut extra: BTreeMap<&str, u32> = deserved
        .iter()
        .map(|(&q, &d)| (q, d.saturating_sub(used.get(q).copied().unwrap_or(0))))
        .collect();
    for &k in &admitted {
        let j = &jobs[k];
        let e = extra.entry(j.queue.as_str()).or_default();
        let more = (j.max_gpus - j.min_gpus.min(j.max_gpus)).min(*e);
        *e -= more;
        let cap = j.min_gpus + more;
        if cap < j.max_gpus {
            out.caps.insert(k, cap);
        }
    }
    out.out.sort_by_key(|o| o.0);
    out.pinned.sort_unstable();
    out
}

fn queue_name(name: &str) -> String {
    if name == "the cluster" {
        name.to_string()
    } else {
        format!("queue {name}")
    }
}

fn is_pinned(j: &QuotaJob) -> bool {
    !j.preemptible && j.holds > 0 && j.may_stay
}

/// Each leaf queue's deserved GPUs: departments first, then their teams
/// within what the department got. A queue's share never exceeds its
/// demand or its limit; the sum never exceeds `total`.
fn deserved_gpus<'q>(
    queues: &Queues,
    demand: &BTreeMap<&'q str, u32>,
    total: u32,
) -> BTreeMap<&'q str, u32> {
    if queues.is_empty() {
        return demand.iter().map(|(&q, &d)| (q, d.min(total))).collect();
    }
    let leaf_of = |q: &str| queues.get(q).and_then(|s| s.parent.clone());
    // Top level: departments (their teams' demand) and lone queues.
    let mut top: BTreeMap<String, u32> = BTreeMap::new();
    for (&q, &d) in demand {
        let t = leaf_of(q).unwrap_or_else(|| q.to_string());
        *top.entry(t).or_default() += d;
    }
    let entry = |name: &str, d: u32| {
        let s = queues.get(name);
        Fill {
            guarantee: s.map_or(0, |s| s.guaranteed_gpus),
            weight: s.map_or(1.0, |s| s.over_quota_weight),
            cap: d.min(s.and_then(|s| s.limit_gpus).unwrap_or(u32::MAX)),
        }
    };
    let tops: Vec<(&String, Fill)> = top.iter().map(|(n, &d)| (n, entry(n, d))).collect();
    let got = water_fill(&tops.iter().map(|t| t.1).collect::<Vec<_>>(), total);
    let mut out = BTreeMap::new();
    for ((name, _), g) in tops.iter().zip(got) {
        let teams: Vec<(&str, Fill)> = demand
            .iter()
            .filter(|(q, _)| leaf_of(q).as_deref() == Some(name.as_str()))
            .map(|(&q, &d)| (q, entry(q, d)))
            .collect();
        if teams.is_empty() {
            // A lone queue (or jobs in no configured queue).
            if let Some((&q, _)) = demand.iter().find(|(q, _)| **q == name.as_str()) {
                out.insert(q, g);
            }
            continue;
        }
        let within = water_fill(&teams.iter().map(|t| t.1).collect::<Vec<_>>(), g);
        for ((q, _), w) in teams.into_iter().zip(within) {
            out.insert(q, w);
        }
    }
    out
}

#[derive(Clone, Copy, Debug)]
struct Fill {
    guarantee: u32,
    weight: f64,
    /// min(demand, limit).
    cap: u32,
}

/// Splits `total` GPUs: guarantees first (as far as each can use them, in
/// order when guarantees exceed the total), then one GPU at a time to the
/// entry that has the least over-quota GPUs per unit of weight and can
/// still use one (ties: the earlier entry).
fn water_fill(entries: &[Fill], total: u32) -> Vec<u32> {
    let mut left = total;
    let mut got: Vec<u32> = entries
        .iter()
        .map(|e| {
            let g = e.guarantee.min(e.cap).min(left);
            left -= g;
            g
        })
        .collect();
    while left > 0 {
        let next = (0..entries.len())
            .filter(|&i| got[i] < entries[i].cap)
            .min_by(|&a, &b| {
                let over = |i: usize| {
                    f64::from(got[i].saturating_sub(entries[i].guarantee) + 1) / entries[i].weight
                };
                over(a).total_cmp(&over(b)).then(a.cmp(&b))
            });
        let Some(i) = next else { break };
        got[i] += 1;
        left -= 1;
    }
    got
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn q(name: &str, g: u32, limit: Option<u32>) -> QueueSpec {
        QueueSpec {
            name: name.into(),
            parent: None,
            guaranteed_gpus: g,
            over_quota_weight: 1.0,
            limit_gpus: limit,
            models: vec![],
            users: vec![],
            merge_across_queues: true,
        }
    }

    fn job(queue: &str, holds: u32, min: u32, max: u32, at: f64) -> QuotaJob {
        QuotaJob {
            queue: queue.into(),
            priority: 0,
            preemptible: true,
            holds,
            may_stay: true,
            min_gpus: min,
            max_gpus: max,
            submitted_at: at,
        }
    }

    #[test]
    fn bad_queue_sets_are_refused_naming_the_field() {
        let bad = |specs: Vec<QueueSpec>, field: &str| {
            let e = Queues::new(specs).unwrap_err();
            assert!(e.contains(field), "{e}");
        };
        bad(vec![q("a b", 0, None)], "queues[0].name");
        bad(vec![q("a", 0, None), q("a", 0, None)], "queues[1].name");
        bad(vec![q("a", 4, Some(2))], "queues[0].limit_gpus");
        let mut w = q("a", 0, None);
        w.over_quota_weight = 0.0;
        bad(vec![w], "queues[0].over_quota_weight");
        let mut t = q("t", 0, None);
        t.parent = Some("nope".into());
        bad(vec![t.clone()], "queues[0].parent");
        let mut sub = q("s", 0, None);
        sub.parent = Some("t".into());
        t.parent = Some("d".into());
        bad(vec![q("d", 0, None), t.clone(), sub], "queues[2].parent");
        let mut d = q("d", 2, None);
        d.users = vec!["x".into()];
        bad(vec![d, t.clone()], "queues[1].parent");
        let mut t3 = t.clone();
        t3.guaranteed_gpus = 3;
        bad(vec![q("d", 2, None), t3], "queues[0].guaranteed_gpus");
    }

    #[test]
    fn a_job_lands_in_its_users_queue_and_names_only_what_it_may() {
        let mut nlp = q("nlp", 2, None);
        nlp.users = vec!["alice".into()];
        nlp.models = vec!["roberta-base".into()];
        nlp.parent = Some("research".into());
        let open = q("open", 0, None);
        let qs = Queues::new(vec![q("research", 4, None), nlp, open]).unwrap();
        assert_eq!(
            qs.resolve("", "alice", false, "roberta-base").unwrap(),
            "nlp"
        );
        assert_eq!(qs.resolve("", "bob", false, "gpt2").unwrap(), "open");
        let e = qs.resolve("nlp", "bob", false, "roberta-base").unwrap_err();
        assert!(matches!(e, QueueError::NotMember(_)), "{e}");
        assert!(qs.resolve("nlp", "root", true, "roberta-base").is_ok());
        let e = qs.resolve("", "alice", false, "gpt2").unwrap_err();
        assert!(e.to_string().starts_with("spec.model"), "{e}");
        let e = qs.resolve("research", "alice", false, "gpt2").unwrap_err();
        assert!(e.to_string().contains("department"), "{e}");
        let e = qs.resolve("nope", "alice", false, "gpt2").unwrap_err();
        assert!(e.to_string().contains("nlp, open"), "{e}");
        assert!(Queues::default().resolve("x", "a", false, "m").is_err());
        assert_eq!(Queues::default().resolve("", "a", false, "m").unwrap(), "");
    }

    #[test]
    fn alike_jobs_without_queues_are_left_alone() {
        let jobs = vec![job("", 4, 1, 8, 0.0), job("", 0, 1, 8, 1.0)];
        assert_eq!(
            apply(&Queues::default(), &jobs, 8, false),
            QuotaOutcome::default()
        );
    }

    #[test]
    fn guarantees_first_then_the_rest_by_weight_within_limits() {
        let mut b = q("b", 2, None);
        b.over_quota_weight = 3.0;
        let qs = Queues::new(vec![q("a", 2, Some(3)), b, q("c", 0, None)]).unwrap();
        let demand = BTreeMap::from([("a", 8), ("b", 8), ("c", 8)]);
        let d = deserved_gpus(&qs, &demand, 12);
        // a: 2 + 1 (its limit); the other 7 beyond guarantees split 3:1
        // between b and c (b 2 + 5 or 6, c 2 or 1).
        assert_eq!(d["a"], 3);
        assert_eq!(d["a"] + d["b"] + d["c"], 12);
        assert!(d["b"] - 2 >= 3 * (d["c"]) - 1, "{d:?}");
        // A queue that wants less than its guarantee leaves the rest.
        let demand = BTreeMap::from([("a", 1), ("b", 8)]);
        let d = deserved_gpus(&qs, &demand, 12);
        assert_eq!((d["a"], d["b"]), (1, 8));
    }

    #[test]
    fn a_queue_below_its_guarantee_takes_gpus_back_from_an_over_quota_one() {
        let qs = Queues::new(vec![q("a", 4, None), q("b", 4, None)]).unwrap();
        // b holds all 8 GPUs with two 4-GPU jobs; a submits a 4-GPU job.
        let jobs = vec![
            job("b", 4, 4, 4, 0.0),
            job("b", 4, 4, 4, 1.0),
            job("a", 0, 4, 4, 2.0),
        ];
        let o = apply(&qs, &jobs, 8, false);
        assert_eq!(o.deserved["a"], 4);
        assert_eq!(o.out.len(), 1);
        let (k, why) = &o.out[0];
        assert_eq!(*k, 1, "b's later job is preempted");
        assert!(
            why.starts_with("preempted: queue b may use 4 GPUs"),
            "{why}"
        );
    }

    #[test]
    fn higher_priority_takes_gpus_from_lower_in_its_queue() {
        let mut lo = job("", 8, 8, 8, 0.0);
        lo.priority = 0;
        let mut hi = job("", 0, 4, 8, 1.0);
        hi.priority = 5;
        let o = apply(&Queues::default(), &[lo, hi], 8, false);
        assert_eq!(o.out.len(), 1);
        assert_eq!(o.out[0].0, 0);
        assert!(
            o.out[0].1.contains("the cluster may use 8 GPUs"),
            "{}",
            o.out[0].1
        );
    }

    #[test]
    fn a_non_preemptible_job_is_pinned_and_starts_only_within_the_guarantee() {
        let qs = Queues::new(vec![q("a", 4, None), q("b", 0, None)]).unwrap();
        let mut pinned = job("a", 4, 4, 4, 5.0);
        pinned.preemptible = false;
        pinned.priority = -3;
        let mut second = job("a", 0, 1, 2, 0.0);
        second.preemptible = false;
        let o = apply(&qs, &[pinned, second, job("b", 0, 1, 4, 1.0)], 8, false);
        assert_eq!(o.pinned, vec![0]);
        assert_eq!(o.out.len(), 1);
        assert!(
            o.out[0].1.contains("within queue a's guarantee of 4"),
            "{:?}",
            o.out
        );
    }

    #[test]
    fn caps_keep_a_queue_within_its_limit() {
        let qs = Queues::new(vec![q("a", 0, Some(6))]).unwrap();
        let jobs = vec![job("a", 0, 1, 4, 0.0), job("a", 0, 1, 4, 1.0)];
        let o = apply(&qs, &jobs, 16, false);
        assert_eq!(o.deserved["a"], 6);
        // 1 + 3 for the first, 1 + 1 for the second: 6 in all.
        assert_eq!(o.caps, BTreeMap::from([(1, 2)]));
    }
}
