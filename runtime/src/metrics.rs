//! A minimal Prometheus `/metrics` endpoint (text exposition format 0.0.4)
//! and a writer for the format. Each service renders its own metrics on
//! every scrape from the state it already keeps; there is no registry.

use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Renders the metrics text on a scrape.
pub type Render = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = String> + Send>> + Send + Sync>;

/// Builds one exposition: `# HELP`/`# TYPE` once per family, then samples.
#[derive(Default)]
pub struct Exposition {
    out: String,
    families: Vec<String>,
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Exposition {
    /// Declares a family (`kind`: counter, gauge).
    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        if !self.families.iter().any(|f| f == name) {
            let _ = writeln!(self.out, "# HELP {name} {help}");
            let _ = writeln!(self.out, "# TYPE {name} {kind}");
            self.families.push(name.to_string());
        }
        self
    }

    /// One sample with labels.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) -> &mut Self {
        let _ = write!(self.out, "{name}");
        if !labels.is_empty() {
            let l: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            let _ = write!(self.out, "{{{}}}", l.join(","));
        }
        let v = if value.is_finite() {
            format!("{value}")
        } else {
            "NaN".into()
        };
        let _ = writeln!(self.out, " {v}");
        self
    }

    /// A family with one unlabeled sample (most counters and gauges).
    pub fn scalar(&mut self, name: &str, kind: &str, help: &str, value: f64) -> &mut Self {
        self.family(name, kind, help).sample(name, &[], value)
    }

    pub fn finish(self) -> String {
        self.out
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
                "counter",
                "User and system CPU time of this process, in seconds.",
                p.cpu_seconds,
            );
            self.scalar(
                "process_resident_memory_bytes",
                "gauge",
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

    #[tokio::test]
    async fn serves_the_exposition_format() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let render: Render = Arc::new(|| {
            Box::pin(async {
                let mut e = Exposition::default();
                e.family("fmsched_jobs", "gauge", "Jobs by state.")
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
