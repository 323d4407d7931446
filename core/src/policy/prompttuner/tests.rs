//! Tests of `prompttuner`.

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
fn prompttuner_warm_pool_serves_the_tightest_slo_first_and_gives_0_to_what_cannot_meet_its_slo() {
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
