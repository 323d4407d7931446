//! Helpers for the end-to-end tests in `tests/`: locating the workspace's
//! binaries, running them as child processes that are killed on drop, and a
//! throw-away Postgres database per test.

pub mod cluster;

pub use cluster::Cluster;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use fmsched_proto::v1 as pb;

/// Directory holding the workspace binaries (`target/debug` when tests run
/// from `target/debug/deps`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir");
    let dir = if deps.ends_with("deps") {
        deps.parent().unwrap()
    } else {
        deps
    };
    dir.to_path_buf()
}

/// Path of a workspace binary; panics with the command to build it.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.exists(),
        "{} not found: build the binaries first with `cargo build --workspace --bins` (scripts/test.sh does)",
        p.display()
    );
    p
}

/// Repository root (for examples/).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A free TCP port on 127.0.0.1 (bound then released).
pub fn free_port() -> u16 {
    // The kernel may hand the same ephemeral port out again once the probe
    // closes: two calls in a row (a scheduler's gRPC and metrics ports)
    // then collide. A port is given out once per test process.
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// The first of `width` consecutive ports, all free now, below the
/// kernel's ephemeral range (32768 and up on Linux), for a range a test
/// hands out itself (gang rendezvous ports). Ports from [`free_port`], and
/// every outgoing connection's, come from the ephemeral range: a range
/// picked there could be taken by another test's process before the
/// trainer binds it (which once left a gang's rank 0 retrying a port in
/// use). The start is drawn at random so concurrent test processes rarely
/// overlap, and every port is probed.
pub fn free_port_range(width: u16) -> u16 {
    use std::hash::{BuildHasher, Hasher};
    const LOW: u16 = 10_000;
    const HIGH: u16 = 32_768;
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let mut seed = h.finish();
    loop {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let span = u64::from(HIGH - LOW - width);
        let base = LOW + ((seed >> 33) % span) as u16;
        if (base..base + width).all(|p| TcpListener::bind(("0.0.0.0", p)).is_ok()) {
            return base;
        }
    }
}

/// URL of the test server's admin database (`DATABASE_URL`, else the
/// local trust-auth server).
pub fn admin_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// URL of database `name` on the server of [`admin_url`].
pub fn db_url(name: &str) -> String {
    let base = admin_url();
    let (server, _) = base
        .rsplit_once('/')
        .expect("DATABASE_URL has a database path");
    format!("{server}/{name}")
}

/// Runs one statement on the test server's admin database.
async fn admin_sql(q: &str) -> Result<(), sqlx::Error> {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(&admin_url()).await?;
    sqlx::query(q).execute(&mut c).await?;
    Ok(())
}

/// A throw-away database on the test server, named `<prefix>_<uuid>`. It
/// is dropped (`WITH (FORCE)`, closing whatever is still connected) when
/// the guard goes, also when the test fails: a failing test leaves no
/// database behind. Derefs to its name.
pub struct TestDb {
    name: String,
}

impl TestDb {
    pub async fn create(prefix: &str) -> TestDb {
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        admin_sql(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name} at DATABASE_URL: {e}"));
        TestDb { name }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn url(&self) -> String {
        db_url(&self.name)
    }
}

impl std::ops::Deref for TestDb {
    type Target = str;
    fn deref(&self) -> &str {
        &self.name
    }
}

impl std::fmt::Display for TestDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Drop may run inside a test's runtime, which cannot be blocked
        // on: the statement runs on a thread with a runtime of its own.
        // Errors are ignored (a panic here, while a failed test unwinds,
        // would abort the test binary).
        let q = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                let _ = rt.block_on(admin_sql(&q));
            }
        })
        .join();
    }
}

/// A child process killed (SIGKILL) when dropped; its output goes to a log file.
pub struct Proc {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command, log_dir: &Path) -> Proc {
        let log = log_dir.join(format!("{name}.log"));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        cmd.stdout(f.try_clone().unwrap())
            .stderr(f)
            .stdin(Stdio::null());
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {name}: {e}"));
        Proc {
            name: name.to_string(),
            child,
            log,
        }
    }

    /// `kill -9`, and reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    /// Kills the process; when the test is failing, prints the end of its
    /// log first (the test's folder is deleted with it).
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            let text = self.log_text();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL)..];
            eprintln!(
                "---- last {} lines of {} ({}) ----\n{}",
                tail.len(),
                self.name,
                self.log.display(),
                tail.join("\n")
            );
        }
    }
}

/// Log lines a failing test prints of each of its processes.
const LOG_TAIL: usize = 80;

/// Polls `f` every 100 ms until it returns `Some`, or panics after `timeout`
/// with `what` and the last observation.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < timeout {
        match f() {
            Ok(v) => return v,
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out after {timeout:?} waiting for {what}; last: {last}");
}

/// Runs a command to completion.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

/// Writes each `(name, manifest)` to `dir/<name>.yaml` and submits them all
/// with one `fmctl submit` (see [`fmctl`]).
pub fn submit_manifests(
    port: u16,
    token: &str,
    dir: &Path,
    jobs: impl IntoIterator<Item = (String, String)>,
) -> Result<String, String> {
    let mut files = Vec::new();
    for (name, manifest) in jobs {
        let f = dir.join(format!("{name}.yaml"));
        std::fs::write(&f, manifest).unwrap_or_else(|e| panic!("writing {}: {e}", f.display()));
        files.push(f.display().to_string());
    }
    let mut args = vec!["submit"];
    args.extend(files.iter().map(String::as_str));
    fmctl(port, token, &args)
}

