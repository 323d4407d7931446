//! fmsched's estimator maths: everything the scheduler needs to know about
//! a job's future — iterations to converge (loss-curve fit, Ymir §4.2),
//! transfer gains between jobs (Task2Vec, Ymir §4.1), time per iteration
//! (throughput lookup table, Ymir §4.3), the round's time table with
//! `TranWt` (Eq. 5, 12–13), layer elasticity (ICEFROG §III) and deadline
//! estimates (UniSched §5.3).
//!
//! Pure: no IO, no async, no clock. The simulator (`fmsim`), the scheduler's
//! in-process fallback and the estimator service (`estimator-svc`, the gRPC
//! and Postgres shell around this crate) all run this code.

pub mod analytic;
pub mod curve_prior;
pub mod deadline;
pub mod fit;
pub mod footprint;
pub mod icefrog;
pub mod loss_curve;
pub mod loss_prior;
pub mod lut;
pub mod times;
pub mod transfer;
