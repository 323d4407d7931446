//! When rounds run: the scheduling loop on core's round clock (rounds on
//! events, for deadlines, and a policy set live with a shorter interval),
//! and the deadline waits it weighs.

use std::sync::Arc;

use chrono::Utc;
use fmsched_core::round;

use crate::config::SchedulingConfig;
use crate::estimates::EstimatorClient;
use crate::round::phases::{end_round, watch_rounds};
use crate::round::{RoundError, look_ahead, run_round, shipped_lut};
use crate::service::Service;

/// The round clock of the scheduling loop, on seconds since it started
/// (the first round at once): core's one rule, as fmsim's
/// (`fmsched_sim::engine::SimConfig::round_clock`). Rounds on events with
/// `scheduling.event_round_gap`; rounds for deadlines with a non-zero
/// `scheduling.deadline_round_gap`.
pub fn round_clock(s: &SchedulingConfig) -> round::RoundClock {
    let deadline_gap = s.deadline_round_gap;
    round::RoundClock::new(
        s.round_interval().as_secs_f64(),
        s.event_round_gap.map(|g| g.as_secs_f64()),
        (!deadline_gap.is_zero()).then_some(deadline_gap.as_secs_f64()),
        0.0,
    )
}

/// The round loop's clock: core's [`round::RoundClock`] (the rule fmsim
/// runs too) on seconds since the loop started.
struct LoopClock {
    epoch: tokio::time::Instant,
    rounds: round::RoundClock,
}

impl LoopClock {
    /// The first round due at once; rounds on events and for deadlines as
    /// configured (`scheduling.event_round_gap`, a non-zero
    /// `scheduling.deadline_round_gap`).
    fn new(s: &SchedulingConfig) -> Self {
        Self {
            epoch: tokio::time::Instant::now(),
            rounds: round_clock(s),
        }
    }

    /// Seconds on the clock of an instant (negative before the loop began).
    fn secs(&self, t: tokio::time::Instant) -> f64 {
        if t >= self.epoch {
            t.duration_since(self.epoch).as_secs_f64()
        } else {
            -self.epoch.duration_since(t).as_secs_f64()
        }
    }

    /// The instant of seconds on the clock.
    fn at(&self, s: f64) -> tokio::time::Instant {
        self.epoch + std::time::Duration::from_secs_f64(s.max(0.0))
    }

    /// When the next round is due.
    fn next(&self) -> tokio::time::Instant {
        self.at(self.rounds.next_s())
    }
}

/// Runs rounds every `scheduling.round_interval()` until the task is
/// aborted; with a `prewarm_lead`, a look-ahead round that long before each
/// round. A replica that does not lead runs none.
/// Sleeps until `lead` before the next round. The leader looks every
/// [`POLICY_POLL`] for a policy set live (an operator, AutoSched) whose
/// shorter interval brings that round forward, so a change out of a long
/// interval does not wait it out. With `scheduling.event_round_gap`, an
/// event ([`crate::leader::LeaderMemory::wake_round`]) brings it forward too.
async fn sleep_towards(state: &Service, clock: &mut LoopClock, lead: std::time::Duration) {
    loop {
        let now = tokio::time::Instant::now();
        let next = clock.next();
        let target = next.checked_sub(lead).unwrap_or(next);
        if now >= target {
            return;
        }
        let woke = tokio::select! {
            () = tokio::time::sleep_until(target.min(now + POLICY_POLL)) => false,
            () = state.leader.round_wake.notified(), if clock.rounds.wakes_on_events() => true,
        };
        if woke {
            // A submission or a task that ended: the round comes forward
            // by core's rule (for every event with rounds on events; only
            // for a job that would miss its deadline waiting, else).
            let now_s = clock.secs(tokio::time::Instant::now());
            let waits = state.leader.deadline_waits.needs_by(|t| clock.secs(t));
            if clock.rounds.on_event(now_s, waits) {
                tracing::debug!(
                    in_s = (clock.rounds.next_s() - now_s).max(0.0),
                    "an event (a submission, a task that ended, a deadline waiting) brings the next round forward"
                );
            }
            continue;
        }
        if tokio::time::Instant::now() >= target || !state.leadership.is_leader() {
            continue;
        }
        if let Ok(stored) = state.persistence.policy_setting().await {
            let s = state.config.scheduling.with_setting(stored.as_ref());
            if clock.rounds.next_within(s.round_interval().as_secs_f64()) {
                tracing::info!(policy = %s.policy, interval = ?s.round_interval(),
                    "policy set live with a shorter interval; next round brought forward");
            }
        }
    }
}

