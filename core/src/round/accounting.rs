//! Service accounting (Themis' finish-time fairness, Tiresias' attained
//! service): what a job received and what it deserved while one plan
//! held. The service accrues it plan by plan in its round's commit (it
//! only writes the deltas this returns), fmsim as its virtual time
//! advances; both call [`accrue`], so the two cannot count differently.

/// GPUs per second a live job deserves: an equal share of the cluster, at
/// most what it asked for — Themis's deserved service, accumulated by the
/// service plan by plan and by fmsim as time passes.
pub fn fair_share(total_gpus: u32, live_jobs: usize, requested_gpus: u32) -> f64 {
    if live_jobs == 0 {
        return 0.0;
    }
    (f64::from(total_gpus) / live_jobs as f64).min(f64::from(requested_gpus))
}

/// What one job adds to its service over one held period.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Accrued {
    /// GPU-seconds it trained on (Tiresias' attained service).
    pub attained_gpu_s: f64,
    /// Seconds it trained.
    pub executed_s: f64,
    /// GPU-seconds it deserved ([`fair_share`] over the time it was in the
    /// system).
    pub fair_share_gpu_s: f64,
}

/// What a job accrues while a plan holds for `held_s` seconds: the GPUs it
/// trains on (`training_gpus`; 0: none, or only a profiling run) for the
/// whole period, and its deserved share (`deserved_gpus`, [`fair_share`])
/// for the part of it the job was in the system (`present_s`: a job
/// submitted during the period deserves only the time since it came). A
/// clock that went back (negative times) accrues nothing.
pub fn accrue(training_gpus: u32, deserved_gpus: f64, held_s: f64, present_s: f64) -> Accrued {
    let held_s = held_s.max(0.0);
    Accrued {
        attained_gpu_s: f64::from(training_gpus) * held_s,
        executed_s: if training_gpus > 0 { held_s } else { 0.0 },
        fair_share_gpu_s: deserved_gpus.max(0.0) * present_s.clamp(0.0, held_s),
    }
}
