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
    /// GPUs the user asked for: its size once no option can meet its SLO
    /// any more and it runs best-effort (`late`).
    pub gpus: u32,
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

/// A model's warm pool as the loop sees it: GPUs holding the model's
/// runtime and weights.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WarmPool {
    /// Idle warm GPUs.
    pub idle: u32,
    /// When each busy (or still loading) warm GPU frees up (absolute
    /// seconds).
    pub busy_until: Vec<f64>,
}

/// What one pass of the loop decided, per request in input order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// GPUs from its model's idle warm pool; it starts now.
    pub warm: Vec<u32>,
    /// GPUs moved from the cold pool to its model's warm pool; it starts
    /// once they have loaded the model (`T_cold`), on these and its `warm`
    /// GPUs together.
    pub cold: Vec<u32>,
    /// It waits for warm GPUs that free up in time (delay-schedulable).
    pub delayed: Vec<bool>,
    /// No option meets its SLO any more: it runs best-effort at the size it
    /// asked for (warm GPUs if any are idle, else cold ones) or, with
    /// nothing free, keeps waiting. Its SLO is violated either way.
    pub late: Vec<bool>,
    /// Per model: idle warm GPUs going back to the cold pool now, to be
    /// loaded with another model (counted in some request's `cold`).
    pub reclaim: Vec<u32>,
}

/// `T_cold`: seconds a cold start of a model of `params` parameters takes
/// on a GPU (the allocation overhead of §4.6.1): 12 s of runtime start-up
/// (Python, the CUDA context, the tuning library) plus its fp16 weights
/// read at 0.5 GB/s. With the thesis' request durations this makes start-up
/// 37–44 % of a request's time, as it measured (Fig. 4.2a: 37–41 %). Our
/// model, not a thesis equation; fmsim's traces, the live loop and the
/// fake trainer's weight load all use it.
pub fn cold_start_s(params: f64) -> f64 {
    12.0 + params.max(0.0) * 2.0 / 0.5e9
}

/// Idle warm GPUs go back to the cold pool after this long (§4.6.3.3: a
/// 60 s window balances violations and cost).
pub const IDLE_RELEASE_S: f64 = 60.0;

