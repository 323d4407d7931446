//! Process plumbing shared by `scheduler-svc`, `estimator-svc` and
//! `node-agent`: layered configuration, logging, shutdown signals and a
//! secret type that never prints.

pub mod metrics;

use std::fmt;
use std::path::Path;

use serde::Deserialize;
use serde::de::DeserializeOwned;

pub use config::ConfigError;

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Human,
    Json,
}

/// `[log]` section of every binary's config.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub format: LogFormat,
    /// `tracing` filter directive, e.g. `info,scheduler_svc=debug`. `RUST_LOG` wins when set.
    pub filter: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Human,
            filter: "info".into(),
        }
    }
}

/// Installs the global `tracing` subscriber (stderr). `RUST_LOG` overrides
/// the configured filter.
pub fn init_logging(cfg: &LogConfig) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&cfg.filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match cfg.format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// How to layer one binary's configuration.
pub struct Layering<'a> {
    /// Environment prefix, e.g. `FMSCHED` (keys `FMSCHED_<KEY>`, nested with `__`).
    pub env_prefix: &'a str,
    /// Variables under the prefix that are not config keys (secrets, the
    /// config path itself).
    pub not_keys: &'a [&'a str],
    /// Keys whose environment value is a comma-separated list.
    pub list_keys: &'a [&'a str],
    /// Prefixes of other components sharing the namespace (e.g. the agent's
    /// `FMSCHED_AGENT_` under the scheduler's `FMSCHED_`): skipped.
    pub foreign_prefixes: &'a [&'a str],
}

/// Defaults → TOML `file` → environment, deserialised into `T` (which should
/// use `#[serde(deny_unknown_fields, default)]` so unknown keys are errors).
pub fn load_layered<T: DeserializeOwned>(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    layering: &Layering<'_>,
) -> Result<T, config::ConfigError> {
    let mut b = config::Config::builder();
    if let Some(f) = file {
        b = b.add_source(
            config::File::from(f)
                .format(config::FileFormat::Toml)
                .required(true),
        );
    }
    let prefix = format!("{}_", layering.env_prefix);
    let env: config::Map<String, String> = env
        .into_iter()
        .filter(|(k, _)| {
            k.starts_with(&prefix)
                && !layering.not_keys.contains(&k.as_str())
                && !layering.foreign_prefixes.iter().any(|p| k.starts_with(p))
        })
        .collect();
    let mut source = config::Environment::with_prefix(layering.env_prefix)
        .prefix_separator("_")
        .separator("__")
        .try_parsing(true)
        .source(Some(env));
    if !layering.list_keys.is_empty() {
        source = source.list_separator(",");
        for k in layering.list_keys {
            source = source.with_list_parse_key(k);
        }
    }
    b.add_source(source).build()?.try_deserialize()
}

/// Calls `connect` until it succeeds or `patience` runs out, waiting
/// 200 ms, then twice as long each time (at most 5 s). A service started
/// before its database waits for it instead of crash-looping.
pub async fn retry_connect<T, E, F, Fut>(
    what: &str,
    patience: std::time::Duration,
    mut connect: F,
) -> Result<T, E>
where
    E: fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let started = tokio::time::Instant::now();
    let mut delay = std::time::Duration::from_millis(200);
    loop {
        match connect().await {
            Ok(v) => return Ok(v),
            Err(e) if started.elapsed() < patience => {
                tracing::warn!(error = %e, retry_in = ?delay, "{what} not reachable yet");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutdown requested");
}

/// A secret string whose `Debug` and `Display` print nothing.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Reads a secret from an environment variable, else from a file (trimmed).
pub fn read_secret(
    env: &std::collections::HashMap<String, String>,
    var: &str,
    file: Option<&Path>,
) -> Result<Option<Secret>, std::io::Error> {
    if let Some(v) = env.get(var) {
        return Ok(Some(Secret::new(v.trim())));
    }
    match file {
        Some(p) => Ok(Some(Secret::new(std::fs::read_to_string(p)?.trim()))),
        None => Ok(None),
    }
}

/// This host's name (from the kernel), or `localhost` if unknown.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, Default)]
    #[serde(deny_unknown_fields, default)]
    struct Demo {
        a: u32,
        nested: Nested,
        list: Vec<String>,
    }

    #[derive(Debug, Deserialize, Default)]
    #[serde(deny_unknown_fields, default)]
    struct Nested {
        b: String,
    }

    const L: Layering<'static> = Layering {
        env_prefix: "DEMO",
        not_keys: &["DEMO_SECRET"],
        list_keys: &["list"],
        foreign_prefixes: &["DEMO_OTHER_"],
    };

    #[test]
    fn env_overrides_and_secrets_are_not_keys() {
        let env = vec![
            ("DEMO_A".to_string(), "7".to_string()),
            ("DEMO_NESTED__B".to_string(), "x".to_string()),
            ("DEMO_LIST".to_string(), "p,q".to_string()),
            ("DEMO_SECRET".to_string(), "s".to_string()),
            ("DEMO_OTHER_THING".to_string(), "ignored".to_string()),
        ];
        let d: Demo = load_layered(None, env, &L).unwrap();
        assert_eq!(d.a, 7);
        assert_eq!(d.nested.b, "x");
        assert_eq!(d.list, vec!["p", "q"]);
    }

    #[test]
    fn unknown_env_key_is_an_error() {
        let env = vec![("DEMO_NOPE".to_string(), "1".to_string())];
        let e = load_layered::<Demo>(None, env, &L).unwrap_err().to_string();
        assert!(e.contains("nope"), "{e}");
    }

    #[test]
    fn secret_never_prints() {
        let s = Secret::new("hunter2-hunter2");
        assert!(!format!("{s:?}{s}").contains("hunter2"));
    }
}
