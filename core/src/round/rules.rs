//! Small rules both callers charge the same way: what a (re)start costs
//! and what a waiting job needs to finish alone.

/// Seconds a (re)start costs when the profile names no context-switch time.
pub const DEFAULT_CONTEXT_SWITCH_S: f64 = 30.0;

/// What a (re)start of a job costs: writing and loading its checkpoint plus
/// the model's context switch (process start, weights, data loader) from its
/// throughput profile. The service and fmsim both charge exactly this.
pub fn restart_cost(checkpoint_s: f64, context_switch_s: Option<f64>) -> f64 {
    checkpoint_s.max(0.0)
        + context_switch_s
            .unwrap_or(DEFAULT_CONTEXT_SWITCH_S)
            .max(0.0)
}

/// What job `k` of a round's snapshot needs from a round's start to finish
/// alone, as the round's estimates have it: its time at the GPUs it asked
/// for (the fewest it may run on when its request is not in the allocation
/// set) and its start. None for a job that has trained (it is no longer
/// waiting for its first start) or whose times are all unknown. The need
/// [`super::round_for_deadline`] weighs once a job has profiled: the service
/// refreshes admission's bound with it after each round, and fmsim's
/// `deadline_needs` is the same time from its own model of the job.
pub fn need_alone(snap: &crate::policy::Snapshot, k: usize) -> Option<f64> {
    let j = snap.jobs.get(k)?;
    if j.progress > 0.0 || j.current_gpus > 0 {
        return None;
    }
    let time = Some(snap.time_at(k, j.requested_gpus))
        .filter(|t| t.is_finite())
        .or_else(|| {
            snap.allocations
                .iter()
                .zip(&j.remaining_s)
                .find(|&(&a, t)| a > 0 && a >= j.min_gpus && t.is_finite())
                .map(|(_, &t)| t)
        })?;
    Some(time + j.restart_s)
}
