//! AutoSched's tuner as the service keeps it for the process's life: the
//! profiles and catalog it simulates with, and the tuner whose rejection
//! model learns from each tuning. The tuning itself is
//! `round::autosched`.

use std::sync::{Arc, Mutex};

use fmsched_estimator::lut::Lut;
use fmsched_sim::catalog::Catalog;
use fmsched_sim::tune::Tuner;

/// The tuner kept across tunings (its rejection model learns from each),
/// with the profiles and catalog it simulates with.
pub struct Autosched {
    pub(crate) lut: Arc<Lut>,
    pub(crate) catalog: Arc<Catalog>,
    pub(crate) tuner: Mutex<Option<Tuner>>,
}

impl Autosched {
    /// Loads the shipped profiles and catalog once, for the process's life.
    pub fn new() -> anyhow::Result<Self> {
        let lut = Arc::new(fmsched_estimator::analytic::default_lut()?);
        let catalog = Arc::new(Catalog::default_synthetic());
        Ok(Self {
            lut,
            catalog,
            tuner: Mutex::new(None),
        })
    }
}
