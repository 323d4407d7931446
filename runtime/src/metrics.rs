//! Prometheus `/metrics` for fmsched's services: the families each
//! service renders on every scrape from the state it already keeps,
//! encoded by the `prometheus` crate's text encoder (exposition format
//! 0.0.4), and a small endpoint that serves them.
//!
//! Owns: the metric types (counter, gauge), their names' and labels'
//! validation and the text format, through the library. Does not own which
//! families a service exposes or what they count (each service's
//! `metrics` module).

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use prometheus::{CounterVec, Encoder as _, GaugeVec, Opts, Registry, TextEncoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Renders the metrics text on a scrape.
pub type Render = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = String> + Send>> + Send + Sync>;

/// A family's Prometheus type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only grows (the value given is the total so far).
    Counter,
    /// Goes up and down.
    Gauge,
}

/// One scrape's families: declared with [`Exposition::family`], filled
/// with [`Exposition::sample`], encoded by [`Exposition::finish`]. The
/// values are set at scrape time from the service's own state, so each
/// scrape builds a fresh registry.
#[derive(Default)]
pub struct Exposition {
    registry: Registry,
    families: BTreeMap<String, Family>,
}

struct Family {
    kind: Kind,
    help: String,
    /// Created at the first sample, whose label names the family keeps.
    metrics: Option<(Vec<String>, Metrics)>,
}

enum Metrics {
    Counter(CounterVec),
    Gauge(GaugeVec),
}

impl Exposition {
    /// Declares a family; declaring it again keeps the first declaration.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) -> &mut Self {
        self.families.entry(name.to_string()).or_insert(Family {
            kind,
            help: help.to_string(),
            metrics: None,
        });
        self
    }

    /// One sample with labels. A family is declared before its samples,
    /// and all its samples carry the same label names; a sample that
    /// breaks either is left out (logged), never the whole scrape.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) -> &mut Self {
        let Some(family) = self.families.get_mut(name) else {
            tracing::warn!(
                metric = name,
                "metric sampled before its family was declared"
            );
            return self;
        };
        let names: Vec<String> = labels.iter().map(|(k, _)| k.to_string()).collect();
        if family.metrics.is_none() {
            match new_metrics(name, family, &names) {
                Ok(m) => {
                    if let Err(e) = self.registry.register(m.collector()) {
                        tracing::warn!(metric = name, error = %e, "metric family not registered");
                        return self;
                    }
                    family.metrics = Some((names.clone(), m));
                }
                Err(e) => {
                    tracing::warn!(metric = name, error = %e, "invalid metric family");
                    return self;
                }
            }
        }
        let Some((known, metrics)) = &family.metrics else {
            return self;
        };
        if *known != names {
            tracing::warn!(
                metric = name,
                "sample's label names differ from its family's"
            );
            return self;
        }
        let values: Vec<&str> = labels.iter().map(|(_, v)| *v).collect();
        // Non-finite values are shown as NaN (neither +Inf nor -Inf is a
        // figure any of our families can mean).
        let value = if value.is_finite() { value } else { f64::NAN };
        match metrics {
            Metrics::Counter(c) => match c.get_metric_with_label_values(&values) {
                Ok(c) => c.inc_by(if value < 0.0 { 0.0 } else { value }),
                Err(e) => tracing::warn!(metric = name, error = %e, "counter sample"),
            },
            Metrics::Gauge(g) => match g.get_metric_with_label_values(&values) {
                Ok(g) => g.set(value),
                Err(e) => tracing::warn!(metric = name, error = %e, "gauge sample"),
            },
        }
        self
    }

    /// A family with one unlabeled sample (most counters and gauges).
    pub fn scalar(&mut self, name: &str, kind: Kind, help: &str, value: f64) -> &mut Self {
        self.family(name, kind, help).sample(name, &[], value)
    }

    /// The text exposition (format 0.0.4) of every family with a sample,
    /// sorted by name.
    pub fn finish(self) -> String {
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "metrics not encoded");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

fn new_metrics(name: &str, family: &Family, labels: &[String]) -> prometheus::Result<Metrics> {
    let opts = Opts::new(name, family.help.clone());
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    Ok(match family.kind {
        Kind::Counter => Metrics::Counter(CounterVec::new(opts, &labels)?),
        Kind::Gauge => Metrics::Gauge(GaugeVec::new(opts, &labels)?),
    })
}

impl Metrics {
    fn collector(&self) -> Box<dyn prometheus::core::Collector> {
        match self {
            Metrics::Counter(c) => Box::new(c.clone()),
            Metrics::Gauge(g) => Box::new(g.clone()),
        }
    }
}

