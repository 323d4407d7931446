//! The leader's in-memory Prompt Bank indexes, one per model (PromptTuner
//! §4.4.3; the IO around them is `round::prompt_bank`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use fmsched_core::JobId;
use fmsched_core::policy::prompttuner::{Candidate, PromptBank, index_features};
use fmsched_proto::v1 as pb;

use crate::metrics::SchedulerMetrics;
use crate::persistence::BankPrompt;

/// One model's index and where its prompts are.
#[derive(Clone)]
pub struct Indexed {
    pub(crate) bank: PromptBank,
    /// The prompts in the bank (ids), as stored.
    pub(crate) ids: BTreeSet<JobId>,
    pub(crate) locations: BTreeMap<JobId, String>,
}

impl Indexed {
    pub(crate) fn build(stored: &[BankPrompt], cap: usize) -> Self {
        let candidates = stored
            .iter()
            .map(|b| Candidate {
                id: b.job.to_string(),
                features: index_features(&b.features),
            })
            .collect();
        Indexed {
            bank: PromptBank::build(candidates, None, cap),
            ids: stored.iter().map(|b| b.job).collect(),
            locations: stored.iter().map(|b| (b.job, b.location.clone())).collect(),
        }
    }

    /// Files `new` (PromptTuner §4.4.3.3: at the nearest medoid, evicting
    /// past the cap); returns the evicted prompt.
    pub(crate) fn insert(&mut self, new: &BankPrompt) -> Option<JobId> {
        let evicted = self.bank.insert(Candidate {
            id: new.job.to_string(),
            features: index_features(&new.features),
        });
        self.ids.insert(new.job);
        self.locations.insert(new.job, new.location.clone());
        let e = evicted.and_then(|e| e.parse::<JobId>().ok())?;
        self.ids.remove(&e);
        self.locations.remove(&e);
        Some(e)
    }

    /// The index as a trainer gets it.
    pub fn candidates(&self) -> Vec<pb::PromptCandidate> {
        self.bank
            .index()
            .into_iter()
            .filter_map(|(c, cluster, medoid)| {
                let job = c.id.parse::<JobId>().ok()?;
                Some(pb::PromptCandidate {
                    job_id: c.id.clone(),
                    path: self.locations.get(&job)?.clone(),
                    cluster,
                    medoid,
                })
            })
            .collect()
    }
}

/// The leader's indexes by model.
#[derive(Default)]
pub struct BankIndexes(Mutex<BTreeMap<String, Arc<Indexed>>>);

impl BankIndexes {
    pub(crate) fn get(&self, model: &str) -> Option<Arc<Indexed>> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(model)
            .cloned()
    }

    /// Takes `model`'s index out to change it (a copy only while another
    /// holder still reads it).
    pub(crate) fn take(&self, model: &str) -> Option<Indexed> {
        let i = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(model)?;
        Some(Arc::try_unwrap(i).unwrap_or_else(|shared| (*shared).clone()))
    }

    pub(crate) fn put(&self, metrics: &SchedulerMetrics, model: &str, i: Indexed) -> Arc<Indexed> {
        let n = i.ids.len() as u64;
        metrics.update(|m| {
            m.prompt_bank_prompts.insert(model.to_string(), n);
        });
        let i = Arc::new(i);
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(model.to_string(), i.clone());
        i
    }
}