/// One pass of PromptTuner's loop at `now`: Algorithm 1 over the idle warm
/// GPUs, then Algorithm 2 over the cold pool for what is left, with the
/// warm GPUs Algorithm 1 just took busy until their request's bound. Two
/// steps beyond the thesis follow (each explained below): a cold start
/// uses its model's idle warm GPUs too, and a cold pool too small takes
/// other models' idle warm GPUs back. A request neither started nor
/// delayed cannot meet its SLO (the thesis leaves it pending, where it
/// would wait forever as its SLO shrinks): here it runs best-effort, in
/// input (arrival) order, on idle warm GPUs no delayed request booked,
/// else on cold ones. `requests[i].slo_s` is relative to `now`. In
/// `fmsim prompttuner` the two steps turn violations from 0.89–2.88× to
/// 1.6–3.4× below the INFless-like baseline.
pub fn decide(
    requests: &[Request],
    pools: &[WarmPool],
    cold: u32,
    cold_start_s: &[f64],
    now: f64,
) -> Decision {
    let idle: Vec<u32> = pools.iter().map(|p| p.idle).collect();
    let warm = allocate_warm(requests, &idle);
    let mut left = idle;
    let mut earliest: Vec<Vec<f64>> = pools.iter().map(|p| p.busy_until.clone()).collect();
    for (r, &a) in requests.iter().zip(&warm) {
        if a > 0 {
            left[r.model] -= a;
            earliest[r.model].extend(std::iter::repeat_n(now + r.bound(a as usize), a as usize));
        }
    }
    for (e, &l) in earliest.iter_mut().zip(&left) {
        e.extend(std::iter::repeat_n(now, l as usize));
    }
    let rest: Vec<usize> = (0..requests.len()).filter(|&i| warm[i] == 0).collect();
    let sub: Vec<Request> = rest.iter().map(|&i| requests[i].clone()).collect();
    let plan = allocate_cold(&sub, &earliest, cold, cold_start_s, now);
    let mut d = Decision {
        warm,
        cold: vec![0; requests.len()],
        delayed: vec![false; requests.len()],
        late: vec![false; requests.len()],
        reclaim: Vec::new(),
    };
    for (k, &i) in rest.iter().enumerate() {
        d.cold[i] = plan.cold_gpus[k];
        d.delayed[i] = plan.delayed[k];
    }
    // Idle warm GPUs no delayed request booked, and the cold pool left.
    let mut free_warm: Vec<u32> = plan
        .earliest_free
        .iter()
        .map(|e| e.iter().filter(|&&t| t <= now).count() as u32)
        .collect();
    let mut cold_left = cold - plan.to_warm.iter().sum::<u32>();
    // Beyond the thesis: a request Algorithm 2 starts cold takes its
    // model's unbooked idle warm GPUs in place of cold ones. It starts
    // after the cold start either way, on as many GPUs, so its bound is
    // unchanged; the warm GPUs would otherwise idle (billed) while as many
    // cold ones load the weights again (billed too). Algorithm 1 could
    // not serve it from those GPUs alone, so at least one stays cold.
    for &i in &rest {
        let m = requests[i].model;
        if d.cold[i] > 1 {
            let take = free_warm[m].min(d.cold[i] - 1);
            d.warm[i] += take;
            d.cold[i] -= take;
            free_warm[m] -= take;
            cold_left += take;
        }
    }
    // Beyond the thesis: a request the cold pool is too small for takes
    // other models' unbooked idle warm GPUs back (they would idle, billed,
    // until their window ends while it misses its SLO; the thesis' pools
    // only shrink by that window). Its own idle ones join it as above.
    let mut reclaim = vec![0u32; pools.len()];
    for i in by_slo(requests) {
        let r = &requests[i];
        if d.warm[i] > 0 || d.cold[i] > 0 || d.delayed[i] || r.model >= pools.len() {
            continue;
        }
        let t_cold = cold_start_s.get(r.model).copied().unwrap_or(f64::INFINITY);
        let others: u32 = free_warm.iter().sum::<u32>() - free_warm[r.model];
        let supply = (free_warm[r.model] + cold_left + others) as usize;
        let Some(a) = (1..=supply.min(r.bound_s.len())).find(|&a| r.bound(a) + t_cold <= r.slo_s)
        else {
            continue;
        };
        let own = free_warm[r.model].min(a as u32 - 1);
        free_warm[r.model] -= own;
        d.warm[i] = own;
        d.cold[i] = take_cold(
            a as u32 - own,
            r.model,
            &mut cold_left,
            &mut free_warm,
            &mut reclaim,
        );
    }
    for &i in &rest {
        if d.cold[i] > 0 || d.delayed[i] {
            continue;
        }
        d.late[i] = true;
        let r = &requests[i];
        let want = r.gpus.clamp(1, r.bound_s.len().max(1) as u32);
        if let Some(w) = free_warm.get_mut(r.model).filter(|w| **w > 0) {
            d.warm[i] = want.min(*w);
            *w -= d.warm[i];
        } else if r.model < pools.len() {
            d.cold[i] = take_cold(want, r.model, &mut cold_left, &mut free_warm, &mut reclaim);
        }
    }
    d.reclaim = reclaim;
    d
}

/// Up to `n` GPUs to load model `m`: from the cold pool first, then idle
/// warm GPUs of other models (the most idle pool first), counted in
/// `reclaim`. Returns how many it found.
fn take_cold(
    n: u32,
    m: usize,
    cold_left: &mut u32,
    free_warm: &mut [u32],
    reclaim: &mut [u32],
) -> u32 {
    let mut got = n.min(*cold_left);
    *cold_left -= got;
    while got < n {
        let Some(l) = (0..free_warm.len())
            .filter(|&l| l != m && free_warm[l] > 0)
            .max_by_key(|&l| (free_warm[l], std::cmp::Reverse(l)))
        else {
            break;
        };
        free_warm[l] -= 1;
        reclaim[l] += 1;
        got += 1;
    }
    got
}

/// Warm GPUs idle since `idle_since` (absolute seconds) that go back to
/// the cold pool at `now` after `window_s` idle.
pub fn release_due(idle_since: &[f64], now: f64, window_s: f64) -> usize {
    idle_since.iter().filter(|&&t| t + window_s <= now).count()
}

/// A node as the live loop sees it: what it has for prompt-tuning requests.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LaneNode {
    /// Its GPUs' family.
    pub family: String,
    /// GPUs (indices) nothing runs on and no warm process holds: the cold
    /// pool's share on this node.
    pub free: Vec<u32>,
    /// Idle warm processes: (model, their GPUs).
    pub warm: Vec<(String, Vec<u32>)>,
}

