//! One scheduling round, shared by the scheduler service and `fmsim`:
//! everything between "what the cluster looks like" and "what runs where
//! next", without the IO on either side (STYLE §7: if the simulator and the
//! service can disagree about a rule, the rule is in the wrong place).
//!
//! A round has three pure phases; the caller does the IO between them:
//! 1. **prepare** ([`prepare`]) — the nodes the round may use and their
//!    capacity (Offline nodes are out, drained ones give nothing, a Suspect
//!    or cordoned one keeps only what it runs), profiling reservations (Ymir Fig. 6
//!    step 2), the jobs that enter the policy's snapshot, the policy's own
//!    allocation set, the merges kept from earlier rounds, the pairs
//!    eligible for a new merge, and jobs no node can ever hold.
//!
//!    The caller then estimates times for those jobs and pairs
//!    ([`Estimates`]): the service asks its estimator (with the logged
//!    in-process fallback), fmsim its catalog. That is the one input that
//!    differs between the two, by design.
//! 2. **decide** ([`decide`]) — the policy's [`Snapshot`] (remaining times,
//!    merged groups' times, restart costs, current placements), the plan
//!    (`Policy::schedule`: allocate, then place) and its consistency check.
//! 3. **interpret** (the end of [`decide`]) — concrete GPUs (a group that
//!    keeps its node and size keeps its GPUs), new merges, job state
//!    transitions with their reasons, leases, context switches, and the
//!    placements the executor cannot run (each named, never dropped
//!    silently).
//!
//! Everything here is deterministic: sorted vectors and `BTreeMap`s only,
//! ties broken by index. The same view and estimates give the same outcome
//! in the service and in fmsim.
//!
//! ## Files
//! - [`view`]: what a round is given (the cluster view, the round's config).
//! - [`outcome`]: what passes between phases and what a round returns.
//! - [`rules`], [`clock`], [`accounting`]: small rules both callers charge
//!   alike (restart cost, when the next round runs, the service a job
//!   received and deserved).
//! - [`shapes`], [`pairs`]: what fits where, and who may merge with whom.
//! - [`prepare`], [`snapshot`], [`interpret`]: the phases; each imports
//!   the shared types and rules above, never another phase.
//! - [`decide`]: runs snapshot → policy → interpret in order.
//! - [`predict`]: finish times and deadline risk of a decided round.
//! - `testkit`: builders of views for tests (feature `testkit`).

pub mod accounting;
pub mod clock;
mod decide;
pub mod guard;
mod interpret;
pub mod outcome;
mod pairs;
pub mod predict;
mod prepare;
pub mod rules;
pub mod shapes;
mod snapshot;
pub mod view;

#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
#[cfg(test)]
mod tests;

pub use accounting::{Accrued, accrue, fair_share};
pub use clock::{RoundClock, round_after_event, round_for_deadline};
pub use decide::decide;
pub use interpret::restarts;
pub use outcome::{
    Decision, Estimates, Group, PairEstimate, PairKey, Prepared, Reservation, RoundError,
    RoundOutcome, Transition, WarmEstimate, WarmKey, WarmStart,
};
pub use predict::{Prediction, predictions};
pub use prepare::prepare;
pub use rules::{DEFAULT_CONTEXT_SWITCH_S, need_alone, restart_cost};
pub use shapes::{
    default_shape, estimate_shape, family_time_ratios, fits_no_family, never_fits, unfit_reason,
};
pub use snapshot::{chosen_warm_starts, snapshot};
pub use view::{
    ClusterView, DEFAULT_PROFILING_SHARE, FinishedView, Gpu, JobView, MergeView, NodeView,
    RoundConfig,
};

/// The phases of a live committing round, in order, as the scheduler
/// names them on `/metrics` (`fmsched_round_phase_duration_seconds_{last,sum}{phase}`)
/// and in its stuck-round warning; `fmctl bench-agents` reads them back.
pub mod phase {
    pub const OBSERVE: &str = "observe";
    pub const LOAD_INPUTS: &str = "load inputs";
    pub const DECIDE: &str = "decide";
    pub const COMMIT: &str = "commit";
    pub const PUSH_PLANS: &str = "push plans";
    pub const AFTER_COMMIT: &str = "after commit";
    pub const ALL: [&str; 6] = [
        OBSERVE,
        LOAD_INPUTS,
        DECIDE,
        COMMIT,
        PUSH_PLANS,
        AFTER_COMMIT,
    ];
}