/// Serves `GET /metrics` on `addr` until the task is dropped. Anything else
/// gets 404. Requests larger than 8 KiB are refused.
pub async fn serve(addr: SocketAddr, render: Render) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "metrics serving on /metrics");
    serve_on(listener, render).await
}

/// Like [`serve`] on a bound listener (tests pick port 0).
pub async fn serve_on(listener: tokio::net::TcpListener, render: Render) -> std::io::Result<()> {
    loop {
        let (mut stream, _) = listener.accept().await?;
        let render = render.clone();
        tokio::spawn(async move {
            let mut buf = Vec::with_capacity(1024);
            let mut chunk = [0u8; 1024];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 8192 {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let request = String::from_utf8_lossy(&buf);
            let (status, body) =
                if request.starts_with("GET /metrics ") || request.starts_with("GET /metrics?") {
                    ("200 OK", render().await)
                } else {
                    (
                        "404 Not Found",
                        "only /metrics is served here\n".to_string(),
                    )
                };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

/// CPU time and resident memory of this process (Linux `/proc/self`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
}

/// Reads [`ProcessStats`]; None where `/proc` is not there.
pub fn process_stats() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces): state is the
    // 3rd field of the line, utime and stime the 14th and 15th.
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = rest.get(11)?.parse::<f64>().ok()? + rest.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf reads a constant of the running system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(ProcessStats {
        cpu_seconds: ticks / hz,
        resident_bytes: rss_kib * 1024,
    })
}

impl Exposition {
    /// The standard `process_cpu_seconds_total` and
    /// `process_resident_memory_bytes` of this process.
    pub fn process(&mut self) -> &mut Self {
        if let Some(p) = process_stats() {
            self.scalar(
                "process_cpu_seconds_total",
                Kind::Counter,
                "User and system CPU time of this process, in seconds.",
                p.cpu_seconds,
            );
            self.scalar(
                "process_resident_memory_bytes",
                Kind::Gauge,
                "Resident memory of this process, in bytes.",
                p.resident_bytes as f64,
            );
        }
        self
    }
}

/// Fetches `http://addr/metrics` (for tests and health checks).
pub async fn scrape(addr: SocketAddr) -> std::io::Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The library's text format: HELP and TYPE once per family, samples
    /// under their family, families sorted by name, counters' totals as
    /// given; a sample whose labels do not match its family's, or of an
    /// undeclared family, is left out and the rest is still served.
    #[test]
    fn families_are_typed_and_a_bad_sample_is_left_out() {
        let mut e = Exposition::default();
        e.scalar("fmsched_rounds_total", Kind::Counter, "Rounds run.", 12.0);
        e.family("fmsched_nodes", Kind::Gauge, "Nodes by state.");
        e.sample("fmsched_nodes", &[("state", "available")], 2.0);
        e.sample("fmsched_nodes", &[("state", "offline")], 0.0);
        e.sample("fmsched_nodes", &[("zone", "x")], 5.0);
        e.sample("fmsched_undeclared", &[], 1.0);
        e.scalar("fmsched_ratio", Kind::Gauge, "A ratio.", f64::INFINITY);
        let text = e.finish();
        let expected = "# HELP fmsched_nodes Nodes by state.\n\
                        # TYPE fmsched_nodes gauge\n\
                        fmsched_nodes{state=\"available\"} 2\n\
                        fmsched_nodes{state=\"offline\"} 0\n\
                        # HELP fmsched_ratio A ratio.\n\
                        # TYPE fmsched_ratio gauge\n\
                        fmsched_ratio NaN\n\
                        # HELP fmsched_rounds_total Rounds run.\n\
                        # TYPE fmsched_rounds_total counter\n\
                        fmsched_rounds_total 12\n";
        assert_eq!(text, expected);
    }

    #[tokio::test]
    async fn serves_the_exposition_format() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let render: Render = Arc::new(|| {
            Box::pin(async {
                let mut e = Exposition::default();
                e.family("fmsched_jobs", Kind::Gauge, "Jobs by state.")
                    .sample("fmsched_jobs", &[("state", "running")], 3.0)
                    .sample("fmsched_jobs", &[("state", "q\"x")], 1.0);
                e.finish()
            })
        });
        let server = tokio::spawn(serve_on(listener, render));
        let body = scrape(addr).await.unwrap();
        assert!(body.contains("# TYPE fmsched_jobs gauge"), "{body}");
        assert!(body.contains("fmsched_jobs{state=\"running\"} 3"), "{body}");
        assert!(body.contains("fmsched_jobs{state=\"q\\\"x\"} 1"), "{body}");
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 404"), "{out}");
        server.abort();
    }
}
