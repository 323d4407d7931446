//! One training process's state: its tasks, checkpoints and steps.

use std::path::PathBuf;

use anyhow::Context;
use fmsched_core::trainer::{Control, Report, TaskAssignment};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use crate::bank::prompt_features;
use crate::report::{Reporter, write_atomic};
use crate::world::{Curve, fake_layer_variance, frozen_penalty_of, true_gain};

/// Per-task state, also what a checkpoint and the output weights store.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct TaskState {
    pub(crate) job_id: String,
    pub(crate) iteration: u64,
    pub(crate) samples: u64,
    pub(crate) done: bool,
    #[serde(default)]
    pub(crate) model: String,
    #[serde(default)]
    pub(crate) task: String,
    /// Iterations' worth of learning on this task (differs from `iteration`
    /// under a merge: faster with a positive gain, none with a negative one).
    #[serde(default)]
    pub(crate) effective: f64,
    /// Transfer gain inherited from the initial weights (temporal merges).
    #[serde(default)]
    pub(crate) gain: f64,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct Checkpoint {
    pub(crate) format: String,
    pub(crate) tasks: Vec<TaskState>,
}

/// Seconds per iteration with `ℓ` frozen layers (None: no profile fits).
pub(crate) type StepOf = Box<dyn Fn(u32) -> Option<f64>>;

pub(crate) struct Trainer {
    pub(crate) tasks: Vec<TaskAssignment>,
    pub(crate) state: Vec<TaskState>,
    pub(crate) curves: Vec<Curve>,
    pub(crate) profile: bool,
    /// Learning speed of each task in this process (1 alone; `1 + G` or 0
    /// in a spatial merge).
    pub(crate) speed: Vec<f64>,
    pub(crate) ckpt_dir: PathBuf,
    pub(crate) out_dir: PathBuf,
    pub(crate) seconds_per_iteration: f64,
    pub(crate) samples_per_epoch: Vec<u64>,
    pub(crate) reporter: Reporter,
    pub(crate) noise: u64,
    /// Layer elasticity: the frozen layers it trains with, the model's
    /// layers, the speed of each task without the frozen penalty, the step
    /// time by frozen layers, and the control file it reads each epoch.
    pub(crate) frozen: u32,
    pub(crate) layers: u32,
    pub(crate) base_speed: Vec<f64>,
    pub(crate) step_of: StepOf,
    pub(crate) control: Option<PathBuf>,
    /// Another process shares its GPU: it runs at λ = 0.9 of its speed
    /// (ICEFROG Eq. 8), from launch or from the control file.
    pub(crate) shared: bool,
    /// Rank 0 of a job over several nodes: the other nodes' processes.
    pub(crate) followers: Vec<tokio::net::tcp::OwnedWriteHalf>,
}

impl Trainer {
    /// Step time over the step time alone: 1/λ on a shared GPU.
    pub(crate) fn share_factor(&self) -> f64 {
        if self.shared {
            1.0 / fmsched_core::policy::SHARED_SLOWDOWN
        } else {
            1.0
        }
    }