/// A pending request of the live loop.
#[derive(Clone, Debug, PartialEq)]
pub struct LaneRequest {
    /// `request.model` indexes `models` of [`place_lane`].
    pub request: Request,
    /// GPU families it may run on (empty: any).
    pub families: Vec<String>,
}

/// One request started by [`place_lane`].
#[derive(Clone, Debug, PartialEq)]
pub struct LaneStart {
    /// Index into the requests.
    pub request: usize,
    /// Index into the nodes.
    pub node: usize,
    /// GPU indices on that node.
    pub gpus: Vec<u32>,
    /// Exactly the GPUs of one idle warm process of its model: the process
    /// takes it over (a warm start); otherwise the GPUs load the model
    /// afresh (a cold start).
    pub warm: bool,
    /// No option met its SLO: it runs best-effort.
    pub late: bool,
}

/// What one pass of the live loop decided, on concrete GPUs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LanePlan {
    pub starts: Vec<LaneStart>,
    /// Requests that wait for warm GPUs freeing up in time.
    pub delayed: Vec<usize>,
    /// Requests [`decide`] gave GPUs that no single node could hold (the
    /// thesis' pools are not per node): they wait for the next pass.
    pub unplaced: Vec<usize>,
}

/// One pass of the live loop on concrete GPUs: [`decide`] over the pools
/// the nodes hold (idle warm GPUs per model, free GPUs as the cold pool,
/// `busy_until[m]` for model `m`'s warm GPUs running requests), then each
/// started request, in SLO order, placed on one node:
/// - GPUs from its model's warm pool only: the node's idle warm process
///   of its model with exactly that many GPUs, which takes it over (a
///   warm start); without one, warm processes of its model on one node
///   (stopped, the model loaded afresh);
/// - GPUs from the cold pool too: one node's free GPUs first, then its
///   idle warm GPUs of the same model, then of other models (Algorithm 2's
///   reclaim), fewest taken from warm processes first.
///
/// A process's GPUs that a start takes partly go back to the node's free
/// GPUs (the process is stopped). `now` is on the caller's clock, as are
/// `busy_until` and the requests' SLOs (relative to `now`).
pub fn place_lane(
    requests: &[LaneRequest],
    nodes: &[LaneNode],
    models: &[String],
    busy_until: &[Vec<f64>],
    cold_start_s: &[f64],
    now: f64,
) -> LanePlan {
    let pools: Vec<WarmPool> = models
        .iter()
        .enumerate()
        .map(|(m, name)| WarmPool {
            idle: nodes
                .iter()
                .flat_map(|n| &n.warm)
                .filter(|w| &w.0 == name)
                .map(|w| w.1.len() as u32)
                .sum(),
            busy_until: busy_until.get(m).cloned().unwrap_or_default(),
        })
        .collect();
    let cold: u32 = nodes.iter().map(|n| n.free.len() as u32).sum();
    let reqs: Vec<Request> = requests.iter().map(|r| r.request.clone()).collect();
    let d = decide(&reqs, &pools, cold, cold_start_s, now);
    let mut nodes: Vec<LaneNode> = nodes.to_vec();
    let mut plan = LanePlan::default();
    for i in by_slo(&reqs) {
        let want = (d.warm[i] + d.cold[i]) as usize;
        if want == 0 {
            if d.delayed[i] {
                plan.delayed.push(i);
            }
            continue;
        }
        let r = &requests[i];
        let model = &models[r.request.model];
        let allowed = |n: &LaneNode| r.families.is_empty() || r.families.contains(&n.family);
        // A warm start: one idle warm process of its model, exactly sized.
        if d.cold[i] == 0
            && let Some((n, w)) = nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| allowed(n))
                .find_map(|(k, n)| {
                    n.warm
                        .iter()
                        .position(|w| &w.0 == model && w.1.len() == want)
                        .map(|w| (k, w))
                })
        {
            let (_, gpus) = nodes[n].warm.remove(w);
            plan.starts.push(LaneStart {
                request: i,
                node: n,
                gpus,
                warm: true,
                late: d.late[i],
            });
            continue;
        }
        // A cold start on one node: free GPUs, then its model's warm
        // processes, then other models'.
        let supply = |n: &LaneNode, own: bool| -> usize {
            n.warm
                .iter()
                .filter(|w| (&w.0 == model) == own)
                .map(|w| w.1.len())
                .sum()
        };
        let best = nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| allowed(n))
            .filter(|(_, n)| n.free.len() + supply(n, true) + supply(n, false) >= want)
            .min_by_key(|(k, n)| {
                let from_warm = want.saturating_sub(n.free.len());
                let reclaim = from_warm.saturating_sub(supply(n, true));
                (reclaim, from_warm, *k)
            })
            .map(|(k, _)| k);
        let Some(k) = best else {
            plan.unplaced.push(i);
            continue;
        };
        let n = &mut nodes[k];
        let mut gpus: Vec<u32> = Vec::with_capacity(want);
        let take = want.min(n.free.len());
        gpus.extend(n.free.drain(..take));
        for own in [true, false] {
            while gpus.len() < want {
                let Some(w) = n.warm.iter().position(|w| (&w.0 == model) == own) else {
                    break;
                };
                let (_, mut g) = n.warm.remove(w);
                let need = want - gpus.len();
                if g.len() > need {
                    n.free.extend(g.drain(need..));
                }
                gpus.extend(g);
            }
        }
        gpus.sort_unstable();
        plan.starts.push(LaneStart {
            request: i,
            node: k,
            gpus,
            warm: false,
            late: d.late[i],
        });
    }
    plan
}

