//! Tests of the command line's readers and set-up.

use clap::Parser;
use fmsched_core::policy::PlacementRule;
use fmsched_sim::engine::NodeGroup;

use super::args::*;
use super::compare::compare;
use super::fidelity::*;
use super::setup::*;

#[test]
fn samples_per_epoch_come_from_flags_and_files_and_name_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("samples.txt");
    std::fs::write(&f, "# GLUE train sets\nwnli=635\nroberta-base/snli, 1000\n").unwrap();
    let got = samples_per_epoch(&["rte=2490".into(), f.display().to_string()]).unwrap();
    assert_eq!(
        got,
        vec![
            ("rte".to_string(), 2490.0),
            ("wnli".to_string(), 635.0),
            ("roberta-base/snli".to_string(), 1000.0),
        ]
    );
    let e = samples_per_epoch(&["rte=-1".into()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"-1\" is not a number > 0"), "{e}");
    std::fs::write(&f, "wnli=635\nsnli\n").unwrap();
    let e = samples_per_epoch(&[f.display().to_string()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 2") && e.contains("is not TASK=N"), "{e}");
    // The per-job layout of the published data: `<model>@<task>`.
    std::fs::write(
        &f,
        "job,application,progress_per_epoch\nroberta-base@rte-0,roberta-base@rte,623\n",
    )
    .unwrap();
    assert_eq!(
        samples_per_epoch(&[f.display().to_string()]).unwrap(),
        vec![("roberta-base/rte".to_string(), 623.0)]
    );
    // Setting a task the catalog lacks is refused, naming it.
    let e = load_catalog(None, &["no-such-task=5".into()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("no task \"no-such-task\""), "{e}");
    let c = load_catalog(None, &["rte=7".into(), "bert-base/rte=9".into()]).unwrap();
    assert_eq!(
        c.task("roberta-base", "rte").unwrap().samples_per_epoch,
        7.0
    );
    assert_eq!(c.task("bert-base", "rte").unwrap().samples_per_epoch, 9.0);
}

fn sim_args(flags: &[&str]) -> SimArgs {
    let argv = [&["fmsim", "run", "--workload", "w.csv"][..], flags].concat();
    match Cli::try_parse_from(argv).unwrap().cmd {
        Cmd::Run { sim, .. } => sim,
        other => unreachable!("{other:?}"),
    }
}

/// `compare`'s replay flags: each job's epochs and max GPUs from a
/// per-job file (a job without a row is named), the placement rule, the
/// round origin, and which policies see TitanSched's predicted times.
#[test]
fn replay_flags_set_per_job_figures_and_the_simulators_rules() {
    let args = |flags: &[&str]| {
        let argv = [
            &["fmsim", "run", "--workload", "data/small-workload.csv"][..],
            flags,
        ]
        .concat();
        match Cli::try_parse_from(argv).unwrap().cmd {
            Cmd::Run { sim, .. } => sim,
            other => unreachable!("{other:?}"),
        }
    };
    let (cfg, _, _, own) = sim_setup(&args(&[])).unwrap();
    assert_eq!(cfg.placement_rule, PlacementRule::Pack);
    assert_eq!(cfg.round_origin_s, None);
    assert!(own.iter().all(|j| j.epochs != Some(2.5) && j.max_gpus < 16));

    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("jobs.csv");
    let mut rows = String::from("job,epochs_pandas_default,progress_per_epoch,max_num_gpus\n");
    for j in &own {
        rows += &format!("{},2.5,100,16\n", j.name);
    }
    std::fs::write(&f, &rows).unwrap();
    let p = f.display().to_string();
    let (_, _, _, jobs) = sim_setup(&args(&["--job-epochs", &p])).unwrap();
    assert!(jobs.iter().all(|j| j.epochs == Some(2.5)));
    assert_eq!(
        jobs.iter().map(|j| j.max_gpus).collect::<Vec<_>>(),
        own.iter().map(|j| j.max_gpus).collect::<Vec<_>>(),
        "--job-epochs leaves max GPUs alone"
    );
    let (cfg, _, _, jobs) = sim_setup(&args(&[
        "--job-max-gpus",
        &p,
        "--placement",
        "fewest-nodes",
        "--round-origin",
        "0",
    ]))
    .unwrap();
    assert!(jobs.iter().all(|j| j.max_gpus == 16));
    assert_eq!(
        jobs.iter().map(|j| j.epochs).collect::<Vec<_>>(),
        own.iter().map(|j| j.epochs).collect::<Vec<_>>(),
        "--job-max-gpus leaves epochs alone"
    );
    assert_eq!(cfg.placement_rule, PlacementRule::FewestNodes);
    assert_eq!(cfg.round_origin_s, Some(0.0));

    let last = &own.last().unwrap().name;
    std::fs::write(&f, rows.replace(&format!("{last},"), "someone-else,")).unwrap();
    let e = sim_setup(&args(&["--job-epochs", &p]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&p) && e.contains(&format!("no row for job {last}")),
        "{e}"
    );
    assert!(
        Cli::try_parse_from(["fmsim", "run", "--workload", "w", "--placement", "spread"]).is_err()
    );
    let e = compare(
        &args(&["--titansched-estimates", "optimus"]),
        &["ymir".to_string()],
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("\"optimus\", which is not among the policies run"),
        "{e}"
    );
}

/// `--nodes` is a count of one kind of node or `TYPE:COUNT:GPUS` groups;
/// `--cluster` reads the same from a CSV; a bad group names the flag
/// (or file and line) and the field.
#[test]
fn nodes_and_cluster_files_give_the_node_groups() {
    let groups = |flags: &[&str]| cluster_of(&sim_args(flags)).map_err(|e| e.to_string());
    assert_eq!(groups(&[]).unwrap(), vec![NodeGroup::new("V100", 8, 4)]);
    assert_eq!(
        groups(&["--nodes", "3", "--gpus-per-node", "8", "--gpu-type", "A100"]).unwrap(),
        vec![NodeGroup::new("A100", 3, 8)]
    );
    assert_eq!(
        groups(&["--nodes", "V100:2:4", "--nodes", "H100:1:8"]).unwrap(),
        vec![NodeGroup::new("V100", 2, 4), NodeGroup::new("H100", 1, 8)]
    );
    for (flags, want) in [
        (&["--nodes", "V100:2"][..], "expected TYPE:COUNT:GPUS"),
        (
            &["--nodes", "3", "--nodes", "A100:1:8"],
            "expected TYPE:COUNT:GPUS",
        ),
        (&["--nodes", "A100:1:16"], "16 GPUs per node"),
        (&["--nodes", "A100:0:8"], "node count \"0\""),
        (&["--nodes", ":1:8"], "GPU type is empty"),
    ] {
        let e = groups(flags).unwrap_err();
        assert!(e.contains(want), "{flags:?}: {e}");
    }
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("cluster.csv");
    std::fs::write(&f, "gpu_type,count,gpus_per_node\nV100,4,4\nA100,2,8\n").unwrap();
    let path = f.display().to_string();
    assert_eq!(
        groups(&["--cluster", &path]).unwrap(),
        vec![NodeGroup::new("V100", 4, 4), NodeGroup::new("A100", 2, 8)]
    );
    std::fs::write(&f, "gpu_type,count,gpus_per_node\nV100,4,4\nA100,x,8\n").unwrap();
    let e = groups(&["--cluster", &path]).unwrap_err();
    assert!(e.contains("line 3") && e.contains("node count"), "{e}");
    std::fs::write(&f, "gpu,count\nV100,4\n").unwrap();
    let e = groups(&["--cluster", &path]).unwrap_err();
    assert!(e.contains("missing column \"gpu_type\""), "{e}");
    assert!(
        Cli::try_parse_from([
            "fmsim",
            "run",
            "--workload",
            "w",
            "--nodes",
            "2",
            "--cluster",
            &path
        ])
        .is_err()
    );
}

/// The authors' table is read from the README beside their data, by
/// column name; a malformed cell is refused with its line.
#[test]
fn the_authors_table_is_read_from_the_readme_beside_the_data() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("titansched");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(
        root.path().join("README.md"),
        "# Anchor\n\nSome text | with a bar.\n\n\
         | workload | Titan (merging) | Titan (no merging) | Optimus | Themis | Tiresias | SRTF |\n\
         |---|---|---|---|---|---|---|\n\
         | FM-1-vit (320) | 0.2 / 0.8 | 0.4 / 1.5 | 0.5 / 1.3 | 0.8 / 4.0 | 1.5 / 4.4 | 1.0 / 5.6 |\n",
    )
    .unwrap();
    let t = authors_table(&data).unwrap();
    assert_eq!(t.keys().collect::<Vec<_>>(), vec!["vit"]);
    assert_eq!(t["vit"]["themis"], (0.8, 4.0));
    assert_eq!(t["vit"]["ymir-no-merge"], (0.4, 1.5));
    assert_eq!(t["vit"]["srtf"], (1.0, 5.6));

    std::fs::write(
        data.join("README.md"),
        "| workload | Optimus | Themis |\n|---|---|---|\n| FM-1-vit (320) | 0.5 / 1.3 | 0.8 |\n",
    )
    .unwrap();
    let e = authors_table(&data).unwrap_err().to_string();
    assert!(e.contains("README.md:3") && e.contains("themis"), "{e}");

    std::fs::write(data.join("README.md"), "no table here\n").unwrap();
    let e = authors_table(&data).unwrap_err().to_string();
    assert!(e.contains("no table of the authors' results"), "{e}");
}