    pub(crate) fn next_noise(&mut self) -> f64 {
        self.noise ^= self.noise << 13;
        self.noise ^= self.noise >> 7;
        self.noise ^= self.noise << 17;
        (self.noise >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    }

    pub(crate) async fn checkpoint(&mut self) -> anyhow::Result<()> {
        let it = self.state.iter().map(|s| s.iteration).max().unwrap_or(0);
        let path = self.ckpt_dir.join(format!("ckpt-{it:09}.json"));
        let c = Checkpoint {
            format: "fmsched-fake-trainer/2".into(),
            tasks: self.state.clone(),
        };
        write_atomic(&path, &serde_json::to_vec_pretty(&c)?)?;
        self.reporter
            .send(&Report::Checkpoint {
                path: path.display().to_string(),
                iteration: it,
            })
            .await;
        self.tell_followers(&format!("ckpt {it} {}\n", path.display()))
            .await;
        Ok(())
    }

    /// Rank 0: a line to every other node's process (one gone is noticed
    /// by its reader).
    pub(crate) async fn tell_followers(&mut self, line: &str) {
        for f in &mut self.followers {
            let _ = f.write_all(line.as_bytes()).await;
        }
    }

    /// Task `i` reached its target: its output (weights, or a tuned
    /// prompt) is written and reported.
    pub(crate) async fn deliver(&mut self, i: usize) -> anyhow::Result<()> {
        self.state[i].done = true;
        let dir = self.out_dir.join(&self.tasks[i].job_id);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let t = &self.tasks[i];
        let prompt = t.settings.petl == "prompt_tuning";
        let features = if prompt {
            prompt_features(&t.model, &t.task, &t.job_id)
        } else {
            Vec::new()
        };
        let out = if prompt {
            // A prompt-tuning job's output is its tuned prompt (the
            // real helper writes a peft prompt adapter), not weights.
            let out = dir.join("prompt.json");
            let prompt = serde_json::json!({
                "job_id": t.job_id,
                "model": t.model,
                "num_virtual_tokens": t.settings.num_virtual_tokens,
                "initial_prompt": t.settings.initial_prompt,
                "iteration": self.state[i].iteration,
                "features": features,
            });
            write_atomic(&out, &serde_json::to_vec_pretty(&prompt)?)?;
            out
        } else {
            let out = dir.join("weights.json");
            write_atomic(&out, &serde_json::to_vec_pretty(&self.state[i])?)?;
            out
        };
        self.reporter
            .send(&Report::Done {
                job_id: self.tasks[i].job_id.clone(),
                output: out.display().to_string(),
                prompt_features: features,
            })
            .await;
        Ok(())
    }

    /// The tasks this process trains (the others are watched, eval_only).
    pub(crate) fn trained(&self) -> Vec<usize> {
        (0..self.tasks.len())
            .filter(|&i| !self.tasks[i].eval_only)
            .collect()
    }

    /// Advances by `steps` joint iterations; returns true when every trained
    /// task is done.
    pub(crate) async fn advance(
        &mut self,
        steps: u64,
        crash_at: Option<u64>,
    ) -> anyhow::Result<bool> {
        let trained = self.trained();
        let total_epoch: u64 = trained.iter().map(|&i| self.samples_per_epoch[i]).sum();
        let joint_batch: u64 = trained
            .iter()
            .map(|&i| u64::from(self.tasks[i].global_batch_size))
            .sum();
        let mut epochs_passed = false;
        for &i in &trained {
            if self.state[i].done {
                continue;
            }
            // A joint (spatial) process samples both datasets in proportion.
            let batch = u64::from(self.tasks[i].global_batch_size);
            let before_epoch = self.state[i].samples / self.samples_per_epoch[i];
            self.state[i].iteration += steps;
            let own_samples = if trained.len() > 1 {
                let share = self.samples_per_epoch[i] as f64 / total_epoch as f64;
                (steps as f64 * joint_batch as f64 * share).round() as u64
            } else {
                steps * batch
            };
            self.state[i].samples += own_samples;
            // Learning counted in iterations of this task's own batch.
            self.state[i].effective += self.speed[i] * own_samples as f64 / batch.max(1) as f64;
            if let Some(c) = crash_at
                && self.state[i].iteration >= c
            {
                eprintln!(
                    "fake-trainer: simulated crash at iteration {}",
                    self.state[i].iteration
                );
                std::process::exit(3);
            }
            let x = self.state[i].effective;
            let noise = 1.0 + 0.03 * self.next_noise();
            let loss = self.curves[i].loss(x, self.state[i].gain) * noise;
            let report = Report::Progress {
                job_id: self.tasks[i].job_id.clone(),
                iteration: self.state[i].iteration,
                samples: self.state[i].samples,
                loss,
                step_time_s: self.seconds_per_iteration,
            };
            self.reporter.send(&report).await;
            let epoch = self.state[i].samples / self.samples_per_epoch[i];
            let max_it = self.tasks[i].max_iterations;
            let max_epochs = u64::from(self.tasks[i].max_epochs);
            let mut reached = (max_it > 0 && self.state[i].iteration >= max_it)
                || (max_epochs > 0 && epoch >= max_epochs);
            if epoch > before_epoch && !self.profile {
                epochs_passed |= i == trained[0];
                // An inherited gain speeds learning up (`1 + G` times).
                let lower = self.tasks[i].settings.metric_lower_is_better;
                let value = self.curves[i].evaluation(x * (1.0 + self.state[i].gain), lower);
                reached |= self.eval(i, value).await;
                // What a training script prints: one line per epoch.
                println!(
                    "epoch {epoch} {}: iteration {} loss {loss:.4} {} {value:.4}",
                    self.tasks[i].task,
                    self.state[i].iteration,
                    self.tasks[i].metric.as_deref().unwrap_or("accuracy")
                );
            }
            if reached && !self.profile {
                self.deliver(i).await?;
            }
        }
        if epochs_passed && !self.profile {
            self.epoch_start().await;
        }
        // Watched tasks (temporal merge guard): B evaluated with A's current
        // weights; it improves as A learns only when A's weights help B.
        if epochs_passed {
            let a = trained[0];
            for i in 0..self.tasks.len() {
                if self.tasks[i].eval_only {
                    let g = true_gain(
                        &self.tasks[a].model,
                        &self.tasks[a].task,
                        &self.tasks[i].task,
                        false,
                    );
                    let lower = self.tasks[i].settings.metric_lower_is_better;
                    let value =
                        self.curves[i].evaluation(g.max(0.0) * self.state[a].effective, lower);
                    self.eval(i, value).await;
                }
            }
        }
        Ok(trained.iter().all(|&i| self.state[i].done))
    }

    /// At an epoch boundary: report the per-layer gradient variance
    /// (ICEFROG Eq. 3), then apply a changed `frozen_layers` from the
    /// control file — the step time and the learning per step change, the
    /// process goes on.
    pub(crate) async fn epoch_start(&mut self) {
        let control: Option<Control> = self.control.as_ref().and_then(|path| {
            // Absent: nothing changed yet.
            let text = std::fs::read_to_string(path).ok()?;
            serde_json::from_str(&text)
                .map_err(|e| eprintln!("fake-trainer: {}: {e}; ignored", path.display()))
                .ok()
        });
        // A partner joined or left its GPU (ICEFROG Eq. 8: λ = 0.9).
        if let Some(shared) = control
            .as_ref()
            .and_then(|c| c.shared_gpu)
            .filter(|&s| s != self.shared)
        {
            let lambda = fmsched_core::policy::SHARED_SLOWDOWN;
            let step = if shared {
                self.seconds_per_iteration / lambda
            } else {
                self.seconds_per_iteration * lambda
            };
            eprintln!(
                "fake-trainer: {}: {:.3} → {step:.3} s/iteration",
                if shared {
                    "sharing its GPU with another process (λ = 0.9) from now on"
                } else {
                    "no longer sharing its GPU"
                },
                self.seconds_per_iteration
            );
            self.shared = shared;
            self.seconds_per_iteration = step;
        }
        if self.tasks.iter().all(|t| t.settings.max_frozen_layers == 0) {
            return; // not layer-elastic
        }
        let a = self
            .tasks
            .iter()
            .position(|t| !t.eval_only)
            .unwrap_or_default();
        let epoch = self.state[a].samples as f64 / self.samples_per_epoch[a] as f64;
        self.reporter
            .send(&Report::LayerVariance {
                job_id: self.tasks[a].job_id.clone(),
                epoch,
                frozen_layers: self.frozen,
                variance: fake_layer_variance(self.layers),
            })
            .await;
        let Some(l) = control
            .and_then(|c| c.frozen_layers)
            .filter(|&l| l != self.frozen)
        else {
            return;
        };
        let Some(step) = (self.step_of)(l) else {
            eprintln!(
                "fake-trainer: frozen layers {l}: no profile fits; kept {}",
                self.frozen
            );
            return;
        };
        eprintln!(
            "fake-trainer: frozen layers {} → {l} at epoch {epoch:.0}: {:.3} → {step:.3} s/iteration, ψ {:.3}",
            self.frozen,
            self.seconds_per_iteration,
            frozen_penalty_of(l, self.layers)
        );
        self.frozen = l;
        self.seconds_per_iteration = step * self.share_factor();
        let psi = frozen_penalty_of(l, self.layers);
        for (s, b) in self.speed.iter_mut().zip(&self.base_speed) {
            *s = b * psi;
        }
        for t in &mut self.tasks {
            t.settings.frozen_layers = l;
        }
    }

    /// Reports an evaluation of task `i`; true when it reaches the metric target.
    pub(crate) async fn eval(&mut self, i: usize, value: f64) -> bool {
        let metric = self.tasks[i]
            .metric
            .clone()
            .unwrap_or_else(|| "accuracy".into());
        self.reporter
            .send(&Report::Eval {
                job_id: self.tasks[i].job_id.clone(),
                iteration: self.state[i].iteration,
                epoch: self.state[i].samples as f64 / self.samples_per_epoch[i] as f64,
                metric,
                value,
            })
            .await;
        self.tasks[i].metric_reached(value)
    }
}
