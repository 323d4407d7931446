//! PromptTuner's GPU allocation (thesis 004, Ch. 4, §4.4.4): prompt-tuning
//! requests with SLOs served from warm per-model GPU pools (processes with
//! the runtime and the weights loaded) fed from one shared cold pool. Pure
//! decisions over hand-given pools, for the event-driven loop beside the
//! normal round, and the Prompt Bank's two-layer index (§4.4.3) over
//! scores the caller computes (planned: the live loop, the agents' warm
//! processes, the bank in Postgres with the trainer's scoring, and fmsim's
//! request traces).
//!
//! Times are seconds on the caller's clock. A request's completion bound
//! `T_i(A)` with `A` GPUs is given by the caller (thesis: max remaining
//! iterations × max time per iteration at `A` GPUs, from profiles, plus the
//! allocation overhead) as `bound_s[A − 1]`; `+∞` where it cannot run.

/// One pending prompt-tuning request.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub id: String,
    /// Index of its model's warm pool.
    pub model: usize,
    /// Seconds from now within which it must finish (`T_i^slo`).
    pub slo_s: f64,
    /// `T_i(A)` on warm GPUs for `A = 1, 2, …` (`bound_s[A − 1]`).
    pub bound_s: Vec<f64>,
}

impl Request {
    /// `T_i(A)`; `+∞` beyond what it can use.
    pub fn bound(&self, gpus: usize) -> f64 {
        gpus.checked_sub(1)
            .and_then(|k| self.bound_s.get(k))
            .copied()
            .unwrap_or(f64::INFINITY)
    }
}

/// Requests in SLO order (tightest first; ties by id).
fn by_slo(requests: &[Request]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by(|&a, &b| {
        requests[a]
            .slo_s
            .total_cmp(&requests[b].slo_s)
            .then(requests[a].id.cmp(&requests[b].id))
    });
    order
}

/// Algorithm 1: GPUs from the warm pools. `warm[l]` idle warm GPUs of
/// model `l`. Requests in SLO order each grow from one GPU until their
/// warm bound meets the SLO or their model's pool is spent; a request that
/// can meet it takes those GPUs, any other gets 0 (it waits, or the cold
/// pool serves it). Returns GPUs per request, in input order.
///
/// The printed loop runs `while T(A) > T_slo and A ≤ R_l`, which can end
/// at `A = R_l + 1`, one GPU more than the pool holds; here `A` stops at
/// the pool's size. The printed test after it is strict (`<`); a bound
/// equal to the SLO meets it here (`≤`), as Algorithm 2's test has it.
pub fn allocate_warm(requests: &[Request], warm: &[u32]) -> Vec<u32> {
    let mut left: Vec<u32> = warm.to_vec();
    let mut out = vec![0u32; requests.len()];
    for i in by_slo(requests) {
        let r = &requests[i];
        let Some(&pool) = left.get(r.model) else {
            continue;
        };
        let mut a = 1usize;
        while r.bound(a) > r.slo_s && a < pool as usize {
            a += 1;
        }
        if pool > 0 && r.bound(a) <= r.slo_s {
            out[i] = a as u32;
            left[r.model] -= a as u32;
        }
    }
    out
}

/// What Algorithm 2 decided.
#[derive(Clone, Debug, PartialEq)]
pub struct ColdPlan {
    /// GPUs to move from the cold pool to each model's warm pool.
    pub to_warm: Vec<u32>,
    /// Per request (input order): GPUs it is given from the cold pool (0:
    /// it waits for warm GPUs, or cannot meet its SLO).
    pub cold_gpus: Vec<u32>,
    /// Per request: it can wait for warm GPUs that free up in time
    /// (delay-schedulable).
    pub delayed: Vec<bool>,
    /// The warm pools' GPUs' free times after the decision, per model,
    /// ascending (absolute seconds).
    pub earliest_free: Vec<Vec<f64>>,
}

