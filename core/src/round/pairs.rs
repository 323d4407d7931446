//! Who may merge with whom, and which finished job's weights a new one may
//! start from: the eligibility rules (Ymir §4, §9: same model, both
//! sharing, trained alike, neither merged before) behind the pairs and warm
//! starts a round offers. Pure questions about the view; no estimates.

use std::collections::BTreeMap;

use super::outcome::{PairKey, WarmKey};
use super::view::{ClusterView, JobView, is_training};
use crate::policy::MergeMode;
use crate::queue::Queues;

/// Pairs that may merge (Ymir §5, the filter before any estimate): both in
/// the snapshot, one model, different tasks, both allow sharing, both
/// data-parallel or both pipeline (of one expert-parallel degree), no two
/// different GPU models asked for, the same training setup (precision,
/// checkpointing, PETL, frozen layers: one process trains a spatial pair,
/// and A's weights start B of a temporal one), neither merged before;
/// neither of a spatial pair started (one new process trains both from
/// the start), B of a temporal one not started (it starts from A's
/// weights). A of a temporal pair may have trained, running or suspended:
/// B then waits for what A has left. Without that, a job that started alone
/// a moment before a partner arrived could never lead it, and a round on
/// every arrival (which starts each job at once) would merge far less.
/// Per model, for every ordered pair: `A ↦ B`, and `A ‖ B` once.
pub(super) fn eligible_pairs(
    view: &ClusterView,
    snapshot_jobs: &[usize],
    queues: &Queues,
) -> Vec<PairKey> {
    let mut by_model: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for &i in snapshot_jobs {
        let j = &view.jobs[i];
        // A merge suspends and restarts its jobs: never a non-preemptible one.
        if open_for_merge(j) {
            by_model.entry(j.model.as_str()).or_default().push(i);
        }
    }
    let mut out = Vec::new();
    for group in by_model.values() {
        for (x, &a) in group.iter().enumerate() {
            for (y, &b) in group.iter().enumerate() {
                if a == b || !may_pair(view, a, b, queues) {
                    continue;
                }
                if unstarted(&view.jobs[b]) {
                    out.push(PairKey {
                        a,
                        b,
                        mode: MergeMode::Temporal,
                    });
                }
                if x < y && unstarted(&view.jobs[a]) && unstarted(&view.jobs[b]) {
                    out.push(PairKey {
                        a,
                        b,
                        mode: MergeMode::Spatial,
                    });
                }
            }
        }
    }
    out
}

/// The per-job half of [`eligible_pairs`]' filter: sharing, preemptible (a
/// merge may suspend and restart its jobs), never merged.
fn open_for_merge(j: &JobView) -> bool {
    j.sharing && j.preemptible && !j.ever_merged
}

/// Not trained yet: both jobs of a spatial pair, B of a temporal one.
fn unstarted(j: &JobView) -> bool {
    j.progress == 0.0
}

/// The pairwise half of [`eligible_pairs`]' filter.
fn may_pair(view: &ClusterView, a: usize, b: usize, queues: &Queues) -> bool {
    let (ja, jb) = (&view.jobs[a], &view.jobs[b]);
    ja.model == jb.model
        && ja.task != jb.task
        && ja.replica() == jb.replica()
        && ja.merge_setup == jb.merge_setup
        && queues.may_merge(&ja.queue, &jb.queue)
        && crate::policy::same_gpus(ja.gpu_model.as_deref(), jb.gpu_model.as_deref())
}

/// Whether `pair` is one [`eligible_pairs`] lists for the snapshot jobs
/// `ord` (job → snapshot index), decided for the one pair: the list is
/// quadratic in the jobs of a model (millions of pairs at thousands of
/// queued jobs), the candidates are not.
pub(super) fn is_eligible(
    view: &ClusterView,
    ord: &BTreeMap<usize, usize>,
    queues: &Queues,
    pair: &PairKey,
) -> bool {
    let (Some(&x), Some(&y)) = (ord.get(&pair.a), ord.get(&pair.b)) else {
        return false;
    };
    pair.a != pair.b
        && open_for_merge(&view.jobs[pair.a])
        && open_for_merge(&view.jobs[pair.b])
        && may_pair(view, pair.a, pair.b, queues)
        && unstarted(&view.jobs[pair.b])
        && match pair.mode {
            MergeMode::Temporal => true,
            MergeMode::Spatial => x < y && unstarted(&view.jobs[pair.a]),
            // Sharing a GPU is the policy's pick, not a merge candidate.
            MergeMode::Normal | MergeMode::Shared => false,
        }
}

/// The warm starts of a round ([`WarmKey`]): each snapshot job open for a
/// merge (sharing, preemptible, never merged) that has not trained and
/// does not train now, from each finished job of the same model and
/// another task whose user shares its work, trained alike (same training
/// setup and pipeline layout), in a queue it may merge with.
pub(super) fn warm_keys(
    view: &ClusterView,
    snapshot_jobs: &[usize],
    queues: &Queues,
) -> Vec<WarmKey> {
    let mut out = Vec::new();
    if view.finished.is_empty() {
        return out;
    }
    for &job in snapshot_jobs {
        let j = &view.jobs[job];
        if !open_for_merge(j) || !unstarted(j) || is_training(j) {
            continue;
        }
        for (from, f) in view.finished.iter().enumerate() {
            if f.sharing
                && f.model == j.model
                && f.task != j.task
                && f.pipeline == j.pipeline
                && f.merge_setup == j.merge_setup
                && queues.may_merge(&f.queue, &j.queue)
            {
                out.push(WarmKey { job, from });
            }
        }
    }
    out.sort_unstable();
    out
}
