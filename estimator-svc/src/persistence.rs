//! The estimator's database access — the only module of this crate that
//! imports sqlx. Its tables live in their own Postgres schema
//! ([`SCHEMA`]) with their own migration history, so the estimator can share
//! a database with the scheduler without either touching the other's tables.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Row};

use crate::lut::{Measured, ThroughputKey, Variant};

/// Migrations of `estimator-svc/migrations/`, embedded at build time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Postgres schema holding every estimator table.
pub const SCHEMA: &str = "fmsched_estimator";

#[derive(Debug, thiserror::Error)]
pub enum PersistenceError {
    #[error("database error in {op}: {source}")]
    Database {
        op: &'static str,
        source: sqlx::Error,
    },
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("corrupt row in {op}: {message}")]
    Corrupt { op: &'static str, message: String },
}

fn db_err(op: &'static str) -> impl FnOnce(sqlx::Error) -> PersistenceError {
    move |source| PersistenceError::Database { op, source }
}

/// One imported profile table.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportedProfile {
    pub model: String,
    pub gpu_type: String,
    pub layout: String,
    pub csv: String,
}

/// Everything learned so far, as loaded at start.
#[derive(Clone, Debug, Default)]
pub struct Learned {
    pub imports: Vec<ImportedProfile>,
    pub measurements: Vec<(ThroughputKey, Measured)>,
    pub outcomes: Vec<(f64, f64)>,
}

/// Owns the estimator's connection pool (cheap to clone).
#[derive(Clone, Debug)]
pub struct Persistence {
    pool: PgPool,
}

