//! Builders of views for tests (this crate's, and others' with the
//! `testkit` feature): a node, a job, a view, and random views.

use super::*;

use crate::job::JobState;
use crate::node::NodeState;
use crate::policy::MergeMode;
use proptest::prelude::*;

/// An available node.
pub fn node(id: &str, gpus: u32) -> NodeView {
    NodeView {
        id: id.into(),
        gpus,
        state: NodeState::Available,
        drained: false,
        cordoned: false,
        gpu_model: "A100".into(),
        loaned: false,
        gpu_memory_gib: 80.0,
    }
}

/// A job of `roberta-base` asking for `gpus` (1 at least), holding
/// nothing, submitted at 0.
pub fn job(id: &str, task: &str, state: JobState, gpus: u32) -> JobView {
    JobView {
        id: id.into(),
        state,
        model: "roberta-base".into(),
        task: task.into(),
        sharing: true,
        pipeline: false,
        expert_parallel: 0,
        worker_gpus: 0,
        gpu_model: None,
        unfit_families: Vec::new(),
        min_gpus: 1,
        max_gpus: gpus,
        requested_gpus: gpus,
        submitted_at: 0.0,
        iteration: 0,
        progress: 0.0,
        attained_gpu_s: 0.0,
        executed_s: 0.0,
        fair_share_gpu_s: 0.0,
        lease_until: 0.0,
        restart_s: 30.0,
        holds: Vec::new(),
        profiling_run: false,
        held_back: false,
        ever_merged: false,
        merge_setup: String::new(),
        deadlines: Vec::new(),
        queue: String::new(),
        priority: 0,
        preemptible: true,
        footprint: None,
        skip_profiling: false,
        family_time_ratio: Vec::new(),
    }
}

/// Linear scaling: `work / a` seconds at each allocation of the round
/// (`+∞` at 0 GPUs).
pub fn linear(p: &Prepared, work: f64) -> Vec<f64> {
    power_law(p, work, 1.0)
}

/// `work / a^k` seconds at each allocation of the round (`+∞` at 0
/// GPUs): `k < 1` for jobs that scale sub-linearly.
pub fn power_law(p: &Prepared, work: f64, k: f64) -> Vec<f64> {
    p.allocations
        .iter()
        .map(|&a| {
            if a == 0 {
                f64::INFINITY
            } else {
                work / f64::from(a).powf(k)
            }
        })
        .collect()
}

/// A temporal candidate of jobs `a` → `b` the caller estimated
/// helpful: B from A's weights needs a tenth of its time (360 s of
/// work), TranWt 1.8 at every allocation, `G_{A,B}` = 0.25.
pub fn helpful_temporal(p: &Prepared, a: usize, b: usize) -> PairEstimate {
    PairEstimate {
        pair: PairKey {
            a,
            b,
            mode: MergeMode::Temporal,
        },
        seconds: linear(p, 360.0),
        tran_wt: p
            .allocations
            .iter()
            .map(|&x| if x == 0 { 0.0 } else { 1.8 })
            .collect(),
        gain_ab: 0.25,
        gain_ba: 0.0,
    }
}

/// Every snapshot job and kept merge scaling linearly with `work`, no
/// candidate.
pub fn estimates(p: &Prepared, work: f64) -> Estimates {
    Estimates {
        jobs: p.jobs.iter().map(|_| linear(p, work)).collect(),
        kept: p.kept.iter().map(|_| linear(p, work)).collect(),
        candidates: Vec::new(),
        warm: Vec::new(),
        spread: Vec::new(),
        kept_b_alone: Vec::new(),
    }
}

/// A view at time 0 without merges.
pub fn view(nodes: Vec<NodeView>, jobs: Vec<JobView>) -> ClusterView {
    ClusterView {
        now: 0.0,
        nodes,
        jobs,
        merges: Vec::new(),
        finished: Vec::new(),
    }
}

/// Random clusters: 1–4 nodes of 1–8 GPUs (some offline, suspect or
/// drained), up to 13 jobs in every live state of 1–8 GPUs, some
/// pipeline or private, running and profiling ones holding GPUs where
/// they fit, some started.
pub fn arb_view() -> impl Strategy<Value = ClusterView> {
    let nodes = prop::collection::vec((1u32..=8, 0u8..10), 1..5);
    let jobs = prop::collection::vec(
        (
            0u8..4,
            1u32..=8,
            0u8..6,
            any::<bool>(),
            any::<bool>(),
            0u8..5,
        ),
        0..14,
    );
    (nodes, jobs).prop_map(|(nodes, jobs)| {
        let nodes: Vec<NodeView> = nodes
            .into_iter()
            .enumerate()
            .map(|(k, (gpus, st))| NodeView {
                id: format!("n{k}"),
                gpus,
                state: match st {
                    0 => NodeState::Offline,
                    1 => NodeState::Suspect,
                    _ => NodeState::Available,
                },
                drained: st == 2,
                cordoned: st == 3,
                // Every third node is of another family.
                gpu_model: if k % 3 == 2 { "H100" } else { "A100" }.into(),
                loaned: st == 4,
                gpu_memory_gib: 80.0,
            })
            .collect();
        let mut free: Vec<Vec<u32>> = nodes.iter().map(|n| (0..n.gpus).collect()).collect();
        let tasks = ["rte", "mrpc", "qqp", "sst2", "cola", "mnli"];
        let jobs = jobs
            .into_iter()
            .enumerate()
            .map(|(k, (st, gpus, task, pipeline, sharing, holds))| {
                let state = [
                    JobState::Submitted,
                    JobState::Profiling,
                    JobState::Queued,
                    JobState::Running,
                ][st as usize];
                let mut j = job(&format!("j{k:02}"), tasks[task as usize], state, gpus);
                j.pipeline = pipeline && gpus >= 4;
                j.sharing = sharing;
                if k % 5 == 4 {
                    j.gpu_model = Some("H100".into());
                }
                j.submitted_at = -(k as f64);
                j.progress = f64::from(holds % 3) / 4.0;
                if matches!(state, JobState::Running | JobState::Profiling) {
                    let n = holds as usize % nodes.len();
                    let want = if state == JobState::Profiling {
                        1
                    } else {
                        gpus
                    };
                    if free[n].len() >= want as usize {
                        j.holds = free[n].drain(..want as usize).map(|g| (n, g)).collect();
                        j.profiling_run = state == JobState::Profiling;
                    }
                }
                j
            })
            .collect();
        view(nodes, jobs)
    })
}
