//! The launch command, its environment and working directory, labels, and
//! the text rules of names a log or a path may carry. A job is a tenant's
//! untrusted code: what it asks the agent to run must not reach into the
//! agent (its dynamic linker, an interpreter's start-up hooks, the trainer
//! contract's own variables) nor outside its job directory.

use super::{Limits, R, err, string};
use crate::job::JobSpec;

/// Variables a job may not set in `launch.env`, by exact name: the start-up
/// hooks of the shells and interpreters a trainer runs (each runs code
/// before the trainer's own), and the agent's secrets.
const DENIED_ENV: &[&str] = &[
    // Shells.
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "IFS",
    "PROMPT_COMMAND",
    // Python, Perl, Ruby, Node.js, the JVM.
    "PYTHONSTARTUP",
    "PYTHONINSPECT",
    "PYTHONHOME",
    "PYTHONEXECUTABLE",
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "RUBYOPT",
    "RUBYLIB",
    "NODE_OPTIONS",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    // glibc's loadable conversion modules and resolver hooks.
    "GCONV_PATH",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "RES_OPTIONS",
    "NLSPATH",
    "MALLOC_TRACE",
];

/// Prefixes of variables a job may not set: the dynamic linkers (glibc's
/// `LD_PRELOAD`, `LD_LIBRARY_PATH`, `LD_AUDIT` …, macOS's `DYLD_*`), and
/// fmsched's own (`FMSCHED_*`: the trainer contract the agent sets, and the
/// services' configuration and secrets) except the fake trainer's knobs.
const DENIED_ENV_PREFIXES: &[&str] = &["LD_", "DYLD_", "FMSCHED_"];

/// The fake trainer's knobs, which a test or demo job sets in its env.
const ALLOWED_FMSCHED_PREFIX: &str = "FMSCHED_FAKE_";

fn is_env_key(k: &str) -> bool {
    let mut chars = k.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Why `key` may not be set by a job, if it may not.
pub fn denied_env(key: &str) -> Option<&'static str> {
    let upper = key.to_ascii_uppercase();
    if upper.starts_with(ALLOWED_FMSCHED_PREFIX) {
        return None;
    }
    if upper.starts_with("FMSCHED_") {
        return Some(
            "FMSCHED_* variables are the trainer contract's and the agent's own (set by the agent)",
        );
    }
    if DENIED_ENV_PREFIXES.iter().any(|p| upper.starts_with(p)) {
        return Some("dynamic-linker variables (LD_*, DYLD_*) inject code into every process");
    }
    if DENIED_ENV.contains(&upper.as_str()) {
        return Some(
            "it runs code before the trainer (a shell's or an interpreter's start-up hook)",
        );
    }
    None
}

/// A name-like value (a task, a label, a metric): no control or escape
/// characters, which would reach logs and terminals as they are.
pub(super) fn plain(field: &str, value: &str) -> R {
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return err(
            field,
            format!("must not contain control characters (found {c:?})"),
        );
    }
    Ok(())
}

