//! fmsched node agent: discovers this host's GPUs (NVML, or the fake backend
//! on hosts without a driver), keeps a session with the scheduler, and
//! reports telemetry on every heartbeat.

pub mod config;
pub mod driver;
pub mod gpu;
pub mod isolation;
pub mod metrics;
pub mod reconcile;
pub mod session;