/// The two baselines of the thesis' evaluation (§4.6.1), as sized here: no
/// warm runtime is kept, so every start loads the runtime and the weights
/// (`T_cold`). Each request takes its minimum satisfactory share — the
/// fewest GPUs `A` with `T_cold + T(A) ≤ T_slo` — in SLO (deadline) order
/// from the `free` GPUs, waits when that share is not free, and runs
/// best-effort at its asked size (`late`) once no share can meet its SLO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColdBaseline {
    /// INFless-like: GPUs are taken per request and given back when it
    /// ends (billed while held).
    Infless,
    /// ElasticFlow-like: a provisioned cluster (billed whole); GPUs left
    /// once nothing waits go to the requests starting now by greatest
    /// marginal gain `T(A) − T(A + 1)` (a running request is not resized).
    ElasticFlow,
}

/// What a baseline decided, per request in input order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ColdDecision {
    /// GPUs it starts on now (after a cold start).
    pub gpus: Vec<u32>,
    /// No share meets its SLO any more.
    pub late: Vec<bool>,
}

/// One decision of a [`ColdBaseline`] over `free` GPUs.
pub fn decide_cold(
    baseline: ColdBaseline,
    requests: &[Request],
    free: u32,
    cold_start_s: &[f64],
) -> ColdDecision {
    let mut d = ColdDecision {
        gpus: vec![0; requests.len()],
        late: vec![false; requests.len()],
    };
    let mut free = free;
    let mut waiting = false;
    for i in by_slo(requests) {
        let r = &requests[i];
        let t_cold = cold_start_s.get(r.model).copied().unwrap_or(f64::INFINITY);
        match (1..=r.bound_s.len()).find(|&a| t_cold + r.bound(a) <= r.slo_s) {
            None => d.late[i] = true,
            Some(a) if a as u32 <= free => {
                d.gpus[i] = a as u32;
                free -= a as u32;
            }
            Some(_) => waiting = true,
        }
    }
    for (i, r) in requests.iter().enumerate() {
        if d.late[i] && free > 0 {
            d.gpus[i] = r.gpus.clamp(1, r.bound_s.len().max(1) as u32).min(free);
            free -= d.gpus[i];
        }
    }
    if baseline == ColdBaseline::ElasticFlow && !waiting {
        while free > 0 {
            let best = (0..requests.len())
                .filter(|&i| d.gpus[i] > 0)
                .map(|i| {
                    let a = d.gpus[i] as usize;
                    (i, requests[i].bound(a) - requests[i].bound(a + 1))
                })
                .filter(|(_, gain)| *gain > 0.0)
                .max_by(|x, y| x.1.total_cmp(&y.1).then(y.0.cmp(&x.0)));
            let Some((i, _)) = best else { break };
            d.gpus[i] += 1;
            free -= 1;
        }
    }
    d
}

