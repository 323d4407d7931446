//! The Prompt Bank as the fake trainer reads it: prompt features, their
//! scores against a task, and the best candidate picked.

use std::path::Path;

use anyhow::Context;
use fmsched_core::trainer::{Report, TaskAssignment};

use crate::world::unit;

/// The fake world's prompt features (PromptTuner §4.4.3.1): a prompt tuned
/// for `task` of `model` has these 16 activation features — the task's own
/// direction plus a small per-job draw, so prompts of one task are alike
/// and prompts of other tasks are not.
pub(crate) fn prompt_features(model: &str, task: &str, job_id: &str) -> Vec<f64> {
    (0..16)
        .map(|d| {
            2.0 * unit(&format!("{model}|{task}|prompt{d}")) - 1.0
                + 0.1 * (unit(&format!("{job_id}|prompt{d}")) - 0.5)
        })
        .collect()
}

/// The fake world's Eq. 4.1: the mean loss of `task` started from a bank
/// candidate's prompt, without tuning — 1 + the cosine distance between
/// the candidate's features (its `prompt.json`) and the task's own; an
/// unreadable candidate scores +∞.
fn prompt_score(model: &str, task: &str, c: &fmsched_core::trainer::BankCandidate) -> f64 {
    // A prompt file, or a prompt directory holding `prompt.json` (the
    // Python helper's output).
    let path = Path::new(&c.path);
    let file = if path.is_dir() {
        path.join("prompt.json")
    } else {
        path.to_path_buf()
    };
    let features = std::fs::read(file)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| serde_json::from_value::<Vec<f64>>(v["features"].clone()).ok());
    match features {
        Some(f) if !f.is_empty() => {
            let own = prompt_features(model, task, "");
            1.0 + fmsched_core::policy::prompttuner::cosine_distance(&f, &own)
        }
        _ => {
            eprintln!(
                "fake-trainer: Prompt Bank: {} has no features; skipped",
                c.path
            );
            f64::INFINITY
        }
    }
}

/// Picks a prompt-tuning task's initial prompt from its Prompt Bank file
/// (the contract's two-layer walk). The pick's transfer gain: a prompt
/// with the task's own features (score 1) speeds learning up 1.5 times,
/// an unrelated one (score ≥ 2) not at all.
pub(crate) fn pick_from_bank(
    t: &TaskAssignment,
    file: &str,
) -> anyhow::Result<Option<(Report, f64)>> {
    use fmsched_core::trainer::{BankCandidate, bank_clusters, walk_bank};
    let text = std::fs::read(file).with_context(|| format!("prompt_bank: reading {file}"))?;
    let bank: Vec<BankCandidate> =
        serde_json::from_slice(&text).with_context(|| format!("prompt_bank: {file}"))?;
    let clusters = bank_clusters(&bank);
    let Some((best, score, scored)) = walk_bank(&clusters, |c| prompt_score(&t.model, &t.task, c))
    else {
        return Ok(None);
    };
    if !score.is_finite() {
        return Ok(None);
    }
    let gain = 0.5 * (2.0 - score).clamp(0.0, 1.0);
    eprintln!(
        "fake-trainer: Prompt Bank: starting from job {}'s prompt (score {score:.3}; {scored} of {} prompts scored; transfer gain {gain:.3})",
        best.id,
        bank.len()
    );
    let r = Report::PromptInit {
        job_id: t.job_id.clone(),
        from: best.id.clone(),
        score,
        scored: scored as u32,
        candidates: bank.len() as u32,
    };
    Ok(Some((r, gain)))
}
