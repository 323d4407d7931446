//! The round clock's event rules: when an event (or a waiting deadline)
//! brings the next round forward. The service's loop and fmsim's event
//! queue both ask these; neither keeps a copy.

/// When the next round runs once an event came (a job submitted, a task
/// ended: GPUs freed, a profiling run done), seconds on one clock: at once,
/// but no sooner than `gap_s` after the last round began, and never later
/// than the periodic round `next_s`. A round per interval leaves a new
/// short job up to an interval to wait, twice when it profiles first; with
/// deadlines of 1.1–2× a job's time alone that wait alone misses them
/// (docs/fmsim.md, "Rounds on events"). The service and fmsim both run
/// this rule (`scheduling.event_round_gap`, `fmsim --event-gap`).
pub fn round_after_event(next_s: f64, now_s: f64, last_started_s: f64, gap_s: f64) -> f64 {
    next_s.min(now_s.max(last_started_s + gap_s))
}

/// When the next round runs once a job with a deadline is waiting to start
/// (it arrived, its profiling run ended, GPUs were freed): as for any event
/// ([`round_after_event`]) when starting it at the periodic round `next_s`
/// and running `need_s` (its time alone at its request, with its starts)
/// would finish after `deadline_s` while starting now would not; else the
/// periodic round. Only such a job brings the round forward, so a periodic
/// round still finds the other arrivals waiting together (the pairs Ymir
/// merges): rounds on every event meet the same deadlines but cost the
/// default policy 8–15 % of its mean JCT (docs/fmsim.md, "Rounds for
/// deadlines"). The service and fmsim both run this rule
/// (`scheduling.deadline_round_gap`, `fmsim --deadline-gap`).
pub fn round_for_deadline(
    next_s: f64,
    now_s: f64,
    last_started_s: f64,
    gap_s: f64,
    need_s: f64,
    deadline_s: f64,
) -> f64 {
    if next_s + need_s > deadline_s && now_s + need_s <= deadline_s {
        round_after_event(next_s, now_s, last_started_s, gap_s)
    } else {
        next_s
    }
}
