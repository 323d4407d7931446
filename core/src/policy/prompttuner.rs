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
pub struct LaneDecision {
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
) -> LaneDecision {
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
    let mut d = LaneDecision {
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
mod tests;
