//! Optional: leave-one-task-out accuracy of the learned prior on the
//! published TitanSched curves (not shipped with fmsched). Set
//! `FMSIM_ANCHOR_DIR` to the directory holding `task-curves.json` and
//! `workloads/`; without it the test says so and passes without measuring.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

#[test]
fn estimate_prior_leave_one_task_out_on_the_published_curves() {
    let Some(dir) = std::env::var_os("FMSIM_ANCHOR_DIR")
        .map(PathBuf::from)
        .filter(|d| d.join("task-curves.json").exists())
    else {
        eprintln!("FMSIM_ANCHOR_DIR unset or without task-curves.json: not measured");
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_estimator-accuracy"))
        .arg("--anchor-dir")
        .arg(&dir)
        .output()
        .expect("estimator-accuracy runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let v: BTreeMap<&str, f64> = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
        .collect();
    let get = |k: &str| *v.get(k).unwrap_or_else(|| panic!("no {k} in\n{text}"));
    // From 3 epochs (9.79 % / 9.81 %) and from half the trace (5 of 10
    // epochs: 5.55 % / 2.65 %) the prior meets 10 % for jobs alone and
    // temporal pairs: a job trained from another task's weights judged by
    // finished jobs that were too, and the headroom's share a third
    // feature (10.15 % / 11.7 % from 3 epochs without them).
    for n in [3, 5] {
        for kind in ["alone", "temporal"] {
            let ape = get(&format!("anchor_{n}ep_prior_{kind}_epochs_ape_mean_pct"));
            assert!(ape <= 10.0, "{n} epochs, {kind}: {ape} %");
        }
    }
    // It beats Ymir's per-job fit from 3 epochs on jobs alone and is no
    // worse on temporal pairs.
    let (prior, fit) = (
        get("anchor_3ep_prior_alone_epochs_ape_mean_pct"),
        get("anchor_3ep_fit_alone_epochs_ape_mean_pct"),
    );
    assert!(
        prior < fit,
        "3 epochs alone: prior {prior} % vs fit {fit} %"
    );
    let (prior, fit) = (
        get("anchor_3ep_prior_temporal_epochs_ape_mean_pct"),
        get("anchor_3ep_fit_temporal_epochs_ape_mean_pct"),
    );
    assert!(
        prior <= fit,
        "3 epochs temporal: prior {prior} % vs fit {fit} %"
    );
    // Finished jobs' targets are worth their keep: from 3 epochs the prior
    // beats both the same library without them (the curves' shapes alone,
    // 17.3 % / 14.0 %) and the no-estimate yardstick (14.2 % / 16.8 %), on
    // jobs alone and temporal pairs; from 5 epochs it beats the shapes.
    // And step 8 (the kernel's reading combined with the shipped shapes',
    // inverse-variance weights) beats the kernel alone on every mean:
    // 9.79 / 9.81 / 12.8 % against 11.9 / 11.3 / 14.2 % from 3 epochs,
    // 5.55 / 2.65 / 4.9 % against 5.7 / 2.7 / 5.2 % from 5.
    for n in [3, 5] {
        for kind in ["alone", "temporal", "spatial"] {
            let prior = get(&format!("anchor_{n}ep_prior_{kind}_epochs_ape_mean_pct"));
            let other = |reading: &str| {
                get(&format!(
                    "anchor_{n}ep_{reading}_{kind}_epochs_ape_mean_pct"
                ))
            };
            let mut beaten = vec![("the kernel alone", other("kernel_alone"))];
            if kind != "spatial" {
                beaten.push(("shapes", other("shape_prior")));
                if n == 3 {
                    beaten.push(("to the cap", other("train_to_cap")));
                }
            }
            for (name, ape) in beaten {
                assert!(
                    prior < ape,
                    "{n} epochs {kind}: prior {prior} % vs {name} {ape} %"
                );
            }
        }
    }
    // By model, from 3 epochs, jobs alone meet 10 % on vit (2.5 %;
    // ViT-Base 5.69 % in Ymir Table 2); roberta-base, 7.3 % on the kernel
    // alone before the headroom's share, reads 12.3 % (RoBERTa-Base 8.27 %
    // in Table 2), and the large models miss most.
    let by_model: BTreeMap<&str, f64> = text
        .lines()
        .find_map(|l| l.strip_prefix("anchor_3ep_prior_alone_epochs_ape_mean_by_model="))
        .unwrap_or_else(|| panic!("no per-model figures in\n{text}"))
        .split(", ")
        .filter_map(|m| {
            let (model, rest) = m.split_once(' ')?;
            Some((model, rest.split_once('%')?.0.parse().ok()?))
        })
        .collect();
    assert_eq!(by_model.len(), 4, "{by_model:?}");
    assert!(by_model["vit"] <= 10.0, "3 epochs alone, vit: {by_model:?}");
    // The spread means something: most truths fall inside p10–p90.
    assert!(get("anchor_3ep_prior_p10_p90_coverage_pct") >= 80.0);
    // The published curves are read exactly: every target is its curve's
    // best value (read a unit in the last place low, 20 % of them were
    // never reached and their truth became the last epoch).
    assert_eq!(get("anchor_alone_targets_at_curve_best_pct"), 100.0);
    assert_eq!(get("anchor_alone_distinct_cases"), 35.0);
    // Every case of the three modes is read: the tasks of spatial pairs
    // (finished merged jobs in the libraries) with their task's target.
    assert_eq!(get("anchor_alone_jobs"), 660.0);
    assert_eq!(get("anchor_temporal_pairs"), 294.0);
    assert_eq!(get("anchor_spatial_pair_tasks"), 296.0);
    // The no-estimate yardstick (train to the cap unless the head met the
    // target) depends on the data alone: 387 of the 660 jobs alone first
    // reach their target at the last epoch, the rest earlier. Pinned, so a
    // change in how curves, targets or truths are read shows here first.
    assert_eq!(
        get("anchor_3ep_train_to_cap_alone_epochs_ape_mean_pct"),
        14.22
    );
    assert_eq!(
        get("anchor_5ep_train_to_cap_temporal_epochs_ape_mean_pct"),
        2.84
    );
}