/// One prompt in the Prompt Bank: its id and the activation features an
/// LLM extracted from it (§4.4.3.1).
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub id: String,
    pub features: Vec<f64>,
}

/// Most dimensions the Prompt Bank's index clusters by ([`index_features`]).
pub const INDEX_DIMS: usize = 256;

/// The features the index clusters a prompt by: its activation features
/// as they are up to [`INDEX_DIMS`] of them, else hashed to that many
/// (feature hashing, Weinberger et al. 2009: each feature is added, with a
/// sign of ±1, into one bucket, both fixed by its position; inner products,
/// hence cosine distances, are kept in expectation). The index is built
/// over `C·K` distances and more: at a model's hidden size (4,096 for a
/// 7B model) that costs 16 times what 256 do. Only the clustering sees the
/// hashed features; the trainer scores candidates by their loss.
pub fn index_features(f: &[f64]) -> Vec<f64> {
    if f.len() <= INDEX_DIMS {
        return f.to_vec();
    }
    let mut out = vec![0.0; INDEX_DIMS];
    for (i, x) in f.iter().enumerate() {
        // SplitMix64 of the position: its bucket and its sign.
        let z = super::splitmix64((i as u64).wrapping_add(0x9E37_79B9_7F4A_7C15));
        let sign = if z >> 63 == 0 { 1.0 } else { -1.0 };
        out[(z % INDEX_DIMS as u64) as usize] += sign * x;
    }
    out
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

    /// Inserts keep the clusters; once `round(√C)` moved away from their
    /// number, a lookup no longer costs the fewest scorings and the index
    /// is better rebuilt ([`PromptBank::build`]).
    pub fn wants_rebuild(&self) -> bool {
        let c = self.len();
        let k = ((c as f64).sqrt().round() as usize).clamp(usize::from(c > 0), c.max(1));
        self.clusters.len() != k
    }

    /// The prompt with the lowest `score` (Eq. 4.1: the mean loss of the
    /// prompt on ~16 evaluation samples, computed by the trainer): the
    /// medoids first, then the best medoid's cluster. Returns the prompt
    /// and how many scorings it took.
    pub fn lookup(&self, mut score: impl FnMut(&Candidate) -> f64) -> Option<(&Candidate, usize)> {
        let (p, _, scored) =
            crate::trainer::walk_bank(&self.clusters, |&p| score(&self.prompts[p]))?;
        Some((&self.prompts[*p], scored))
    }

    /// The index as a trainer gets it: per prompt still in the bank, its
    /// id, its cluster and whether it is the cluster's medoid (cluster by
    /// cluster).
    pub fn index(&self) -> Vec<(&Candidate, u32, bool)> {
        self.clusters
            .iter()
            .enumerate()
            .flat_map(|(k, (m, members))| {
                members
                    .iter()
                    .map(move |&p| (&self.prompts[p], k as u32, p == *m))
            })
            .collect()
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
            gpus: 1,
        }
    }

    fn lane_req(id: &str, model: usize, slo_s: f64, work: f64) -> LaneRequest {
        LaneRequest {
            request: req(id, model, slo_s, work, 1),
            families: Vec::new(),
        }
    }

    /// The live loop on concrete GPUs: a request of a model with an idle
    /// warm process is handed that process (a warm start); one of another
    /// model starts cold on free GPUs; a request that cannot meet its SLO
    /// on any pool runs best-effort; and a request waiting on a busy warm
    /// GPU that frees up in time is delayed, taking no cold GPU.
    #[test]
    fn prompttuner_lane_hands_a_request_to_its_models_warm_process() {
        let models = vec!["gpt2".to_string(), "llama".to_string()];
        let node = LaneNode {
            family: "A100".into(),
            free: vec![2, 3],
            warm: vec![("gpt2".into(), vec![1])],
        };
        let reqs = vec![
            lane_req("a", 0, 100.0, 30.0), // gpt2: warm process on GPU 1
            lane_req("b", 1, 200.0, 30.0), // llama: none warm → cold
        ];
        let p = place_lane(
            &reqs,
            std::slice::from_ref(&node),
            &models,
            &[vec![], vec![]],
            &[20.0, 20.0],
            0.0,
        );
        assert_eq!(p.starts.len(), 2, "{p:?}");
        let a = p.starts.iter().find(|s| s.request == 0).unwrap();
        assert!(a.warm && a.gpus == vec![1], "{a:?}");
        let b = p.starts.iter().find(|s| s.request == 1).unwrap();
        assert!(!b.warm && b.gpus == vec![2], "{b:?}");

        // A second gpt2 request arriving while GPU 1 is busy until t = 40
        // and its SLO allows waiting: it is delayed, the free GPUs stay.
        let busy = LaneNode {
            warm: Vec::new(),
            ..node.clone()
        };
        let on_busy = |r: LaneRequest| {
            place_lane(
                &[r],
                std::slice::from_ref(&busy),
                &models,
                &[vec![40.0], vec![]],
                &[20.0, 20.0],
                0.0,
            )
        };
        let p = on_busy(lane_req("c", 0, 100.0, 30.0));
        assert_eq!((p.starts.len(), p.delayed.clone()), (0, vec![0]), "{p:?}");
        // With an SLO waiting cannot meet (40 + 30 > 60) but a cold start
        // can (20 + 30 ≤ 60), it starts cold.
        let p = on_busy(lane_req("c", 0, 60.0, 30.0));
        assert!(
            p.starts.len() == 1 && !p.starts[0].warm && !p.starts[0].late,
            "{p:?}"
        );
        // An SLO nothing can meet: best-effort (late) on a free GPU.
        let p = on_busy(lane_req("d", 0, 10.0, 30.0));
        assert!(p.starts.len() == 1 && p.starts[0].late, "{p:?}");
    }

    /// A cold start takes a node's free GPUs before any warm process, and
    /// another model's idle warm GPUs only when the free ones run out
    /// (Algorithm 2's reclaim); a family the request may not use is never
    /// chosen; a request no single node can hold waits (unplaced).
    #[test]
    fn prompttuner_lane_cold_starts_take_free_gpus_first_on_an_allowed_family() {
        let models = vec!["gpt2".to_string(), "llama".to_string()];
        let v100 = LaneNode {
            family: "V100".into(),
            free: vec![0, 1, 2, 3],
            warm: Vec::new(),
        };
        let a100 = LaneNode {
            family: "A100".into(),
            free: vec![5],
            warm: vec![("gpt2".into(), vec![6])],
        };
        let mut r = lane_req("l", 1, 100.0, 30.0);
        r.families = vec!["A100".into()];
        let nodes = [v100, a100];
        let place = |r: &LaneRequest| {
            place_lane(
                std::slice::from_ref(r),
                &nodes,
                &models,
                &[vec![], vec![]],
                &[20.0, 20.0],
                0.0,
            )
        };
        let p = place(&r);
        assert_eq!(p.starts.len(), 1, "{p:?}");
        assert_eq!((p.starts[0].node, p.starts[0].gpus.clone()), (1, vec![5]));
        // Two GPUs needed (the SLO cannot be met on one): the free GPU and
        // gpt2's idle warm GPU, reclaimed.
        r.request = Request {
            bound_s: vec![90.0, 45.0],
            ..r.request
        };
        let p = place(&r);
        assert_eq!(p.starts.len(), 1, "{p:?}");
        assert_eq!(
            (p.starts[0].node, p.starts[0].gpus.clone()),
            (1, vec![5, 6])
        );
        assert!(!p.starts[0].warm);
        // Three GPUs: no A100 node holds them (the V100 node may not be used).
        r.request.bound_s = vec![200.0, 150.0, 60.0];
        let p = place(&r);
        assert!(p.starts.is_empty() && p.unplaced == vec![0], "{p:?}");
    }

    #[test]
    fn prompttuner_decide_serves_warm_then_cold_and_runs_the_hopeless_best_effort() {
        // Model 0: 2 idle warm GPUs and one busy until t = 120. Model 1: no
        // warm GPUs. 4 cold GPUs, cold start 10 s.
        let pools = [
            WarmPool {
                idle: 2,
                busy_until: vec![120.0],
            },
            WarmPool::default(),
        ];
        let mut late = req("late", 1, 5.0, 100.0, 8);
        late.gpus = 2;
        let reqs = [
            // Fits on the 2 warm GPUs: 60 s of work in 40 s.
            req("warm", 0, 40.0, 60.0, 8),
            // No warm GPU of model 1: cold, 2 GPUs (10 + 30 ≤ 45).
            req("cold", 1, 45.0, 60.0, 8),
            // Model 0's busy GPU frees at 120 (now 100): 20 + 30 ≤ 60.
            req("waits", 0, 60.0, 30.0, 8),
            // 5 s is below the cold start: best-effort on its 2 asked GPUs.
            late,
        ];
        let d = decide(&reqs, &pools, 4, &[10.0, 10.0], 100.0);
        assert_eq!(d.warm, vec![2, 0, 0, 0]);
        assert_eq!(d.cold, vec![0, 2, 0, 2]);
        assert_eq!(d.delayed, vec![false, false, true, false]);
        assert_eq!(d.late, vec![false, false, false, true]);
        // With no cold GPU left the hopeless request keeps waiting.
        let d = decide(&reqs, &pools, 2, &[10.0, 10.0], 100.0);
        assert_eq!((d.cold[3], d.warm[3], d.late[3]), (0, 0, true));
    }

    #[test]
    fn prompttuner_decide_keeps_idle_gpus_a_delayed_request_booked() {
        // One idle warm GPU and one busy until t = 10: "pair" needs both
        // (40 s of work in 30 s: 20 s on 2 GPUs from t = 10), so it books
        // the idle one too; the hopeless request of the same model may not
        // take it and goes cold instead.
        let pools = [WarmPool {
            idle: 1,
            busy_until: vec![10.0],
        }];
        let reqs = [req("pair", 0, 30.0, 40.0, 2), req("late", 0, 1.0, 50.0, 2)];
        let d = decide(&reqs, &pools, 1, &[5.0], 0.0);
        assert_eq!(d.delayed, vec![true, false]);
        assert_eq!((d.warm[1], d.cold[1], d.late[1]), (0, 1, true));
    }

    #[test]
    fn prompttuner_decide_reloads_other_models_idle_gpus_when_the_cold_pool_is_short() {
        // Model 0 has 3 idle warm GPUs nobody waits for; the cold pool has
        // 1. A model-1 request needs 2 GPUs (10 s load + 30 s ≤ 45): one
        // cold, one taken back from model 0's pool and loaded with model 1.
        let pools = [
            WarmPool {
                idle: 3,
                busy_until: vec![],
            },
            WarmPool::default(),
        ];
        let reqs = [req("m1", 1, 45.0, 60.0, 8)];
        let d = decide(&reqs, &pools, 1, &[10.0, 10.0], 0.0);
        assert_eq!((d.warm, d.cold, d.late), (vec![0], vec![2], vec![false]));
        assert_eq!(d.reclaim, vec![1, 0]);
        // Its own idle GPU joins the cold one instead (both wait for the
        // load): 2 GPUs, 1 cold, nothing reclaimed.
        let pools = [
            WarmPool::default(),
            WarmPool {
                idle: 1,
                busy_until: vec![],
            },
        ];
        let d = decide(&reqs, &pools, 4, &[10.0, 10.0], 0.0);
        assert_eq!((d.warm, d.cold), (vec![1], vec![1]));
        assert_eq!(d.reclaim, vec![0, 0]);
    }

    #[test]
    fn prompttuner_idle_warm_gpus_go_back_after_the_window() {
        assert_eq!(release_due(&[0.0, 30.0, 59.0], 90.0, IDLE_RELEASE_S), 2);
        assert_eq!(release_due(&[], 90.0, IDLE_RELEASE_S), 0);
    }

    #[test]
    fn prompttuner_cold_baselines_take_the_minimum_satisfactory_share() {
        // Cold start 10 s. "a": 60 s of work, SLO 40 → 2 GPUs; "b": SLO 25,
        // 4 GPUs (10 + 15); "c": SLO 8 < cold start → late, best-effort.
        let mut c = req("c", 0, 8.0, 10.0, 8);
        c.gpus = 1;
        let reqs = [req("a", 0, 40.0, 60.0, 8), req("b", 0, 25.0, 60.0, 8), c];
        let d = decide_cold(ColdBaseline::Infless, &reqs, 8, &[10.0]);
        assert_eq!(d.gpus, vec![2, 4, 1]);
        assert_eq!(d.late, vec![false, false, true]);
        // ElasticFlow hands the last GPU to the greatest marginal gain:
        // a at 2 → 3 saves 10 s, b at 4 → 5 saves 3 s.
        let d = decide_cold(ColdBaseline::ElasticFlow, &reqs, 8, &[10.0]);
        assert_eq!(d.gpus, vec![3, 4, 1]);
        // With 5 free GPUs b takes 4 and a waits (its share is not free):
        // nothing is handed out beyond the shares while a request waits.
        let d = decide_cold(ColdBaseline::ElasticFlow, &reqs[..2], 5, &[10.0]);
        assert_eq!(d.gpus, vec![0, 4]);
        assert_eq!(d.late, vec![false, false]);
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

    /// What a trainer gets (the index as bank candidates) walks to the same
    /// prompt with the same scorings as the scheduler's own lookup.
    #[test]
    fn prompttuner_prompt_bank_index_walked_by_a_trainer_finds_what_lookup_finds() {
        use crate::trainer::{BankCandidate, bank_clusters, walk_bank};
        let bank = bank_of_three();
        let index = bank.index();
        assert_eq!(index.len(), 36, "every prompt once");
        for k in 0..3 {
            assert_eq!(
                index.iter().filter(|(_, c, m)| *c == k && *m).count(),
                1,
                "one medoid in cluster {k}"
            );
        }
        let features: std::collections::BTreeMap<String, Vec<f64>> = index
            .iter()
            .map(|(c, _, _)| (c.id.clone(), c.features.clone()))
            .collect();
        let sent: Vec<BankCandidate> = index
            .iter()
            .map(|(c, cluster, medoid)| BankCandidate {
                id: c.id.clone(),
                path: format!("/out/{}/prompt.json", c.id),
                cluster: *cluster,
                medoid: *medoid,
            })
            .collect();
        let task = [2.125f64.cos(), 2.125f64.sin()];
        let clusters = bank_clusters(&sent);
        let (best, score, scored) =
            walk_bank(&clusters, |c| cosine_distance(&features[&c.id], &task)).unwrap();
        let (expected, expected_scored) = bank
            .lookup(|c| cosine_distance(&c.features, &task))
            .unwrap();
        assert_eq!(
            (best.id.as_str(), scored),
            (expected.id.as_str(), expected_scored)
        );
        assert!(score < 1e-3, "{score}");
        assert!(walk_bank::<u32>(&[], |_| 0.0).is_none());
    }

    /// Hashed features keep cosine distances: a prompt near another stays
    /// near it, an unrelated one stays far; short vectors are kept as they
    /// are.
    #[test]
    fn prompttuner_index_features_keep_cosine_distances() {
        let mut z = 7u64;
        let mut next = move || {
            z = z
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (z >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        let a: Vec<f64> = (0..4096).map(|_| next()).collect();
        let near: Vec<f64> = a.iter().map(|x| x + 0.05 * next()).collect();
        let far: Vec<f64> = (0..4096).map(|_| next()).collect();
        let (ha, hn, hf) = (
            index_features(&a),
            index_features(&near),
            index_features(&far),
        );
        assert_eq!(ha.len(), INDEX_DIMS);
        for (x, y) in [(&a, &near), (&a, &far)] {
            let raw = cosine_distance(x, y);
            let hashed = cosine_distance(&index_features(x), &index_features(y));
            // Within a few standard errors (1/√256 of a unit inner product).
            assert!((raw - hashed).abs() < 0.2, "{raw} vs {hashed}");
        }
        assert!(cosine_distance(&ha, &hn) < 0.05 && cosine_distance(&ha, &hf) > 0.8);
        assert_eq!(index_features(&[1.0, 2.0]), vec![1.0, 2.0]);
    }

    /// Inserts keep the clusters; once `round(√C)` moved away from them,
    /// the bank asks to be rebuilt.
    #[test]
    fn prompttuner_prompt_bank_wants_a_rebuild_once_sqrt_c_moved() {
        let mut bank = PromptBank::build(Vec::new(), None, 100);
        assert!(!bank.wants_rebuild());
        for j in 0..3 {
            bank.insert(Candidate {
                id: j.to_string(),
                features: vec![1.0, j as f64],
            });
        }
        // C = 3: round(√3) = 2, yet one cluster.
        assert_eq!((bank.len(), bank.clusters()), (3, 1));
        assert!(bank.wants_rebuild());
        let rebuilt = PromptBank::build(
            bank.index()
                .into_iter()
                .map(|(c, _, _)| c.clone())
                .collect(),
            None,
            100,
        );
        assert_eq!(rebuilt.clusters(), 2);
        assert!(!rebuilt.wants_rebuild());
    }
}