/// Algorithm 2: GPUs from the cold pool. `earliest_free[l]` holds, for
/// each GPU of model `l`'s warm pool, when it frees up (absolute seconds;
/// `now` or earlier = idle); `cold` GPUs are in the shared cold pool and a
/// cold start of model `l` costs `cold_start_s[l]` (loading the runtime
/// and the weights). Requests in SLO order: one that can meet its SLO by
/// waiting for warm GPUs is delayed (and books them); else it grows from
/// one GPU until `T_i(A) + T_cold ≤ T_slo`, and if that is met the GPUs
/// move to its model's warm pool, booked until it finishes.
///
/// The printed loop condition `T_i(A) + T_cold > T_slo and T_slo < T_cold`
/// is garbled: its second conjunct would stop the search exactly when a
/// cold start could still meet the SLO. Here the search runs while the SLO
/// is not met and more GPUs exist (the cold pool's, and what the request
/// can use), and a request with `T_slo ≤ T_cold` — which no cold start can
/// serve — is not searched at all. DELAYSCHEDULABLE's `k < len` is read as
/// `k ≤ len` (the last warm GPU counts), and its booking uses absolute
/// times: the first `k` warm GPUs are busy until `max(E_k, now) + T_i(k)`.
pub fn allocate_cold(
    requests: &[Request],
    earliest_free: &[Vec<f64>],
    cold: u32,
    cold_start_s: &[f64],
    now: f64,
) -> ColdPlan {
    let mut plan = ColdPlan {
        to_warm: vec![0; earliest_free.len()],
        cold_gpus: vec![0; requests.len()],
        delayed: vec![false; requests.len()],
        earliest_free: earliest_free
            .iter()
            .map(|e| {
                let mut e = e.clone();
                e.sort_by(f64::total_cmp);
                e
            })
            .collect(),
    };
    let mut cold_left = cold;
    for i in by_slo(requests) {
        let r = &requests[i];
        let Some(e) = plan.earliest_free.get_mut(r.model) else {
            continue;
        };
        if delay_schedulable(r, e, now) {
            plan.delayed[i] = true;
            continue;
        }
        let t_cold = cold_start_s.get(r.model).copied().unwrap_or(0.0);
        if r.slo_s <= t_cold || cold_left == 0 {
            continue;
        }
        let mut a = 1usize;
        while r.bound(a) + t_cold > r.slo_s && a < cold_left as usize && a < r.bound_s.len() {
            a += 1;
        }
        if r.bound(a) + t_cold <= r.slo_s {
            cold_left -= a as u32;
            plan.to_warm[r.model] += a as u32;
            plan.cold_gpus[i] = a as u32;
            let busy_until = now + t_cold + r.bound(a);
            e.extend(std::iter::repeat_n(busy_until, a));
            e.sort_by(f64::total_cmp);
        }
    }
    plan
}

/// DELAYSCHEDULABLE: the fewest `k` of the model's warm GPUs (earliest
/// free first) on which the request, starting when the `k`-th frees up,
/// still meets its SLO; if one exists those GPUs are booked until it ends.
fn delay_schedulable(r: &Request, e: &mut [f64], now: f64) -> bool {
    for k in 1..=e.len() {
        let start = e[k - 1].max(now);
        if start - now + r.bound(k) <= r.slo_s {
            let until = start + r.bound(k);
            for t in &mut e[..k] {
                *t = until;
            }
            e.sort_by(f64::total_cmp);
            return true;
        }
    }
    false
}

/// One prompt in the Prompt Bank: its id and the activation features an
/// LLM extracted from it (§4.4.3.1).
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub id: String,
    pub features: Vec<f64>,
}

/// Cosine distance between two activation feature vectors (§4.4.3.1):
/// `1 − a·b / (|a| |b|)`, 1 when either is zero.
pub fn cosine_distance(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    if na == 0.0 || nb == 0.0 {
        1.0
    } else {
        1.0 - dot / (na * nb)
    }
}

/// The Prompt Bank's two-layer index (§4.4.3): prompts clustered by
/// K-medoid over the cosine distance of their activation features; the
/// first layer holds each cluster's medoid (its representative prompt),
/// the second the members. A lookup scores the K medoids, then the
/// members of the best one: `K + C/K` scorings instead of `C`, fewest at
/// `K = √C`.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptBank {
    prompts: Vec<Candidate>,
    /// Per cluster: its medoid (an index into `prompts`) and its members
    /// (the medoid among them).
    clusters: Vec<(usize, Vec<usize>)>,
    /// Most prompts kept (the thesis: e.g. 3,000).
    cap: usize,
}