/// Runs `fmctl` against a scheduler on 127.0.0.1:`port` with `token`:
/// standard output on success, standard error as the error.
pub fn fmctl(port: u16, token: &str, args: &[&str]) -> Result<String, String> {
    let out = run(fmctl_command(port, token).args(args));
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `fmctl` pointed at the scheduler on `port` with `token`, no config file.
pub fn fmctl_command(port: u16, token: &str) -> Command {
    let mut c = Command::new(bin("fmctl"));
    c.env("FMSCHED_ENDPOINT", format!("http://127.0.0.1:{port}"))
        .env("FMSCHED_TOKEN", token)
        .env("FMCTL_CONFIG", "/dev/null");
    c
}

fn pg_bin() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("Debian's PostgreSQL binaries (scripts/test.sh installs them)")
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("initdb").exists())
        .collect();
    dirs.sort();
    dirs.pop().expect("an initdb under /usr/lib/postgresql")
}

/// Runs a Postgres tool as the `postgres` user when we are root (Postgres
/// refuses to run as root).
fn pg(tool: &str, args: &[&str]) -> std::process::Output {
    let bin = pg_bin().join(tool);
    let is_root = run(Command::new("id").arg("-u")).stdout.starts_with(b"0");
    let mut c = if is_root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(&bin);
        c
    } else {
        Command::new(&bin)
    };
    run(c.args(args))
}

/// A throw-away Postgres server of its own (Debian's binaries, as
/// `scripts/dev-up.sh` uses), for tests that stop and start the database
/// without touching the shared test server. Stopped when dropped.
pub struct PrivatePostgres {
    dir: PathBuf,
    port: u16,
}

impl PrivatePostgres {
    pub fn start(dir: &Path) -> PrivatePostgres {
        let data = dir.join("pg");
        std::fs::create_dir_all(&data).unwrap();
        let _ = Command::new("chown")
            .args(["-R", "postgres", &dir.display().to_string()])
            .status();
        let out = pg(
            "initdb",
            &[
                "-D",
                &data.display().to_string(),
                "-U",
                "postgres",
                "--auth=trust",
            ],
        );
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let c = PrivatePostgres {
            dir: data,
            port: free_port(),
        };
        c.ctl("start");
        c
    }

    /// `pg_ctl start` / `stop` (fast shutdown), waiting until done.
    pub fn ctl(&self, what: &str) {
        let opts = format!("-p {} -k /tmp -c listen_addresses=127.0.0.1", self.port);
        let log = self.dir.join("log");
        let out = pg(
            "pg_ctl",
            &[
                "-D",
                &self.dir.display().to_string(),
                "-l",
                &log.display().to_string(),
                "-w",
                "-m",
                "fast",
                "-o",
                &opts,
                what,
            ],
        );
        assert!(
            out.status.success(),
            "pg_ctl {what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// URL of its `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = pg(
            "pg_ctl",
            &[
                "-D",
                &self.dir.display().to_string(),
                "-m",
                "immediate",
                "stop",
            ],
        );
    }
}

/// A desired training task running the FAKE trainer (a long iteration
/// budget, 100× time compression) on one GPU.
pub fn fake_trainer_task(id: &str, gpu: &str) -> pb::DesiredTask {
    pb::DesiredTask {
        task_id: id.into(),
        job_ids: vec![id.into()],
        mode: pb::TaskMode::Train as i32,
        phase: pb::DesiredPhase::Running as i32,
        gpu_uuids: vec![gpu.into()],
        command: vec![bin("fake-trainer").display().to_string()],
        env: [(
            "FMSCHED_FAKE_TIME_COMPRESSION".to_string(),
            "100".to_string(),
        )]
        .into(),
        tasks: vec![pb::TrainerTask {
            job_id: id.into(),
            model: "roberta-base".into(),
            task: "rte".into(),
            dataset_uri: "file:///data/rte".into(),
            global_batch_size: 32,
            max_iterations: 10_000_000,
            samples_per_epoch: 3200,
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn exists(name: &str) -> bool {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(&admin_url()).await.unwrap();
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pg_database WHERE datname = $1")
            .bind(name)
            .fetch_one(&mut c)
            .await
            .unwrap()
            > 0
    }

    #[tokio::test]
    async fn a_test_database_is_dropped_with_its_guard_even_while_connected() {
        let db = TestDb::create("fmsched_guard").await;
        let name = db.name().to_string();
        assert!(exists(&name).await);
        // A connection still open (a scheduler the test did not stop) does
        // not keep it.
        let _open = sqlx::PgPool::connect(&db.url()).await.unwrap();
        drop(db);
        assert!(!exists(&name).await, "{name} is still there");
    }

    #[tokio::test]
    async fn a_failing_test_leaves_no_database_behind() {
        // A test body that creates its database and panics, on a runtime
        // of its own, as a failing #[tokio::test] does.
        let made = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let seen = made.clone();
        let failed = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    let db = TestDb::create("fmsched_guard").await;
                    *seen.lock().unwrap() = db.name().to_string();
                    panic!("the test fails");
                })
        })
        .join();
        assert!(failed.is_err(), "the body panicked");
        let name = made.lock().unwrap().clone();
        assert!(name.starts_with("fmsched_guard_"), "{name:?}");
        assert!(!exists(&name).await, "{name} outlived its failed test");
    }
}
