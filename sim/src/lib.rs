//! The trace-driven simulator of fmsched as a library: the engine, the task
//! catalog, workloads and their generators, AutoSched's tuner, Lyra's loans
//! and the reports. It replays a workload on a simulated cluster under any
//! policy of `fmsched_core::policy` — the same code the scheduler service
//! runs — with job speeds from the estimator's throughput lookup table and
//! work from a task catalog. The `fmsim` binary is its command line; the
//! scheduler links this library for AutoSched.

pub mod catalog;
pub mod cluster;
pub mod engine;
pub mod generate;
pub mod iceeval;
pub mod loans;
pub mod parallel;
pub mod report;
pub mod requests;
pub mod rng;
pub mod tune;
pub mod workload;
