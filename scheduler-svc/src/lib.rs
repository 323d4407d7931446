//! fmsched scheduler service: the job and cluster APIs, agent sessions and
//! node liveness over cluster state kept in Postgres.
//!
//! Layout: [`config`] (layered settings), [`auth`] (tokens), [`persistence`]
//! (the only sqlx user), [`registry`] (observed node state), [`api`] (gRPC
//! handlers), [`leadership`] (the leader lease and the fence of its term),
//! [`round`] (the scheduling loop: observe, load inputs, decide with the
//! shared round of `fmsched_core`, commit fenced, push plans), [`server`]
//! (wiring and background tasks).

pub mod api;
pub mod auth;
pub mod config;
pub mod estimates;
pub mod leader;
pub mod leadership;
pub mod metrics;
pub mod persistence;
pub mod registry;
pub mod round;
pub mod server;
pub mod service;
pub mod tuner;
