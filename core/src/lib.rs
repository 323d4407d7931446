//! Pure core of fmsched: domain types, validation, the job state machine and
//! node liveness rules, the scheduling policies, and the scheduling round
//! the service and the simulator share (`round`).
//!
//! This crate does no IO: no tokio, sqlx, tonic or NVML, and it never reads
//! the clock — callers pass `now`. The scheduler service and the simulator
//! both build on it, so a decision made here is made the same way in both.

pub mod field_error;
pub mod hash;
pub mod ids;
pub mod job;
pub mod models;
pub mod node;
pub mod policy;
pub mod queue;
pub mod round;
pub mod slo;
pub mod trainer;
pub mod validate;

pub use ids::{GpuUuid, JobId, NodeId, UserName};
pub use job::{
    DatasetSpec, FrozenLayers, HyperParameters, JobKind, JobSpec, JobState, Launch,
    LayerElasticity, MetricTarget, Optimizer, PetlMethod, PromptTuning, Resources, SloClass,
    Target, Workers,
};
pub use models::{ModelCatalog, ModelInfo};
pub use node::{Liveness, NodeState};
pub use validate::{FieldError, Limits, ValidationContext};
