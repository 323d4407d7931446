//! Tests of `lut`.

use super::*;

/// `runs_on`: llama-2-7b's 4-stage pipeline does not fit 16 GB V100s
/// and fits A100s; roberta-base fits both; a GPU type the table does
/// not know is no reason to exclude it.
#[test]
fn runs_on_says_where_one_replica_fits() {
    let lut = crate::analytic::default_lut().unwrap();
    let pipe = Variant {
        pipeline: true,
        ..Variant::base()
    };
    assert!(!lut.runs_on("llama-2-7b", "V100", 4, 16, &pipe, 32));
    assert!(lut.runs_on("llama-2-7b", "A100", 4, 16, &pipe, 32));
    assert!(lut.runs_on("roberta-base", "V100", 1, 32, &Variant::base(), 12));
    assert!(lut.runs_on("roberta-base", "TPU-v9", 1, 32, &Variant::base(), 12));
    assert!(lut.runs_on("roberta-base", "V100", 12, 32, &Variant::base(), 12));
}

fn lut() -> Lut {
    let mut l = Lut::default();
    l.import_csv(
        "m",
        "V100",
        "placements",
        "p.csv",
        "placement,local_bsz,step_time,sync_time\n1,4,0.10,0.0\n1,8,0.18,0.0\n1,16,0.34,0.0\n44,4,0.20,0.08\n44,8,0.30,0.08\n",
    )
    .unwrap();
    l.import_csv(
        "m",
        "V100",
        "memory",
        "mem.csv",
        "local_bsz,gpu_memory\n4,2.0\n8,4.0\n16,8.0\n",
    )
    .unwrap();
    l.import_csv(
        "m",
        "V100",
        "context_switch",
        "cs.csv",
        "app,time_cost\na,12.5\nb,30.4\n",
    )
    .unwrap();
    l
}

fn key(p: &str, b: u32) -> ThroughputKey {
    ThroughputKey {
        model: "m".into(),
        gpu_type: "V100".into(),
        placement: p.into(),
        local_bsz: b,
        grad_accum: 1,
        variant: Variant::base(),
    }
}

#[test]
fn placements_canonicalise() {
    assert_eq!(canonical_placement("404").unwrap(), "44");
    assert_eq!(canonical_placement("31").unwrap(), "13");
    assert_eq!(canonical_placement("2110").unwrap(), "112");
    assert!(canonical_placement("").is_err());
    assert!(canonical_placement("00").is_err());
    assert!(canonical_placement("4x").is_err());
    assert_eq!(packed_placement(4, 4), "4");
    assert_eq!(packed_placement(8, 4), "44");
    assert_eq!(packed_placement(6, 4), "24");
}

#[test]
fn exact_points_interpolation_and_extrapolation() {
    let l = lut();
    let s = l.step_time(&key("1", 8), 12).unwrap();
    assert_eq!((s.step, s.interpolated), (0.18, false));
    let s = l.step_time(&key("1", 12), 12).unwrap();
    assert!((s.step - 0.26).abs() < 1e-12 && s.interpolated);
    // Beyond the last point: the line through (8, .18) and (16, .34).
    assert!((l.step_time(&key("1", 20), 12).unwrap().step - 0.42).abs() < 1e-12);
    // Rotated placement finds the same table.
    assert_eq!(l.step_time(&key("404", 4), 12).unwrap().step, 0.20);
}

#[test]
fn accumulation_and_memory() {
    let l = lut();
    // 64 samples on 1 GPU: local 64 > max 16 → 4 micro-steps of 16.
    let it = l
        .iteration_time("m", "V100", 1, 4, 64, &Variant::base(), 12)
        .unwrap();
    assert_eq!((it.local_bsz, it.grad_accum), (16, 4));
    assert!((it.seconds - (0.34 + 3.0 * 0.34)).abs() < 1e-12);
    // 8 GPUs, batch 32 → local 4 on "44".
    let it = l
        .iteration_time("m", "V100", 8, 4, 32, &Variant::base(), 12)
        .unwrap();
    assert_eq!((it.local_bsz, it.grad_accum), (4, 1));
    assert!((it.seconds - 0.20).abs() < 1e-12);
    // Memory: 64 local needs 32 GiB on a 16 GiB GPU → infeasible.
    let mut l2 = lut();
    l2.gpu_memory.insert("V100".into(), 16.0);
    assert!(!l2.step_time(&key("1", 64), 12).unwrap().feasible);
    assert!(l2.step_time(&key("1", 16), 12).unwrap().feasible);
    assert_eq!(l.context_switch_s("m", "V100"), Some(30.4));
}

