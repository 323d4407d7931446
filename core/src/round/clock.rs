//! The round clock's event rules: when an event (or a waiting deadline)
//! brings the next round forward. The service's loop and fmsim's event
//! queue both ask these; neither keeps a copy.

/// When the next round runs once an event came (a job submitted, a task
/// ended: GPUs freed, a profiling run done), seconds on one clock: at once,
/// but no sooner than `gap_s` after the last round began, and never later
/// than the periodic round `next_s`. A round per interval leaves a new
/// short job up to an interval to wait, twice when it profiles first; with
/// deadlines of 1.1–2× a job's time alone that wait alone misses them
/// (docs/fmsim/deadlines.md, "Rounds on events"). The service and fmsim both run
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
/// default policy 8–15 % of its mean JCT (docs/fmsim/deadlines.md, "Rounds for
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

/// When the next round runs: the one rule the service's round loop and
/// fmsim's event loop both keep, on seconds of one clock (the service's
/// since its loop started, fmsim's virtual time).
///
/// - A round starts when it is due; the next periodic one is an interval
///   after its start ([`Self::round_started`]).
/// - With an event gap (`scheduling.event_round_gap`, `fmsim
///   --event-gap`), every event brings the next round forward
///   ([`round_after_event`]).
/// - Else, with a deadline gap (`scheduling.deadline_round_gap`, `fmsim
///   --deadline-gap`), an event brings it forward only for a job with a
///   deadline that waiting for the periodic round would make miss it
///   ([`round_for_deadline`], each waiting job's need and deadline).
/// - A shorter interval set live brings the next round forward at once,
///   counted from the last round's start ([`Self::next_within`]); the
///   round that reads a changed policy counts the next one from its own
///   start ([`Self::reset_interval`]); a changed interval otherwise takes
///   effect from the round after the one already due
///   ([`Self::set_interval`]).
///
/// Pure: the callers read their own clocks and pass the times in.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundClock {
    interval_s: f64,
    event_gap_s: Option<f64>,
    deadline_gap_s: Option<f64>,
    next_s: f64,
    last_started_s: f64,
}

impl RoundClock {
    /// A clock whose first round is due at `first_s`, then every
    /// `interval_s`. `event_gap_s`: rounds on events (None: off).
    /// `deadline_gap_s`: rounds for deadlines (None: off; not consulted
    /// while rounds on events are on).
    pub fn new(
        interval_s: f64,
        event_gap_s: Option<f64>,
        deadline_gap_s: Option<f64>,
        first_s: f64,
    ) -> Self {
        Self {
            interval_s,
            event_gap_s,
            deadline_gap_s,
            next_s: first_s,
            last_started_s: f64::NEG_INFINITY,
        }
    }

    /// When the next round is due.
    pub fn next_s(&self) -> f64 {
        self.next_s
    }

    /// When the last round started (`-∞` before the first).
    pub fn last_started_s(&self) -> f64 {
        self.last_started_s
    }

    /// The interval in force.
    pub fn interval_s(&self) -> f64 {
        self.interval_s
    }

    /// Whether a round is due at `now_s`.
    pub fn is_due(&self, now_s: f64) -> bool {
        now_s >= self.next_s
    }

    /// Whether an event at all may bring a round forward (rounds on events
    /// or for deadlines are on): a caller that is told of none need not
    /// wake for events.
    pub fn wakes_on_events(&self) -> bool {
        self.event_gap_s.is_some() || self.deadline_gap_s.is_some()
    }

    /// An event came at `now_s` (a job submitted, a task ended, a
    /// profiling run done). `waits`: each job with a deadline that waits
    /// for its first start, as (what it needs from a round's start, its
    /// deadline). Returns whether the next round came forward.
    pub fn on_event(&mut self, now_s: f64, waits: impl IntoIterator<Item = (f64, f64)>) -> bool {
        let before = self.next_s;
        if let Some(gap) = self.event_gap_s {
            self.next_s = round_after_event(self.next_s, now_s, self.last_started_s, gap);
        } else if let Some(gap) = self.deadline_gap_s {
            for (need_s, by_s) in waits {
                self.next_s =
                    round_for_deadline(self.next_s, now_s, self.last_started_s, gap, need_s, by_s);
            }
        }
        self.next_s < before
    }

    /// A round started at `now_s`: the next periodic one is due an
    /// interval later.
    pub fn round_started(&mut self, now_s: f64) {
        self.last_started_s = now_s;
        self.next_s = now_s + self.interval_s;
    }

    /// The interval from the round after the one already due.
    pub fn set_interval(&mut self, interval_s: f64) {
        self.interval_s = interval_s;
    }

    /// The interval from the last round's start: the next round is due
    /// `interval_s` after it (a round that changed the policy in force).
    pub fn reset_interval(&mut self, interval_s: f64) {
        self.interval_s = interval_s;
        self.next_s = self.last_started_s + interval_s;
    }

    /// A shorter interval was set live and is not in force yet: the next
    /// round comes no later than `interval_s` after the last one started
    /// (the interval itself changes when the round that reads it says so,
    /// [`Self::reset_interval`]). Returns whether it came forward.
    pub fn next_within(&mut self, interval_s: f64) -> bool {
        let sooner = self.last_started_s + interval_s;
        if sooner < self.next_s {
            self.next_s = sooner;
            true
        } else {
            false
        }
    }
}