/// `value` with `%XX` escapes decoded, repeatedly (a double-encoded
/// `%252e` is a `.` to a server that decodes twice), at most four rounds.
pub(super) fn percent_decoded(value: &str) -> String {
    let mut s = value.to_string();
    for _ in 0..4 {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            if bytes[i] == b'%'
                && i + 2 < bytes.len()
                && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
            {
                out.push((h * 16 + l) as u8);
                i += 3;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        let next = String::from_utf8_lossy(&out).into_owned();
        if next == s {
            break;
        }
        s = next;
    }
    s
}

/// Whether `path`, decoded, has a `..` segment (on `/` or `\`).
pub(super) fn has_parent_segment(path: &str) -> bool {
    percent_decoded(path)
        .split(['/', '\\'])
        .any(|seg| seg == "..")
}

/// A label key: letters, digits, `.`, `_`, `-`, optionally one `prefix/`
/// (as Kubernetes label keys), no `..` and no empty part.
fn label_key(field: &str, key: &str) -> R {
    let ok_part = |p: &str| {
        !p.is_empty()
            && p != "."
            && p != ".."
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    let parts: Vec<&str> = key.split('/').collect();
    if parts.len() > 2 || !parts.iter().all(|p| ok_part(p)) || key.contains("..") {
        return err(
            field,
            format!(
                "{key:?} must be letters, digits, '.', '_' or '-', with at most one 'prefix/' (no '..')"
            ),
        );
    }
    Ok(())
}

impl JobSpec {
    /// The launch command and environment, and labels.
    pub(super) fn validate_launch(&self, l: &Limits) -> R {
        let la = &self.launch;
        if la.command.is_empty() {
            return err("launch.command", "must not be empty");
        }
        if la.command.len() > l.max_command_args {
            return err(
                "launch.command",
                format!("at most {} arguments", l.max_command_args),
            );
        }
        let program = &la.command[0];
        string("launch.command[0]", program, l.max_string_bytes, true)?;
        plain("launch.command[0]", program)?;
        if program.contains('/') && !program.starts_with('/') {
            return err(
                "launch.command[0]",
                format!(
                    "{program:?} is a relative path: give an absolute path, or a program name the \
                     node finds on its PATH"
                ),
            );
        }
        if has_parent_segment(program) {
            return err(
                "launch.command[0]",
                format!("{program:?} must not contain a `..` segment"),
            );
        }
        for (i, a) in la.command.iter().enumerate().skip(1) {
            string(
                &format!("launch.command[{i}]"),
                a,
                l.max_string_bytes,
                false,
            )?;
        }
        if la.env.len() > l.max_env_vars {
            return err(
                "launch.env",
                format!("has {} variables; at most {}", la.env.len(), l.max_env_vars),
            );
        }
        for (k, v) in &la.env {
            let field = format!("launch.env[{k:?}]");
            if !is_env_key(k) || k.len() > l.max_name_bytes {
                return err(&field, "key must match [A-Za-z_][A-Za-z0-9_]*");
            }
            if let Some(why) = denied_env(k) {
                return err(&field, format!("{k} may not be set by a job: {why}"));
            }
            string(&field, v, l.max_string_bytes, false)?;
        }
        if let Some(w) = &la.working_dir {
            let field = "launch.working_dir";
            string(field, w, l.max_string_bytes, false)?;
            plain(field, w)?;
            if w.starts_with('/') || w.starts_with('\\') {
                return err(
                    field,
                    format!("{w:?} must be relative: it is a directory inside the job's own"),
                );
            }
            if has_parent_segment(w) {
                return err(
                    field,
                    format!(
                        "{w:?} must not contain a `..` segment (it stays inside the job's directory)"
                    ),
                );
            }
        }
        self.validate_labels(l)
    }

    fn validate_labels(&self, l: &Limits) -> R {
        if self.labels.len() > l.max_labels {
            return err(
                "labels",
                format!(
                    "has {} entries; at most {}",
                    self.labels.len(),
                    l.max_labels
                ),
            );
        }
        for (k, v) in &self.labels {
            string("labels (key)", k, l.max_name_bytes, true)?;
            plain("labels (key)", k)?;
            label_key("labels (key)", k)?;
            let field = format!("labels[{k:?}]");
            string(&field, v, l.max_string_bytes, false)?;
            plain(&field, v)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::tests::{check, spec};

    fn field(s: &JobSpec) -> String {
        check(s).unwrap_err().field
    }

    /// The eight classes of launch and label input a tenant could abuse,
    /// each refused naming its field.
    #[test]
    fn unsafe_launch_and_label_input_is_refused_naming_the_field() {
        let mut s = spec();
        s.launch.env.insert("LD_PRELOAD".into(), "/tmp/x.so".into());
        assert_eq!(field(&s), "spec.launch.env[\"LD_PRELOAD\"]");
        let e = check(&s).unwrap_err();
        assert!(e.message.contains("dynamic-linker"), "{e}");
        for k in [
            "ld_library_path",
            "DYLD_INSERT_LIBRARIES",
            "PYTHONSTARTUP",
            "BASH_ENV",
        ] {
            let mut s = spec();
            s.launch.env.insert(k.into(), "x".into());
            assert!(field(&s).starts_with("spec.launch.env["), "{k}");
        }
        for k in [
            "FMSCHED_JOIN_TOKEN",
            "FMSCHED_CHECKPOINT_DIR",
            "FMSCHED_AGENT_NODE_ID",
        ] {
            let mut s = spec();
            s.launch.env.insert(k.into(), "x".into());
            assert!(check(&s).unwrap_err().message.contains("FMSCHED_"), "{k}");
        }
        // What trainers do set stays allowed.
        let mut s = spec();
        for k in [
            "PYTHONPATH",
            "OMP_NUM_THREADS",
            "HF_HUB_OFFLINE",
            "FMSCHED_FAKE_CRASH_AT",
        ] {
            s.launch.env.insert(k.into(), "1".into());
        }
        assert!(check(&s).is_ok());

        let mut s = spec();
        s.launch.command = vec!["bin/train".into()];
        assert_eq!(field(&s), "spec.launch.command[0]");
        s.launch.command = vec!["./train.sh".into()];
        assert_eq!(field(&s), "spec.launch.command[0]");
        s.launch.command = vec!["/opt/../bin/x".into()];
        assert_eq!(field(&s), "spec.launch.command[0]");
        s.launch.command = vec!["python3".into(), "-m".into(), "t".into()];
        assert!(check(&s).is_ok(), "a program name on PATH");

        for w in ["../other", "a/../../b", "/etc", "a/%2e%2e/b", "a\u{1b}[2J"] {
            let mut s = spec();
            s.launch.working_dir = Some(w.into());
            assert_eq!(field(&s), "spec.launch.working_dir", "{w:?}");
        }
        let mut s = spec();
        s.launch.working_dir = Some("src/run".into());
        assert!(check(&s).is_ok());

        let mut s = spec();
        s.dataset.task = "qqp\u{1b}[31m".into();
        assert_eq!(field(&s), "spec.dataset.task");
        let mut s = spec();
        s.labels.insert("team".into(), "a\nFAKE LOG LINE".into());
        assert_eq!(field(&s), "spec.labels[\"team\"]");
        for k in ["../x", "a/../b", "a/b/c", "", "a b"] {
            let mut s = spec();
            s.labels.insert(k.into(), "v".into());
            assert_eq!(field(&s), "spec.labels (key)", "{k:?}");
        }
        let mut s = spec();
        s.labels
            .insert("fmsched.io/team".into(), "ml-platform".into());
        assert!(check(&s).is_ok());

        for uri in [
            "s3://bucket/..%2f..%2fetc/passwd",
            "s3://bucket/%252e%252e/secrets",
            "s3://bucket/%2E%2E%5Cx",
            "/data/..%5c..%5cetc",
        ] {
            let mut s = spec();
            s.dataset.uri = uri.into();
            assert_eq!(field(&s), "spec.dataset.uri", "{uri}");
        }
    }

    #[test]
    fn percent_decoding_is_repeated_and_total() {
        assert_eq!(percent_decoded("%252e%252e"), "..");
        assert_eq!(percent_decoded("a%2Fb"), "a/b");
        assert_eq!(percent_decoded("100%"), "100%");
        assert_eq!(percent_decoded("%zz%4"), "%zz%4");
        assert_eq!(percent_decoded("%ff"), "\u{fffd}");
    }
}
