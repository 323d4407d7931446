//! EstimatorService through a real server over its own Postgres database:
//! every RPC, its validation errors, and what survives a restart.

use std::net::SocketAddr;

use estimator_svc::server::{self, Config};
use fmsched_proto::v1 as pb;
use fmsched_proto::v1::estimator_service_client::EstimatorServiceClient;
use sqlx::Connection;
use tokio::sync::oneshot;
use tonic::Code;
use tonic::transport::Channel;

fn admin_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

fn db_url(name: &str) -> String {
    let base = admin_url();
    let (prefix, _) = base
        .rsplit_once('/')
        .expect("DATABASE_URL has a database path");
    format!("{prefix}/{name}")
}

struct Db(String);

impl Db {
    async fn create() -> Db {
        let name = format!("fmsched_est_{}", uuid_like());
        let mut c = sqlx::PgConnection::connect(&admin_url())
            .await
            .expect("connect to Postgres (DATABASE_URL)");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut c)
            .await
            .unwrap();
        Db(name)
    }

    async fn drop(self) {
        if let Ok(mut c) = sqlx::PgConnection::connect(&admin_url()).await {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.0))
                .execute(&mut c)
                .await;
        }
    }
}

fn uuid_like() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{:x}{:x}", t, std::process::id())
}

struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Server {
    async fn start(db: &Db) -> Server {
        Self::start_with(db, None).await
    }

    async fn start_with(db: &Db, metrics: Option<std::net::SocketAddr>) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cfg = Config {
            database_url: Some(db_url(&db.0)),
            metrics_addr: metrics,
            ..Default::default()
        };
        let (tx, rx) = oneshot::channel();
        let handle = tokio::spawn(server::run(cfg, listener, async {
            let _ = rx.await;
        }));
        Server {
            addr,
            stop: Some(tx),
            handle,
        }
    }

    async fn client(&self) -> EstimatorServiceClient<Channel> {
        for _ in 0..100 {
            if let Ok(c) = EstimatorServiceClient::connect(format!("http://{}", self.addr)).await {
                // The server answers once migrations ran.
                let mut c = c.max_decoding_message_size(64 * 1024 * 1024);
                if c.lookup_throughput(key("roberta-base", "1", 8))
                    .await
                    .is_ok()
                {
                    return c;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("estimator did not come up");
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.handle.await.unwrap().unwrap();
    }
}

fn key(model: &str, placement: &str, bsz: u32) -> pb::LookupThroughputRequest {
    pb::LookupThroughputRequest {
        key: Some(pb::ThroughputKey {
            model: model.into(),
            gpu_type: "Tesla V100-SXM2-32GB".into(),
            placement: placement.into(),
            local_batch_size: bsz,
            amp: true,
            ..Default::default()
        }),
    }
}

fn assert_invalid<T: std::fmt::Debug>(r: Result<T, tonic::Status>, field: &str) {
    let e = r.expect_err("expected INVALID_ARGUMENT");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains(field),
        "message {:?} should name {field:?}",
        e.message()
    );
}

fn curve_trace() -> (Vec<f64>, Vec<f64>) {
    // L(k) = 1 / (1e-6 k² + 0.002 k + 0.5) + 0.2
    (0..200)
        .map(|i| {
            let k = f64::from(i) * 10.0;
            (k, 1.0 / (1e-6 * k * k + 0.002 * k + 0.5) + 0.2)
        })
        .unzip()
}

#[tokio::test]
async fn every_rpc_computes_and_rejects_bad_input() {
    let db = Db::create().await;
    let metrics = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let server = Server::start_with(&db, Some(metrics)).await;
    let mut c = server.client().await;

    // FitLossCurve → PredictIterations.
    let (k, l) = curve_trace();
    let fit = c
        .fit_loss_curve(pb::FitLossCurveRequest {
            iterations: k.clone(),
            losses: l.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let curve = fit.curve.unwrap();
    assert!(curve.quality > 0.99, "{curve:?}");
    assert_eq!(fit.points, 200);
    let alone = c
        .predict_iterations(pb::PredictIterationsRequest {
            curve: Some(curve),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let helped = c
        .predict_iterations(pb::PredictIterationsRequest {
            curve: Some(curve),
            gain: 0.5,
            max_iterations: 1_000_000,
            metric_iterations: vec![0.0, 100.0, 200.0, 300.0, 400.0],
            metric_values: vec![0.5, 0.7, 0.76, 0.79, 0.805],
            metric_target: 0.82,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        alone.iterations > 0 && helped.iterations < alone.iterations,
        "{alone:?} {helped:?}"
    );
    assert!(
        helped.metric_target_iteration > 400 || helped.target_unreachable,
        "{helped:?}"
    );

    // Bad traces.
    let mut nan = l.clone();
    nan[3] = f64::NAN;
    assert_invalid(
        c.fit_loss_curve(pb::FitLossCurveRequest {
            iterations: k.clone(),
            losses: nan,
        })
        .await,
        "losses[3]",
    );
    assert_invalid(
        c.fit_loss_curve(pb::FitLossCurveRequest {
            iterations: vec![],
            losses: vec![],
        })
        .await,
        "losses",
    );
    assert_invalid(
        c.fit_loss_curve(pb::FitLossCurveRequest {
            iterations: k[..10].to_vec(),
            losses: l[..9].to_vec(),
        })
        .await,
        "different lengths",
    );
    // 10^7 points: refused before anything is fitted (the 4 MiB limit or
    // the point limit, whichever comes first).
    let huge = vec![1.0; 10_000_000];
    let e = c
        .fit_loss_curve(pb::FitLossCurveRequest {
            iterations: huge.clone(),
            losses: huge,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            e.code(),
            Code::InvalidArgument | Code::OutOfRange | Code::ResourceExhausted
        ),
        "{e:?}"
    );
    assert_invalid(
        c.predict_iterations(pb::PredictIterationsRequest::default())
            .await,
        "curve",
    );
    assert_invalid(
        c.predict_iterations(pb::PredictIterationsRequest {
            curve: Some(pb::LossCurve {
                beta1: 1.0,
                beta2: f64::INFINITY,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await,
        "curve.beta2",
    );

    // ScoreTransfer: three tasks, every ordered temporal pair + spatial pairs.
    let task = |id: &str, f: Vec<f64>| pb::TaskEmbedding {
        job_id: id.into(),
        fisher_repeat: f.iter().map(|x| x * 1.01).collect(),
        fisher: f,
    };
    let scores = c
        .score_transfer(pb::ScoreTransferRequest {
            tasks: vec![
                task("a", vec![1.0, 2.0, 3.0, 4.0]),
                task("b", vec![1.1, 2.1, 2.9, 4.2]),
                task("c", vec![4.0, 0.1, 0.1, 0.2]),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(scores.pairs.len(), 6 + 3);
    let find = |a: &str, b: &str, m: pb::TransferMode| {
        scores
            .pairs
            .iter()
            .find(|p| p.job_a == a && p.job_b == b && p.mode == m as i32)
            .unwrap()
            .clone()
    };
    let close = find("a", "b", pb::TransferMode::Temporal);
    let far = find("a", "c", pb::TransferMode::Temporal);
    assert!(
        close.score < far.score && close.gain > far.gain,
        "{close:?} {far:?}"
    );
    assert!(close.positive);
    assert_invalid(
        c.score_transfer(pb::ScoreTransferRequest {
            tasks: vec![task("a", vec![1.0, 2.0]), task("b", vec![1.0])],
        })
        .await,
        "tasks[1]",
    );
    assert_invalid(
        c.score_transfer(pb::ScoreTransferRequest {
            tasks: vec![task("a", vec![1.0, f64::NAN]), task("b", vec![1.0, 1.0])],
        })
        .await,
        "tasks[0]",
    );

    // PredictJobTimes: Ymir's allocation set, jobs and pairs with TranWt.
    let job = |id: &str, k: u64| pb::JobTimeInput {
        job_id: id.into(),
        model: "roberta-base".into(),
        gpu_type: "V100".into(),
        global_batch_size: 32,
        remaining_iterations: k,
        samples_per_epoch: 10_000,
        amp: true,
        ..Default::default()
    };
    let table = c
        .predict_job_times(pb::PredictJobTimesRequest {
            jobs: vec![job("a", 1000), job("b", 3000)],
            pairs: vec![
                pb::PairInput {
                    job_a: 0,
                    job_b: 1,
                    mode: pb::TransferMode::Temporal as i32,
                    gain_ab: 0.5,
                    gain_ba: 0.0,
                },
                pb::PairInput {
                    job_a: 0,
                    job_b: 1,
                    mode: pb::TransferMode::Spatial as i32,
                    gain_ab: 0.2,
                    gain_ba: 0.2,
                },
            ],
            max_gpus: 8,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(table.allocations, vec![0, 1, 2, 3, 4, 8]);
    assert_eq!(table.rows.len(), 4);
    let a = &table.rows[0];
    assert!(a.seconds[0].is_infinite(), "a = 0 never finishes");
    assert!(
        a.seconds[1] > a.seconds[2] && a.seconds[2] > a.seconds[4],
        "{:?}",
        a.seconds
    );
    let temporal = &table.rows[2];
    assert_eq!(temporal.iterations, 2000, "3000 / (1 + 0.5)");
    assert!(
        temporal.tran_wt[1] > 1.0,
        "a helpful temporal pair: {:?}",
        temporal.tran_wt
    );
    assert_eq!(temporal.tran_wt[0], 0.0);
    assert_invalid(
        c.predict_job_times(pb::PredictJobTimesRequest {
            jobs: vec![pb::JobTimeInput {
                model: "gpt-9".into(),
                ..job("x", 1)
            }],
            max_gpus: 4,
            ..Default::default()
        })
        .await,
        "jobs[0].model",
    );
    assert_invalid(
        c.predict_job_times(pb::PredictJobTimesRequest {
            jobs: vec![job("a", 1)],
            pairs: vec![pb::PairInput {
                job_a: 0,
                job_b: 7,
                mode: pb::TransferMode::Temporal as i32,
                ..Default::default()
            }],
            max_gpus: 4,
            ..Default::default()
        })
        .await,
        "pairs[0].job_b",
    );
    assert_invalid(
        c.predict_job_times(pb::PredictJobTimesRequest {
            jobs: vec![job("a", 1), job("b", 1)],
            pairs: vec![pb::PairInput {
                job_a: 0,
                job_b: 1,
                mode: 42,
                ..Default::default()
            }],
            max_gpus: 4,
            ..Default::default()
        })
        .await,
        "pairs[0].mode",
    );
    // A layer-elastic job (ICEFROG Eq. 16): with its deep layers still
    // learning and its early ones settled, its row is faster than the same
    // job's plain row wherever it runs; bad tuning inputs name the field.
    let elastic = pb::JobTimeInput {
        layer_variance: (0..12).map(|i| if i < 6 { 1e-3 } else { 1.0 }).collect(),
        max_frozen_layers: 10,
        ..job("e", 1000)
    };
    let table = c
        .predict_job_times(pb::PredictJobTimesRequest {
            jobs: vec![job("a", 1000), elastic.clone()],
            max_gpus: 4,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    for k in 1..table.allocations.len() {
        assert!(
            table.rows[1].seconds[k] < table.rows[0].seconds[k],
            "{:?} vs {:?}",
            table.rows[1].seconds,
            table.rows[0].seconds
        );
    }

    // An expert-parallel MoE job is estimated at its own group size: the
    // same job with experts over groups of 2 and of 4 GPUs gets different
    // rows; a group the model cannot have names the field (as do bad
    // layer-tuning inputs).
    let moe = |ep| pb::JobTimeInput {
        model: "switch-base-8".into(),
        expert_parallel: ep,
        ..job("m", 1000)
    };
    let table = c
        .predict_job_times(pb::PredictJobTimesRequest {
            jobs: vec![moe(0), moe(2), moe(4)],
            allocations: vec![4],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let at4: Vec<f64> = table.rows.iter().map(|r| r.seconds[0]).collect();
    assert!(
        at4.iter().all(|s| s.is_finite()) && at4[0] != at4[1] && at4[1] != at4[2],
        "{at4:?}"
    );
    for (bad, field) in [
        (
            pb::JobTimeInput {
                layer_variance: vec![1.0, f64::NAN],
                ..elastic.clone()
            },
            "jobs[0].layer_variance[1]",
        ),
        (
            pb::JobTimeInput {
                max_frozen_layers: 99,
                ..elastic.clone()
            },
            "jobs[0].max_frozen_layers",
        ),
        (
            pb::JobTimeInput {
                expert_parallel: 2,
                ..job("d", 1000)
            },
            "jobs[0].expert_parallel",
        ),
        (moe(3), "jobs[0].expert_parallel"),
    ] {
        assert_invalid(
            c.predict_job_times(pb::PredictJobTimesRequest {
                jobs: vec![bad],
                max_gpus: 4,
                ..Default::default()
            })
            .await,
            field,
        );
    }
    let mut dense_group = key("roberta-base", "4", 8);
    dense_group.key.as_mut().unwrap().expert_parallel = 4;
    assert_invalid(
        c.lookup_throughput(dense_group).await,
        "key.expert_parallel",
    );

    // LookupThroughput.

    let t = c
        .lookup_throughput(key("roberta-base", "4", 8))
        .await
        .unwrap()
        .into_inner();
    assert!(
        t.step_time_seconds > 0.0 && t.feasible && !t.interpolated,
        "{t:?}"
    );
    assert!(t.context_switch_seconds > 0.0);
    assert_invalid(
        c.lookup_throughput(key("no-such-model", "4", 8)).await,
        "key.model",
    );
    assert_invalid(
        c.lookup_throughput(key("roberta-base", "4x", 8)).await,
        "key.placement",
    );
    assert_invalid(
        c.lookup_throughput(key("roberta-base", "4", 0)).await,
        "key.local_batch_size",
    );

    // ImportProfile: a bad CSV names its line and changes nothing.
    let e = c
        .import_profile(pb::ImportProfileRequest {
            model: "roberta-base".into(),
            gpu_type: "V100".into(),
            layout: "placements".into(),
            csv: "placement,local_bsz,step_time,sync_time\n1,8,0.5,0\n1,x,0.1,0\n".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("line 3"), "{e:?}");
    assert_invalid(
        c.import_profile(pb::ImportProfileRequest {
            model: "m".into(),
            gpu_type: "V100".into(),
            layout: "xml".into(),
            csv: "a\n".into(),
        })
        .await,
        "layout",
    );
    let before = c
        .lookup_throughput(key("roberta-base", "1", 8))
        .await
        .unwrap()
        .into_inner();
    assert!(
        (before.step_time_seconds - 0.5).abs() > 1e-6,
        "the failed import changed nothing"
    );

    // RecordStepTimes validation.
    assert_invalid(
        c.record_step_times(pb::RecordStepTimesRequest {
            samples: vec![pb::StepTimeSample {
                key: key("roberta-base", "1", 8).key,
                step_time_seconds: f64::NAN,
                sync_time_seconds: 0.0,
            }],
        })
        .await,
        "samples[0].step_time_seconds",
    );
    assert_invalid(
        c.record_transfer_outcome(pb::RecordTransferOutcomeRequest {
            score: f64::INFINITY,
            gain: 0.1,
        })
        .await,
        "score",
    );

    // Every call above is counted on /metrics, errors separately.
    let m = fmsched_runtime::metrics::scrape(metrics).await.unwrap();
    assert!(
        m.contains("fmsched_estimator_requests_total{rpc=\"FitLossCurve\"}"),
        "{m}"
    );
    let errors: f64 = m
        .lines()
        .find(|l| l.starts_with("fmsched_estimator_errors_total{rpc=\"FitLossCurve\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(errors >= 3.0, "bad traces are counted as errors: {m}");
    server.stop().await;
    db.drop().await;
}

#[tokio::test]
async fn what_the_estimator_learns_survives_a_restart() {
    let db = Db::create().await;
    let server = Server::start(&db).await;
    let mut c = server.client().await;

    // A measured profile for a new model, online step times, merge outcomes.
    let rows = c
        .import_profile(pb::ImportProfileRequest {
            model: "my-model".into(),
            gpu_type: "NVIDIA A100-SXM4-80GB".into(),
            layout: "placements".into(),
            csv: "placement,local_bsz,step_time,sync_time\n1,8,0.30,0\n1,16,0.50,0\n".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .rows;
    assert_eq!(rows, 2);
    let k = pb::ThroughputKey {
        model: "my-model".into(),
        gpu_type: "A100".into(),
        placement: "1".into(),
        local_batch_size: 8,
        amp: true,
        ..Default::default()
    };
    let samples: Vec<pb::StepTimeSample> = (0..27)
        .map(|_| pb::StepTimeSample {
            key: Some(k.clone()),
            step_time_seconds: 0.40,
            sync_time_seconds: 0.0,
        })
        .chain(std::iter::once(pb::StepTimeSample {
            key: Some(k.clone()),
            step_time_seconds: 40.0,
            sync_time_seconds: 0.0,
        }))
        .collect();
    let rec = c
        .record_step_times(pb::RecordStepTimesRequest { samples })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((rec.accepted, rec.rejected_outliers), (27, 1));
    let lookup = pb::LookupThroughputRequest {
        key: Some(k.clone()),
    };
    let learned = c
        .lookup_throughput(lookup.clone())
        .await
        .unwrap()
        .into_inner();
    // (3 · 0.30 + 27 · 0.40) / 30 = 0.39
    assert!(
        (learned.step_time_seconds - 0.39).abs() < 1e-9,
        "{learned:?}"
    );
    for _ in 0..10 {
        c.record_transfer_outcome(pb::RecordTransferOutcomeRequest {
            score: 0.1,
            gain: 0.8,
        })
        .await
        .unwrap();
    }
    let outcome = c
        .record_transfer_outcome(pb::RecordTransferOutcomeRequest {
            score: 0.9,
            gain: -0.5,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(outcome.observed_merges, 11);
    // A measurement of an expert-parallel key is its own: the table of
    // groups of 4 learns it, the same placement without a group does not.
    let group = |ep| pb::ThroughputKey {
        model: "switch-base-8".into(),
        gpu_type: "A100".into(),
        placement: "4".into(),
        local_batch_size: 8,
        amp: true,
        expert_parallel: ep,
        ..Default::default()
    };
    let lookup_at = |ep| pb::LookupThroughputRequest {
        key: Some(group(ep)),
    };
    let plain_before = c
        .lookup_throughput(lookup_at(0))
        .await
        .unwrap()
        .into_inner()
        .step_time_seconds;
    let table4 = c
        .lookup_throughput(lookup_at(4))
        .await
        .unwrap()
        .into_inner()
        .step_time_seconds;
    let rec = c
        .record_step_times(pb::RecordStepTimesRequest {
            samples: vec![
                pb::StepTimeSample {
                    key: Some(group(4)),
                    step_time_seconds: 1.5 * table4,
                    sync_time_seconds: 0.0,
                };
                3
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rec.accepted, 3);
    let learned4 = c
        .lookup_throughput(lookup_at(4))
        .await
        .unwrap()
        .into_inner()
        .step_time_seconds;
    // (3 · t + 3 · 1.5 t) / 6 = 1.25 t
    assert!(
        (learned4 - 1.25 * table4).abs() < 1e-9,
        "{learned4} vs {table4}"
    );
    server.stop().await;

    // A fresh process over the same database knows all of it.
    let server = Server::start(&db).await;
    let mut c = server.client().await;
    let again = c.lookup_throughput(lookup).await.unwrap().into_inner();
    assert!((again.step_time_seconds - 0.39).abs() < 1e-9, "{again:?}");
    let again4 = c
        .lookup_throughput(lookup_at(4))
        .await
        .unwrap()
        .into_inner()
        .step_time_seconds;
    assert!((again4 - learned4).abs() < 1e-9, "{again4} vs {learned4}");
    let plain_after = c
        .lookup_throughput(lookup_at(0))
        .await
        .unwrap()
        .into_inner()
        .step_time_seconds;
    assert_eq!(plain_after, plain_before, "the plain key learned nothing");
    let next = c
        .record_transfer_outcome(pb::RecordTransferOutcomeRequest {
            score: 0.5,
            gain: 0.1,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next.observed_merges, 12);
    assert!(
        next.slope < 0.0,
        "the learned line falls with the score: {next:?}"
    );
    server.stop().await;
    db.drop().await;
}
