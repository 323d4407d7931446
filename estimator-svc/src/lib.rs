//! fmsched estimator service: the gRPC and Postgres shell around the pure
//! estimator maths of `fmsched-estimator` (re-exported here under their
//! old paths). `service` answers `EstimatorService`; `persistence` keeps
//! what it learns (measured step times, imported profiles, merge outcomes)
//! in the `fmsched_estimator` schema.

pub use fmsched_estimator::{
    analytic, curve_prior, fit, icefrog, loss_curve, loss_prior, lut, times, transfer,
};

pub mod persistence;
pub mod server;
pub mod service;