impl PromptBank {
    /// Clusters `prompts` into `k` clusters (None: `round(√C)`) by K-medoid
    /// (Voronoi iteration from farthest-first seeds: deterministic).
    pub fn build(prompts: Vec<Candidate>, k: Option<usize>, cap: usize) -> Self {
        let c = prompts.len();
        let k = k
            .unwrap_or_else(|| (c as f64).sqrt().round() as usize)
            .clamp(usize::from(c > 0), c.max(1));
        let d = |a: usize, b: usize| cosine_distance(&prompts[a].features, &prompts[b].features);
        // Farthest-first seeds from the first prompt (each prompt's
        // distance to its nearest seed kept up to date: O(C·K)).
        let mut medoids: Vec<usize> = Vec::with_capacity(k);
        let mut nearest = vec![f64::INFINITY; c];
        let mut next = (c > 0).then_some(0);
        while let Some(m) = next.filter(|_| medoids.len() < k) {
            medoids.push(m);
            for (p, n) in nearest.iter_mut().enumerate() {
                *n = n.min(d(p, m));
            }
            next = (0..c)
                .filter(|p| !medoids.contains(p))
                .max_by(|&a, &b| nearest[a].total_cmp(&nearest[b]).then(b.cmp(&a)));
        }
        let mut clusters: Vec<(usize, Vec<usize>)> = Vec::new();
        for _ in 0..50 {
            clusters = medoids.iter().map(|&m| (m, Vec::new())).collect();
            for p in 0..c {
                // A medoid stays in its own cluster (even beside a twin).
                if let Some(k) = medoids.iter().position(|&m| m == p) {
                    clusters[k].1.push(p);
                    continue;
                }
                let best = (0..medoids.len())
                    .min_by(|&x, &y| {
                        d(p, medoids[x])
                            .total_cmp(&d(p, medoids[y]))
                            .then(x.cmp(&y))
                    })
                    .unwrap_or(0);
                clusters[best].1.push(p);
            }
            // Each cluster's medoid: the member nearest all the others.
            let next: Vec<usize> = clusters
                .iter()
                .map(|(m, members)| {
                    members
                        .iter()
                        .copied()
                        .min_by(|&x, &y| {
                            let sx: f64 = members.iter().map(|&o| d(x, o)).sum();
                            let sy: f64 = members.iter().map(|&o| d(y, o)).sum();
                            sx.total_cmp(&sy).then(x.cmp(&y))
                        })
                        .unwrap_or(*m)
                })
                .collect();
            if next == medoids {
                break;
            }
            medoids = next;
        }
        Self {
            prompts,
            clusters,
            cap: cap.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.clusters.iter().map(|c| c.1.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Clusters (first layer).
    pub fn clusters(&self) -> usize {
        self.clusters.len()
    }

    /// The prompt with the lowest `score` (Eq. 4.1: the mean loss of the
    /// prompt on ~16 evaluation samples, computed by the trainer): the
    /// medoids first, then the best medoid's cluster. Returns the prompt
    /// and how many scorings it took.
    pub fn lookup(&self, mut score: impl FnMut(&Candidate) -> f64) -> Option<(&Candidate, usize)> {
        let mut scored = 0;
        let mut best_cluster: Option<(f64, usize)> = None;
        for (k, (m, _)) in self.clusters.iter().enumerate() {
            let s = score(&self.prompts[*m]);
            scored += 1;
            if best_cluster.is_none_or(|b| s < b.0) {
                best_cluster = Some((s, k));
            }
        }
        let (ms, k) = best_cluster?;
        let (m, members) = &self.clusters[k];
        let mut best = (ms, *m);
        for &p in members.iter().filter(|&&p| p != *m) {
            let s = score(&self.prompts[p]);
            scored += 1;
            if s < best.0 {
                best = (s, p);
            }
        }
        Some((&self.prompts[best.1], scored))
    }

    /// Inserts a tuned prompt into the cluster of the nearest medoid (no
    /// scoring, §4.4.3.3); past the cap, that cluster's member nearest its
    /// medoid (the least diverse, never the medoid itself) is evicted and
    /// its id returned.
    pub fn insert(&mut self, c: Candidate) -> Option<String> {
        let p = self.prompts.len();
        self.prompts.push(c);
        if self.clusters.is_empty() {
            self.clusters.push((p, vec![p]));
            return None;
        }
        let dist = |a: usize, b: usize, prompts: &[Candidate]| {
            cosine_distance(&prompts[a].features, &prompts[b].features)
        };
        let k = (0..self.clusters.len())
            .min_by(|&x, &y| {
                dist(p, self.clusters[x].0, &self.prompts)
                    .total_cmp(&dist(p, self.clusters[y].0, &self.prompts))
                    .then(x.cmp(&y))
            })
            .unwrap_or(0);
        self.clusters[k].1.push(p);
        if self.len() <= self.cap {
            return None;
        }
        let (m, members) = &self.clusters[k];
        let victim = members
            .iter()
            .copied()
            .filter(|&x| x != *m)
            .min_by(|&x, &y| {
                dist(x, *m, &self.prompts)
                    .total_cmp(&dist(y, *m, &self.prompts))
                    .then(x.cmp(&y))
            })?;
        self.clusters[k].1.retain(|&x| x != victim);
        Some(self.prompts[victim].id.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Perfect scaling: `work / A` seconds on `A` GPUs, up to `max` GPUs.
    fn req(id: &str, model: usize, slo_s: f64, work: f64, max: usize) -> Request {
        Request {
            id: id.into(),
            model,
            slo_s,
            bound_s: (1..=max).map(|a| work / a as f64).collect(),
        }
    }

    #[test]
    fn prompttuner_warm_pool_serves_the_tightest_slo_first_and_gives_0_to_what_cannot_meet_its_slo()
    {
        // Model 0 has 4 idle warm GPUs. "tight" needs 3 (90 s of work in
        // 30 s), "loose" 1, "hopeless" needs 10 GPUs it cannot get.
        let reqs = [
            req("loose", 0, 200.0, 100.0, 8),
            req("tight", 0, 30.0, 90.0, 8),
            req("hopeless", 0, 10.0, 100.0, 8),
        ];
        let a = allocate_warm(&reqs, &[4]);
        // SLO order: hopeless (10 s) cannot meet it on all 4 → 0; tight
        // takes 3; loose takes the last one.
        assert_eq!(a, vec![1, 3, 0]);
        // A model without warm GPUs serves nothing from its pool.
        assert_eq!(allocate_warm(&reqs, &[0]), vec![0, 0, 0]);
        // A bound exactly at the SLO meets it.
        assert_eq!(allocate_warm(&[req("x", 0, 50.0, 100.0, 8)], &[2]), vec![2]);
    }

    #[test]
    fn prompttuner_a_delay_schedulable_request_waits_instead_of_taking_cold_gpus() {
        // One warm GPU of model 0 frees at t = 20 s; the request needs 30 s
        // on it and has 60 s: it waits for it, taking nothing cold.
        let r = req("wait", 0, 60.0, 30.0, 4);
        let p = allocate_cold(std::slice::from_ref(&r), &[vec![20.0]], 8, &[15.0], 0.0);
        assert_eq!(
            (p.delayed, p.cold_gpus.clone(), p.to_warm),
            (vec![true], vec![0], vec![0])
        );
        assert_eq!(p.earliest_free, vec![vec![50.0]], "booked until it ends");
        // With a 40 s SLO waiting is too late: 2 cold GPUs (15 s start +
        // 15 s of work) move to model 0's warm pool.
        let r = req("now", 0, 40.0, 30.0, 4);
        let p = allocate_cold(std::slice::from_ref(&r), &[vec![20.0]], 8, &[15.0], 0.0);
        assert_eq!((p.delayed[0], p.cold_gpus[0], p.to_warm[0]), (false, 2, 2));
        assert_eq!(p.earliest_free[0], vec![20.0, 30.0, 30.0]);
    }

    #[test]
    fn prompttuner_a_request_that_cannot_meet_its_slo_gets_0() {
        // The SLO is shorter than the cold start: nothing can serve it.
        let r = req("short", 0, 10.0, 5.0, 8);
        let p = allocate_cold(std::slice::from_ref(&r), &[vec![]], 8, &[15.0], 0.0);
        assert_eq!((p.cold_gpus[0], p.to_warm[0], p.delayed[0]), (0, 0, false));
        // More GPUs than the cold pool has would be needed: 0, and the
        // pool keeps them for the next request.
        let reqs = [
            req("big", 0, 20.0, 100.0, 16),
            req("small", 1, 60.0, 30.0, 4),
        ];
        let p = allocate_cold(&reqs, &[vec![], vec![]], 4, &[10.0, 10.0], 0.0);
        assert_eq!(p.cold_gpus, vec![0, 1]);
        assert_eq!(p.to_warm, vec![0, 1]);
    }

    #[test]
    fn prompttuner_cold_requests_in_slo_order_share_the_cold_pool() {
        // Two models, 3 cold GPUs: the tighter request of model 1 takes 2,
        // the looser one of model 0 the last.
        let reqs = [req("a", 0, 100.0, 60.0, 4), req("b", 1, 50.0, 60.0, 4)];
        let p = allocate_cold(&reqs, &[vec![], vec![]], 3, &[10.0, 10.0], 0.0);
        assert_eq!(p.cold_gpus, vec![1, 2]);
        assert_eq!(p.to_warm, vec![1, 2]);
    }

    /// Prompts on three well-separated directions (12 each, small angular
    /// jitter) and a task whose best prompt is the one nearest its own
    /// direction (score = cosine distance to it).
    fn bank_of_three() -> PromptBank {
        let mut prompts = Vec::new();
        for (d, angle) in [0.0f64, 2.1, 4.2].iter().enumerate() {
            for j in 0..12 {
                let a = angle + 0.02 * (j as f64 - 6.0);
                prompts.push(Candidate {
                    id: format!("p{d}-{j}"),
                    features: vec![a.cos(), a.sin()],
                });
            }
        }
        PromptBank::build(prompts, Some(3), 100)
    }

    #[test]
    fn prompttuner_prompt_bank_lookup_scores_k_plus_c_over_k_and_finds_the_best() {
        let bank = bank_of_three();
        assert_eq!((bank.clusters(), bank.len()), (3, 36));
        let task = [2.125f64.cos(), 2.125f64.sin()];
        let (best, scored) = bank
            .lookup(|c| cosine_distance(&c.features, &task))
            .unwrap();
        // The exhaustive best is the prompt at angle 2.1 + 0.02·1 = 2.12.
        assert_eq!(best.id, "p1-7");
        // K medoids + the other members of one cluster of 12.
        assert_eq!(scored, 3 + 11);
        // K defaults to √C.
        let all: Vec<Candidate> = (0..49)
            .map(|j| Candidate {
                id: j.to_string(),
                features: vec![1.0, j as f64],
            })
            .collect();
        assert_eq!(PromptBank::build(all, None, 100).clusters(), 7);
    }

    #[test]
    fn prompttuner_prompt_bank_inserts_at_the_nearest_medoid_and_evicts_the_least_diverse() {
        let mut bank = bank_of_three();
        bank.cap = 36;
        // A new prompt near direction 4.2 joins that cluster; the bank is
        // then over its cap and drops the member nearest that medoid.
        let evicted = bank
            .insert(Candidate {
                id: "new".into(),
                features: vec![4.25f64.cos(), 4.25f64.sin()],
            })
            .expect("over the cap");
        assert!(evicted.starts_with("p2-"), "{evicted}");
        assert_eq!(bank.len(), 36);
        let (best, _) = bank
            .lookup(|c| cosine_distance(&c.features, &[4.25f64.cos(), 4.25f64.sin()]))
            .unwrap();
        assert_eq!(best.id, "new", "the inserted prompt is found");
        assert_eq!(cosine_distance(&[1.0, 0.0], &[0.0, 0.0]), 1.0);
    }
}
