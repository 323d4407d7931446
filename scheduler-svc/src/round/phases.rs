//! The round's phases as the metrics see them: when each starts and ends,
//! how long a decision may take, and the watch that reports a round stuck
//! in one phase.

use crate::service::Service;

/// How long a round's decision (pure code on the blocking pool) may take
/// before the round gives up on it and the next round starts afresh: far
/// beyond any policy's time limit (MILP solves are themselves abandoned
/// [`fmsched_core::policy::solve_grace`] past theirs).
pub const DECIDE_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// A round in one phase this long is reported stuck (a warning naming the
/// phase, repeated every [`STUCK_ROUND`] while it lasts).
pub const STUCK_ROUND: std::time::Duration = std::time::Duration::from_secs(30);

/// Records that the round in progress entered `phase` (None: it ended),
/// keeping the time of the phase it leaves.
pub(crate) fn enter_phase(state: &Service, phase: Option<&'static str>) {
    state.metrics.update(|m| {
        if let Some((left, since)) = m.round_phase.take() {
            m.phases_in_progress
                .push((left, since.elapsed().as_secs_f64()));
        }
        m.round_phase = phase.map(|p| (p, std::time::Instant::now()));
    });
}

/// Ends the round in progress. A committing round's phase times become
/// the last round's and add to the sums; a look-ahead's are dropped (it
/// commits nothing, and runs between rounds).
pub(crate) fn end_round(state: &Service, committing: bool) {
    enter_phase(state, None);
    state.metrics.update(|m| {
        let phases = std::mem::take(&mut m.phases_in_progress);
        if committing {
            m.last_round_phases.clear();
            for (phase, s) in phases {
                *m.last_round_phases.entry(phase).or_default() += s;
                *m.round_phase_seconds_sum.entry(phase).or_default() += s;
            }
        }
    });
}

/// Reports a round stuck in one phase for [`STUCK_ROUND`] or more (the
/// scheduler cannot interrupt a blocked query or solve; this says where
/// it is, once per [`STUCK_ROUND`] while it lasts).
pub(crate) async fn watch_rounds(state: Service) {
    let mut reported = None;
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        let phase = state.metrics.values().round_phase;
        let stuck = phase.map(|(_, since)| since.elapsed()).unwrap_or_default();
        if let Some(p) = stuck_phase(phase, stuck, &mut reported) {
            tracing::warn!(
                phase = p,
                stuck_s = stuck.as_secs(),
                "scheduling round stuck: no progress in this phase (no plan is committed until it ends)"
            );
        }
    }
}

/// The watch's rule: the phase to report when the round in progress
/// (`phase`, entered `stuck` ago) has spent another [`STUCK_ROUND`] in it
/// since the last report; `reported` keeps what was said of which entry.
pub(crate) fn stuck_phase(
    phase: Option<(&'static str, std::time::Instant)>,
    stuck: std::time::Duration,
    reported: &mut Option<(&'static str, std::time::Instant, u64)>,
) -> Option<&'static str> {
    let Some((name, since)) = phase else {
        *reported = None;
        return None;
    };
    let periods = stuck.as_secs() / STUCK_ROUND.as_secs().max(1);
    let before = match *reported {
        Some((p, s, n)) if p == name && s == since => n,
        _ => 0,
    };
    (periods > before).then(|| {
        *reported = Some((name, since, periods));
        name
    })
}