/// How often a sleeping leader looks for a policy set live.
const POLICY_POLL: std::time::Duration = std::time::Duration::from_secs(2);

pub async fn scheduling_loop(state: Service) {
    let lut = match shipped_lut() {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "no throughput table; scheduling disabled");
            return;
        }
    };
    let e = &state.config.estimates;
    let est = match EstimatorClient::new(e.endpoint.as_deref(), e.timeout) {
        Ok(est) => est,
        Err(err) => {
            tracing::error!(error = %err, "estimator client; scheduling disabled");
            return;
        }
    };
    let est = Arc::new(est);
    if est.is_remote() {
        tracing::info!(endpoint = ?e.endpoint, "estimates from the estimator service");
    }
    // The stuck-round watch lives as long as this loop.
    struct AbortOnDrop(tokio::task::JoinHandle<()>);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let _watch = AbortOnDrop(tokio::spawn(watch_rounds(state.clone())));
    let _lane = AbortOnDrop(tokio::spawn(super::prompt_lane::lane_loop(
        state.clone(),
        lut.clone(),
        est.clone(),
    )));
    let lead = state.config.scheduling.effective_prewarm_lead();
    if !lead.is_zero() {
        tracing::info!(
            ?lead,
            "pipeline switch: look-ahead rounds send standby hints"
        );
    }
    // The settings in force: the configuration's until a round reads a
    // policy set through the admin API (its interval then paces the loop).
    let mut sched = state.config.scheduling.clone();
    let mut clock = LoopClock::new(&sched);
    loop {
        sleep_towards(&state, &mut clock, std::time::Duration::ZERO).await;
        let started = tokio::time::Instant::now();
        clock.rounds.round_started(clock.secs(started));
        if !state.leadership.is_leader() {
            continue; // a standby decides nothing
        }
        let result = run_round(&state, &lut, &est).await;
        end_round(&state, true);
        let took = started.elapsed().as_secs_f64();
        let timed_out = matches!(result, Err(RoundError::DecideTimedOut(_)));
        state.metrics.update(|m| {
            m.decide_timeouts += u64::from(timed_out);
            m.rounds += 1;
            m.round_seconds_sum += took;
            m.last_round_seconds = took;
        });
        match result {
            Ok(r) => {
                tracing::debug!(generation = r.generation, jobs = r.jobs, running = r.running,
                    completed = r.completed, failed = r.failed, took = ?started.elapsed(), "scheduling round");
                if let Some(s) = r.scheduling
                    && (s.policy != sched.policy
                        || s.knobs != sched.knobs
                        || s.interval != sched.interval)
                {
                    tracing::info!(policy = %s.policy, knobs = ?s.knobs, interval = ?s.round_interval(),
                        "policy in force changed (admin API); next round after this interval");
                    sched = s;
                    clock
                        .rounds
                        .reset_interval(sched.round_interval().as_secs_f64());
                }
            }
            Err(e) if e.is_fenced() => {
                state.metrics.update(|m| m.fenced_rounds += 1);
                tracing::warn!(error = %e, "round discarded: this replica no longer leads (nothing written or pushed)");
            }
            Err(e) => tracing::warn!(error = %e, "scheduling round failed; retrying next interval"),
        }
        // Ymir §6.2: predict the next round `lead` before it and let the
        // tasks it starts prepare their data loaders in standby.
        let lead = sched.effective_prewarm_lead();
        if lead.is_zero() {
            continue;
        }
        sleep_towards(&state, &mut clock, lead).await;
        if !state.leadership.is_leader() {
            continue;
        }
        let switch_at = Utc::now() + lead;
        let ahead = look_ahead(&state, &lut, &est, switch_at).await;
        end_round(&state, false);
        match ahead {
            Ok(hints) if hints > 0 => tracing::debug!(hints, "look-ahead round"),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "look-ahead round failed; no standby hints this round")
            }
        }
    }
}