impl Persistence {
    /// Connects with `search_path` set to [`SCHEMA`], creating the schema
    /// when it does not exist yet.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, PersistenceError> {
        let opts: PgConnectOptions = url.parse().map_err(db_err("parse database url"))?;
        let opts = opts
            .application_name("fmsched-estimator")
            .options([("search_path", SCHEMA)]);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(opts)
            .await
            .map_err(db_err("connect"))?;
        sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
            .execute(&pool)
            .await
            .map_err(db_err("create schema"))?;
        Ok(Self { pool })
    }

    /// Applies pending migrations (idempotent, safe with several replicas).
    pub async fn migrate(&self) -> Result<(), PersistenceError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    /// Loads imports, measurements and merge outcomes, oldest first.
    pub async fn load(&self) -> Result<Learned, PersistenceError> {
        const OP: &str = "load learned state";
        let mut out = Learned::default();
        for r in
            sqlx::query("SELECT model, gpu_type, layout, csv FROM imported_profiles ORDER BY seq")
                .fetch_all(&self.pool)
                .await
                .map_err(db_err(OP))?
        {
            out.imports.push(ImportedProfile {
                model: r.try_get("model").map_err(db_err(OP))?,
                gpu_type: r.try_get("gpu_type").map_err(db_err(OP))?,
                layout: r.try_get("layout").map_err(db_err(OP))?,
                csv: r.try_get("csv").map_err(db_err(OP))?,
            });
        }
        for r in sqlx::query(
            "SELECT model, gpu_type, placement, local_bsz, grad_accum, amp, frozen_layers, grad_ckpt, petl, \
             pipeline, expert_parallel, n, mean_step, m2_step, mean_sync FROM lut_measurements ORDER BY 1, 2, 3, 4, 5",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err(OP))?
        {
            let int = |col: &str| -> Result<u32, PersistenceError> {
                let v: i32 = r.try_get(col).map_err(db_err(OP))?;
                u32::try_from(v).map_err(|_| PersistenceError::Corrupt {
                    op: OP,
                    message: format!("{col} = {v}"),
                })
            };
            let n: i64 = r.try_get("n").map_err(db_err(OP))?;
            out.measurements.push((
                ThroughputKey {
                    model: r.try_get("model").map_err(db_err(OP))?,
                    gpu_type: r.try_get("gpu_type").map_err(db_err(OP))?,
                    placement: r.try_get("placement").map_err(db_err(OP))?,
                    local_bsz: int("local_bsz")?,
                    grad_accum: int("grad_accum")?,
                    variant: Variant {
                        amp: r.try_get("amp").map_err(db_err(OP))?,
                        frozen_layers: int("frozen_layers")?,
                        gradient_checkpointing: r.try_get("grad_ckpt").map_err(db_err(OP))?,
                        petl: r.try_get("petl").map_err(db_err(OP))?,
                        pipeline: r.try_get("pipeline").map_err(db_err(OP))?,
                        expert_parallel: int("expert_parallel")?,
                    },
                },
                Measured {
                    n: n.max(0) as u64,
                    mean_step: r.try_get("mean_step").map_err(db_err(OP))?,
                    m2_step: r.try_get("m2_step").map_err(db_err(OP))?,
                    mean_sync: r.try_get("mean_sync").map_err(db_err(OP))?,
                },
            ));
        }
        for r in sqlx::query("SELECT score, gain FROM transfer_outcomes ORDER BY seq")
            .fetch_all(&self.pool)
            .await
            .map_err(db_err(OP))?
        {
            out.outcomes.push((
                r.try_get("score").map_err(db_err(OP))?,
                r.try_get("gain").map_err(db_err(OP))?,
            ));
        }
        Ok(out)
    }

    /// Stores the current statistics of the given keys, in one transaction.
    pub async fn save_measurements(
        &self,
        rows: &[(ThroughputKey, Measured)],
    ) -> Result<(), PersistenceError> {
        const OP: &str = "save measurements";
        let mut tx = self.pool.begin().await.map_err(db_err(OP))?;
        for (k, m) in rows {
            sqlx::query(
                "INSERT INTO lut_measurements (model, gpu_type, placement, local_bsz, grad_accum, amp, \
                 frozen_layers, grad_ckpt, petl, pipeline, expert_parallel, n, mean_step, m2_step, \
                 mean_sync, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, now()) \
                 ON CONFLICT (model, gpu_type, placement, local_bsz, grad_accum, amp, frozen_layers, \
                 grad_ckpt, petl, pipeline, expert_parallel) DO UPDATE SET n = EXCLUDED.n, mean_step = EXCLUDED.mean_step, \
                 m2_step = EXCLUDED.m2_step, mean_sync = EXCLUDED.mean_sync, updated_at = now()",
            )
            .bind(&k.model)
            .bind(&k.gpu_type)
            .bind(&k.placement)
            .bind(k.local_bsz as i32)
            .bind(k.grad_accum as i32)
            .bind(k.variant.amp)
            .bind(k.variant.frozen_layers as i32)
            .bind(k.variant.gradient_checkpointing)
            .bind(&k.variant.petl)
            .bind(k.variant.pipeline)
            .bind(k.variant.expert_parallel as i32)
            .bind(m.n as i64)
            .bind(m.mean_step)
            .bind(m.m2_step)
            .bind(m.mean_sync)
            .execute(&mut *tx)
            .await
            .map_err(db_err(OP))?;
        }
        tx.commit().await.map_err(db_err(OP))
    }

    pub async fn save_import(&self, p: &ImportedProfile) -> Result<(), PersistenceError> {
        sqlx::query(
            "INSERT INTO imported_profiles (model, gpu_type, layout, csv) VALUES ($1, $2, $3, $4)",
        )
        .bind(&p.model)
        .bind(&p.gpu_type)
        .bind(&p.layout)
        .bind(&p.csv)
        .execute(&self.pool)
        .await
        .map_err(db_err("save import"))?;
        Ok(())
    }

    pub async fn save_outcome(&self, score: f64, gain: f64) -> Result<(), PersistenceError> {
        sqlx::query("INSERT INTO transfer_outcomes (score, gain) VALUES ($1, $2)")
            .bind(score)
            .bind(gain)
            .execute(&self.pool)
            .await
            .map_err(db_err("save transfer outcome"))?;
        Ok(())
    }
}
