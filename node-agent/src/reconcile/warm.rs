//! Warm processes (PromptTuner's pools on the node): an idle trainer kept
//! with its model loaded, handed the next request of its model, released
//! after its idle time.

use std::collections::BTreeMap;

use fmsched_proto::v1 as pb;

use crate::reconcile::{Known, Reconciler};

/// A process of a finished `warm` task waiting for the next task of its
/// model (keyed by its process id in the driver).
#[derive(Clone, Debug)]
pub(crate) struct WarmProc {
    model: String,
    command: Vec<String>,
    /// GPU indices, sorted.
    gpus: Vec<u32>,
    since: std::time::Instant,
}

/// Why a warm process is stopped (counted apart in [`SwitchStats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WarmStop {
    /// Idle past the plan's `warm_idle_release`.
    Idle,
    /// The plan gives its GPUs to another task.
    Needed,
    /// It could not take the task it was handed.
    Failed,
}

impl WarmStop {
    fn reason(self) -> &'static str {
        match self {
            WarmStop::Idle => "idle past the warm release",
            WarmStop::Needed => "the plan needs its GPUs",
            WarmStop::Failed => "it could not take its task",
        }
    }
}

/// Idle warm processes are stopped after this long unless the plan says
/// otherwise (PromptTuner §4.6.3.3: 60 s).
pub const WARM_IDLE_RELEASE: std::time::Duration = std::time::Duration::from_secs(60);

impl Reconciler {
    pub(super) fn warm_procs(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, WarmProc>> {
        self.warm.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps the process of finished task `id` as a warm process if it was
    /// launched warm and reported `warm` (waiting up to 2 s for that report
    /// after its `done`). Returns whether it did.
    pub(super) async fn park_warm(&self, known: &mut BTreeMap<String, Known>, id: &str) -> bool {
        let Some((model, command)) = known.get(id).and_then(|k| k.warm.clone()) else {
            return false;
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            match self.driver.status(id).await {
                Some(s) if s.running && s.observed.warm => break,
                Some(s)
                    if s.running
                        && !s.observed.done.is_empty()
                        && std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                _ => return false,
            }
        }
        let Some(k) = known.remove(id) else {
            return false;
        };
        self.gpus.process_stopped(k.pid);
        let mut gpus = k.gpus;
        gpus.sort_unstable();
        tracing::info!(task = id, %model, ?gpus, "kept warm: the model stays loaded for the next task");
        self.warm_procs().insert(
            id.to_string(),
            WarmProc {
                model,
                command,
                gpus,
                since: std::time::Instant::now(),
            },
        );
        true
    }

    /// Pairs the plan's `warm` tasks that do not run yet with warm
    /// processes of their model, command and exact GPUs (task → process),
    /// and stops the warm processes that are idle past the release or whose
    /// GPUs the plan gives to anything else.
    /// The newest plan's idle release for warm processes.
    pub(super) fn warm_release(&self) -> std::time::Duration {
        *self
            .warm_idle_release
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub(super) async fn claim_warm(&self, plan: &pb::NodePlan) -> BTreeMap<String, String> {
        let release = self.warm_release();
        let mut claimed = BTreeMap::new();
        let mut needed: Vec<u32> = Vec::new();
        for t in &plan.tasks {
            if t.phase != pb::DesiredPhase::Running as i32 {
                continue;
            }
            let Ok(mut gpus) = self.indices(&t.gpu_uuids) else {
                continue;
            };
            gpus.sort_unstable();
            if self
                .driver
                .status(&t.task_id)
                .await
                .is_some_and(|s| s.running)
            {
                needed.extend(gpus);
                continue;
            }
            let model = t.tasks.first().map(|x| x.model.as_str());
            let taken: Vec<&String> = claimed.values().collect();
            let found = t
                .warm
                .then(|| {
                    self.warm_procs()
                        .iter()
                        .find(|(id, w)| {
                            w.gpus == gpus
                                && Some(w.model.as_str()) == model
                                && w.command == t.command
                                && !taken.contains(id)
                        })
                        .map(|(id, _)| id.clone())
                })
                .flatten();
            match found {
                Some(id) => {
                    claimed.insert(t.task_id.clone(), id);
                }
                None => needed.extend(gpus),
            }
        }
        let now = std::time::Instant::now();
        let to_stop: Vec<(String, WarmStop)> = self
            .warm_procs()
            .iter()
            .filter(|(id, _)| !claimed.values().any(|c| c == *id))
            .filter_map(|(id, w)| {
                if w.gpus.iter().any(|g| needed.contains(g)) {
                    Some((id.clone(), WarmStop::Needed))
                } else if now.duration_since(w.since) >= release {
                    Some((id.clone(), WarmStop::Idle))
                } else {
                    None
                }
            })
            .collect();
        for (id, why) in to_stop {
            self.stop_warm(&id, why).await;
        }
        claimed
    }

    /// Stops warm process `id` (SIGTERM: it has nothing to save) and
    /// forgets it.
    pub(super) async fn stop_warm(&self, id: &str, why: WarmStop) {
        let Some(w) = self.warm_procs().remove(id) else {
            return;
        };
        if let Err(e) = self.driver.terminate(id).await {
            tracing::debug!(process = id, error = %e, "warm process already gone");
        }
        self.driver.forget(id).await;
        let idle = w.since.elapsed();
        if why == WarmStop::Idle {
            self.count(|c| c.warm_released += 1);
        } else {
            self.count(|c| c.warm_evicted += 1);
        }
        tracing::info!(process = id, model = %w.model, gpus = ?w.gpus, ?idle, reason = why.reason(), "warm process stopped");
    }

    /// Stops warm processes idle past the newest plan's release, and
    /// forgets those that ended by themselves (between plans).
    pub async fn expire_warm(&self) {
        let release = self.warm_release();
        let ids: Vec<(String, bool)> = self
            .warm_procs()
            .iter()
            .map(|(id, w)| (id.clone(), w.since.elapsed() >= release))
            .collect();
        for (id, idle) in ids {
            if idle {
                self.stop_warm(&id, WarmStop::Idle).await;
            } else if !self.driver.status(&id).await.is_some_and(|s| s.running) {
                self.warm_procs().remove(&id);
                self.driver.forget(&id).await;
                tracing::warn!(process = %id, "warm process ended by itself");
            }
        }
    }

    /// The warm processes, for heartbeats.
    pub fn warm_report(&self) -> Vec<pb::WarmProcess> {
        let inv = self.gpus.inventory();
        self.warm_procs()
            .values()
            .map(|w| pb::WarmProcess {
                model: w.model.clone(),
                gpu_uuids: w
                    .gpus
                    .iter()
                    .filter_map(|&g| inv.iter().find(|i| i.index == g).map(|i| i.uuid.clone()))
                    .collect(),
            })
            .collect()
    }
}
