//! fmsched estimator: everything the scheduler needs to know about a job's
//! future — iterations to converge (loss-curve fit, Ymir §4.2), transfer
//! gains between jobs (Task2Vec, Ymir §4.1), time per iteration (throughput
//! lookup table, Ymir §4.3) and layer elasticity (ICEFROG §III).
//!
//! The math modules are pure (no IO, no clock) so the simulator links them
//! directly; `persistence` and `service` are the gRPC service's parts.

pub mod analytic;
pub mod fit;
pub mod icefrog;
pub mod loss_curve;
pub mod lut;
pub mod persistence;
pub mod server;
pub mod service;
pub mod times;
pub mod transfer;
