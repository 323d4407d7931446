//! fmsim: the trace-driven simulator of fmsched. It replays a workload on a
//! simulated cluster under any policy of `fmsched_core::policy` — the same
//! code the scheduler service runs — with job speeds from the estimator's
//! throughput lookup table and work from a task catalog.

pub mod catalog;
pub mod engine;
pub mod generate;
pub mod iceeval;
pub mod loans;
pub mod parallel;
pub mod report;
pub mod requests;
pub mod tune;
pub mod workload;