#[test]
fn online_updates_pull_the_estimate_and_reject_outliers() {
    let mut l = lut();
    let k = key("1", 8);
    for _ in 0..27 {
        assert_eq!(l.record(&k, 0.20, 0.0, 12).unwrap(), Recorded::Accepted);
    }
    // (3·0.18 + 27·0.20) / 30 = 0.198
    assert!((l.step_time(&k, 12).unwrap().step - 0.198).abs() < 1e-9);
    assert_eq!(l.record(&k, 5.0, 0.0, 12).unwrap(), Recorded::Outlier);
    assert_eq!(l.record(&k, f64::NAN, 0.0, 12).unwrap(), Recorded::Outlier);
    assert!((l.step_time(&k, 12).unwrap().step - 0.198).abs() < 1e-9);
}

#[test]
fn bad_csv_names_the_line() {
    let mut l = Lut::default();
    let e = l
        .import_csv(
            "m",
            "g",
            "placements",
            "x.csv",
            "placement,local_bsz,step_time,sync_time\n1,4,0.1,0\n1,x,0.1,0\n",
        )
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "x.csv line 3: local_bsz: \"x\" is not a number"
    );
    let e = l
        .import_csv(
            "m",
            "g",
            "placements",
            "x.csv",
            "placement,local_bsz,step_time,sync_time\n1,4,0.1\n",
        )
        .unwrap_err();
    assert!(e.to_string().contains("line 2"), "{e}");
    assert!(matches!(
        l.import_csv("m", "g", "weird", "x", "a\n1\n"),
        Err(LutError::Layout(_))
    ));
    assert!(
        l.profile("m", "g", &Variant::base()).is_none(),
        "nothing imported on error"
    );
}

#[test]
fn unknown_placement_uses_the_scalability_table() {
    let mut l = lut();
    l.import_csv(
        "m",
        "V100",
        "scalability",
        "s.csv",
        "num_nodes,num_replicas,local_bsz,step_time,sync_time\n2,8,4,0.2,0.08\n2,8,8,0.3,0.08\n4,16,4,0.3,0.1\n4,16,8,0.4,0.1\n",
    )
    .unwrap();
    // "4444": 4 nodes, 16 replicas → exact grid point.
    assert!((l.step_time(&key("4444", 8), 12).unwrap().step - 0.4).abs() < 1e-12);
    // "444": 3 nodes, 12 replicas: between the two node slices.
    let s = l.step_time(&key("444", 4), 12).unwrap().step;
    assert!(s > 0.2 && s < 0.3, "{s}");
}

#[test]
fn interpolation_is_exact_at_profiled_points() {
    let l = lut();
    for (p, b, want) in [("1", 4, 0.10), ("1", 16, 0.34), ("44", 8, 0.30)] {
        assert_eq!(l.step_time(&key(p, b), 12).unwrap().step, want);
    }
}

proptest::proptest! {
    /// Interpolation returns the exact value at every profiled point,
    /// whatever the other points are.
    #[test]
    fn profiled_points_are_returned_exactly(
        points in proptest::collection::btree_map(1u32..512, (0.001f64..10.0, 0.0f64..0.001), 1..20),
    ) {
        let mut l = Lut::default();
        let mut csv = String::from("placement,local_bsz,step_time,sync_time\n");
        for (b, (s, y)) in &points {
            csv += &format!("4,{b},{s},{y}\n");
        }
        l.import_csv("m", "V100", "placements", "p.csv", &csv).unwrap();
        for (b, (s, _)) in &points {
            let got = l.step_time(&key("4", *b), 12).unwrap();
            proptest::prop_assert_eq!(got.step, *s);
            proptest::prop_assert!(!got.interpolated);
        }
    }
}
