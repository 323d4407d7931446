//! The Prompt Bank (PromptTuner §4.4.3), the scheduler's half: tuned
//! prompts of completed prompt-tuning jobs are stored per model in
//! Postgres (table `prompt_bank`, with their activation features); the
//! leader keeps each model's two-layer index (core [`PromptBank`], over
//! the features hashed to at most 256 dimensions, `index_features`) in
//! memory, checked against the stored prompts before every use and
//! rebuilt when they differ (a new leader, a commit that failed) or when
//! inserts moved `round(√C)` away from its clusters. A prompt-tuning job
//! that starts afresh without an initial prompt gets its model's index
//! (`TrainerTask.prompt_bank`); its trainer scores the candidates.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use fmsched_core::JobId;
use fmsched_proto::v1 as pb;

use super::RoundError;
use crate::leader::Indexed;
use crate::persistence::BankPrompt;
use crate::service::Service;

/// Each of `models`' index, as stored now (models without prompts are
/// left out).
pub(crate) async fn indexes(
    state: &Service,
    models: &[String],
) -> Result<BTreeMap<String, Arc<Indexed>>, RoundError> {
    let mut out = BTreeMap::new();
    if models.is_empty() {
        return Ok(out);
    }
    let stored_ids = state.persistence.prompt_bank_ids(models).await?;
    let mut stale = Vec::new();
    for (model, ids) in &stored_ids {
        match state.leader.prompt_banks.get(model) {
            Some(i) if &i.ids == ids && !i.bank.wants_rebuild() => {
                out.insert(model.clone(), i);
            }
            _ => stale.push(model.clone()),
        }
    }
    if stale.is_empty() {
        return Ok(out);
    }
    let cap = state.config.scheduling.prompt_bank_cap.max(1);
    for (model, rows) in state.persistence.prompt_bank(&stale).await? {
        let started = std::time::Instant::now();
        let built = tokio::task::spawn_blocking(move || Indexed::build(&rows, cap))
            .await
            .map_err(|e| RoundError::Join(format!("building the Prompt Bank index: {e}")))?;
        tracing::info!(%model, prompts = built.ids.len(), clusters = built.bank.clusters(),
            took = ?started.elapsed(), "Prompt Bank index built");
        state.metrics.update(|m| m.prompt_bank_builds += 1);
        out.insert(
            model.clone(),
            state.leader.prompt_banks.put(&state.metrics, &model, built),
        );
    }
    Ok(out)
}

/// Files the round's newly tuned prompts (`new`) in their models' banks:
/// the rows to add and the prompts evicted, for the round's commit. The
/// leader's indexes take them at once; should the commit fail, they differ
/// from the stored prompts and are rebuilt at their next use.
pub(crate) async fn file(
    state: &Service,
    new: Vec<BankPrompt>,
) -> Result<(Vec<BankPrompt>, Vec<JobId>), RoundError> {
    let models: Vec<String> = new
        .iter()
        .map(|b| b.model.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    // Fresh indexes in the leader's memory (the returned handles dropped,
    // so each is changed in place).
    drop(indexes(state, &models).await?);
    let cap = state.config.scheduling.prompt_bank_cap.max(1);
    let mut evicted = Vec::new();
    for b in &new {
        let mut i = state
            .leader
            .prompt_banks
            .take(&b.model)
            .unwrap_or_else(|| Indexed::build(&[], cap));
        let out = i.insert(b);
        tracing::info!(job_id = %b.job, model = %b.model, prompts = i.ids.len(),
            clusters = i.bank.clusters(), evicted = ?out, "tuned prompt filed in the Prompt Bank");
        evicted.extend(out);
        state.leader.prompt_banks.put(&state.metrics, &b.model, i);
    }
    Ok((new, evicted))
}

/// Whether `job` starts from its model's Prompt Bank when it starts afresh:
/// a prompt-tuning job without an initial prompt of its own.
pub(crate) fn draws_from_bank(job: &crate::persistence::JobRecord) -> bool {
    job.spec.kind == fmsched_core::JobKind::PromptTuning
        && job
            .spec
            .prompt_tuning
            .as_ref()
            .is_none_or(|p| p.initial_prompt.is_empty())
}

/// The banks a plan's trainers get, by model: those of the prompt-tuning
/// jobs it runs that draw from the bank and have no checkpoint yet.
pub(crate) async fn for_plan(
    state: &Service,
    live: &BTreeMap<JobId, crate::persistence::JobRecord>,
    assignments: &[crate::persistence::Assignment],
    progress: &BTreeMap<JobId, (u64, Option<String>)>,
) -> Result<BTreeMap<String, Vec<pb::PromptCandidate>>, RoundError> {
    let models: Vec<String> = assignments
        .iter()
        .filter(|a| !a.profile && progress.get(&a.job).and_then(|p| p.1.as_ref()).is_none())
        .filter_map(|a| live.get(&a.job))
        .filter(|j| draws_from_bank(j))
        .map(|j| j.spec.model.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    Ok(indexes(state, &models)
        .await?
        .into_iter()
        .map(|(m, i)| (m, i.candidates()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(k: u128, angle: f64) -> BankPrompt {
        BankPrompt {
            job: JobId(uuid::Uuid::from_u128(k)),
            model: "gpt2".into(),
            location: format!("/out/{k}/prompt.json"),
            features: vec![angle.cos(), angle.sin()],
        }
    }

    /// The index a trainer gets names every stored prompt with its file,
    /// one medoid per cluster; a filed prompt past the cap evicts one, and
    /// the ids and files follow.
    #[test]
    fn prompt_bank_index_carries_the_files_and_follows_evictions() {
        let stored: Vec<BankPrompt> = (0..4)
            .map(|k| row(k, if k < 2 { 0.0 } else { 3.0 } + 0.01 * k as f64))
            .collect();
        let mut i = Indexed::build(&stored, 4);
        let c = i.candidates();
        assert_eq!(c.len(), 4);
        assert_eq!(c.iter().filter(|c| c.medoid).count(), 2, "K = √4 clusters");
        for x in &c {
            let k = uuid::Uuid::parse_str(&x.job_id).unwrap().as_u128();
            assert_eq!(x.path, format!("/out/{k}/prompt.json"));
        }
        let evicted = i.insert(&row(9, 3.05)).expect("over the cap of 4");
        assert!(
            evicted.0.as_u128() >= 2,
            "from the cluster near 3.0: {evicted}"
        );
        assert_eq!(i.ids.len(), 4);
        assert!(!i.ids.contains(&evicted) && !i.locations.contains_key(&evicted));
        assert!(
            i.candidates()
                .iter()
                .any(|c| c.path == "/out/9/prompt.json")
        );
        assert!(
            i.candidates()
                .iter()
                .all(|c| c.job_id != evicted.to_string())
        );
    }
}
