//! What keeps a trainer (a tenant's untrusted code) away from the agent:
//! the Unix user it runs as, the environment it is given (built, never
//! inherited), and the private folder it works in.
//!
//! As in Slurm's `slurmstepd`, the agent starts each process and then
//! drops to the configured user (`processes.run_as`) before it runs the
//! job's command; the agent's own files (its node token, 0600) stay out of
//! reach. An agent that would run trainers as its own user refuses to
//! start unless the operator allows it (`processes.allow_agent_user`, for a
//! single-user development machine).

use std::path::{Path, PathBuf};

/// The Unix identity trainers run as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
    /// Its groups (the user database's, with its primary group; `uid:gid`
    /// has that group alone): a trainer keeps `video` for the GPUs.
    pub groups: Vec<u32>,
    /// The user name, or `uid:gid` as given.
    pub name: String,
}

impl RunAs {
    /// `spec`: a user name (looked up in the host's user database, with
    /// its primary group) or `uid:gid`.
    pub fn resolve(spec: &str) -> Result<Self, String> {
        if let Some((u, g)) = spec.split_once(':') {
            let uid = u.parse().map_err(|_| format!("{u:?} is not a uid"))?;
            let gid = g.parse().map_err(|_| format!("{g:?} is not a gid"))?;
            return Ok(Self {
                uid,
                gid,
                groups: vec![gid],
                name: spec.to_string(),
            });
        }
        let (uid, gid) =
            lookup_user(spec).ok_or_else(|| format!("no user {spec:?} on this host"))?;
        Ok(Self {
            uid,
            gid,
            groups: group_list(spec, gid),
            name: spec.to_string(),
        })
    }

    /// Becomes this user: groups, then group, then user. Runs in the
    /// forked child before exec, so it makes system calls only (no
    /// allocation: `groups` was resolved before the fork).
    pub fn become_user(&self) -> std::io::Result<()> {
        // SAFETY: plain system calls on values owned by `self`; `groups`
        // outlives the setgroups call.
        let ok = unsafe {
            libc::setgroups(self.groups.len() as _, self.groups.as_ptr()) == 0
                && libc::setgid(self.gid) == 0
                && libc::setuid(self.uid) == 0
        };
        if ok {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Whether this is root.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }
}

/// A user's uid and primary gid (`getpwnam_r`).
fn lookup_user(name: &str) -> Option<(u32, u32)> {
    let cname = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: `pwd` is written by getpwnam_r, which points its strings
    // into `buf`; both outlive the call, and only the numeric ids are read.
    unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwnam_r(
            cname.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut out,
        );
        (rc == 0 && !out.is_null()).then_some((pwd.pw_uid, pwd.pw_gid))
    }
}

/// A user's groups (`getgrouplist`), its primary group first.
fn group_list(name: &str, gid: u32) -> Vec<u32> {
    let Ok(cname) = std::ffi::CString::new(name) else {
        return vec![gid];
    };
    let mut n: libc::c_int = 64;
    let mut groups = vec![0 as libc::gid_t; n as usize];
    // SAFETY: `groups` has room for `n` entries, which getgrouplist
    // updates to the count it wrote (or needs); retried once with room.
    for _ in 0..2 {
        let rc = unsafe { libc::getgrouplist(cname.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(n.max(0) as usize);
            return groups;
        }
        groups.resize(n.max(1) as usize, 0);
    }
    vec![gid]
}

/// The agent's own effective uid.
pub fn agent_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Who trainers run as, from `processes.run_as` and
/// `processes.allow_agent_user`; an error names the key to set.
pub fn trainer_identity(
    run_as: Option<&str>,
    allow_agent_user: bool,
) -> Result<Option<RunAs>, String> {
    let me = agent_uid();
    let Some(spec) = run_as.filter(|s| !s.trim().is_empty()) else {
        if allow_agent_user {
            return Ok(None);
        }
        return Err(format!(
            "trainers would run as the agent's own user (uid {me}{}), which can read the agent's node \
             token and every job's files: set processes.run_as to an unprivileged user for them, or \
             processes.allow_agent_user = true on a single-user development machine",
            if me == 0 { ", root" } else { "" }
        ));
    };
    let who = RunAs::resolve(spec.trim())?;
    if who.is_root() && !allow_agent_user {
        return Err(format!(
            "processes.run_as {:?} is root: trainers run unprivileged (processes.allow_agent_user \
             = true allows it on a development machine)",
            who.name
        ));
    }
    if who.uid != me && me != 0 {
        return Err(format!(
            "processes.run_as {:?} (uid {}) needs the agent to run as root to switch to it (it runs \
             as uid {me})",
            who.name, who.uid
        ));
    }
    if who.uid == me && !allow_agent_user {
        return Err(format!(
            "processes.run_as {:?} is the agent's own user: give trainers a user of their own",
            who.name
        ));
    }
    Ok(Some(who))
}

/// Variables of the agent's environment every trainer gets: where programs
/// are, and the locale. Everything else of the agent's (its join token,
/// cloud credentials) stays out unless the operator passes it on
/// (`processes.pass_env`).
pub const BASE_PASS_ENV: &[&str] = &[
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "LC_NUMERIC",
    "LC_TIME",
    "TZ",
];

/// The variables of `agent_env` a trainer gets: [`BASE_PASS_ENV`] and the
/// operator's `pass_env` (a trailing `*` is a prefix), never one a job may
/// not set itself (`fmsched_core::validate::denied_env`).
pub fn passed_env(
    agent_env: impl IntoIterator<Item = (String, String)>,
    pass_env: &[String],
) -> Vec<(String, String)> {
    let passes = |k: &str| {
        BASE_PASS_ENV.contains(&k)
            || pass_env.iter().any(|p| match p.strip_suffix('*') {
                Some(prefix) => k.starts_with(prefix),
                None => p == k,
            })
    };
    agent_env
        .into_iter()
        .filter(|(k, _)| passes(k) && fmsched_core::validate::denied_env(k).is_none())
        .collect()
}

/// Creates `dir` (and its parents) as a folder of `owner` alone (mode
/// 0700): a task's folder holds its checkpoints, outputs, logs, control
/// file and report socket, which no other user of the node may read.
pub fn private_dir(dir: &Path, owner: Option<&RunAs>) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    give_to(dir, owner)
}

/// Hands `path` to `owner` (no-op without one).
pub fn give_to(path: &Path, owner: Option<&RunAs>) -> std::io::Result<()> {
    match owner {
        Some(o) => std::os::unix::fs::chown(path, Some(o.uid), Some(o.gid)),
        None => Ok(()),
    }
}

/// The working directory of a task in `dir`: `rel` inside it, or `dir`
/// itself for an empty `rel`; None for a path that would leave it (an
/// absolute path or a `..`, which validation refuses at submit too).
pub fn working_dir_in(dir: &Path, rel: &str) -> Option<PathBuf> {
    let rel = Path::new(rel);
    let inside = rel.components().all(|c| {
        matches!(
            c,
            std::path::Component::Normal(_) | std::path::Component::CurDir
        )
    });
    inside.then(|| dir.join(rel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trainer_gets_the_base_variables_and_what_the_operator_passes_only() {
        let agent: Vec<(String, String)> = [
            ("PATH", "/usr/bin"),
            ("LANG", "C.UTF-8"),
            ("FMSCHED_JOIN_TOKEN", "secret-join-token"),
            ("FMSCHED_AGENT_NODE_ID", "n1"),
            ("AWS_SECRET_ACCESS_KEY", "x"),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_IB_HCA", "mlx5"),
            ("HF_HOME", "/cache/hf"),
            ("LD_PRELOAD", "/x.so"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let names = |pass: &[&str]| {
            let pass: Vec<String> = pass.iter().map(|s| s.to_string()).collect();
            passed_env(agent.clone(), &pass)
                .into_iter()
                .map(|(k, _)| k)
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&[]), ["PATH", "LANG"]);
        assert_eq!(
            names(&["NCCL_*", "HF_HOME", "LD_PRELOAD", "FMSCHED_*"]),
            ["PATH", "LANG", "NCCL_DEBUG", "NCCL_IB_HCA", "HF_HOME"],
            "never a denied name, even when the operator lists it"
        );
    }

    #[test]
    fn the_working_dir_stays_inside_the_task_folder() {
        let d = Path::new("/w/job");
        assert_eq!(working_dir_in(d, ""), Some(d.to_path_buf()));
        assert_eq!(working_dir_in(d, "src/run"), Some(d.join("src/run")));
        assert_eq!(working_dir_in(d, "../other"), None);
        assert_eq!(working_dir_in(d, "/etc"), None);
        assert_eq!(working_dir_in(d, "a/../../b"), None);
    }

    #[test]
    fn trainers_never_run_as_the_agent_unless_allowed() {
        let me = agent_uid();
        let e = trainer_identity(None, false).unwrap_err();
        assert!(e.contains("processes.run_as"), "{e}");
        assert_eq!(trainer_identity(None, true), Ok(None));
        let mine = format!("{me}:{me}");
        assert!(trainer_identity(Some(&mine), false).is_err());
        assert!(trainer_identity(Some("0:0"), false).is_err());
        assert!(trainer_identity(Some("no-such-user-fmsched"), false).is_err());
        assert!(RunAs::resolve("x:1").is_err());
        if me == 0 {
            let nobody = trainer_identity(Some("65534:65534"), false)
                .unwrap()
                .unwrap();
            assert_eq!((nobody.uid, nobody.gid), (65534, 65534));
            assert_eq!(
                RunAs::resolve("root").map(|r| (r.uid, r.gid)),
                Ok((0, 0)),
                "names are looked up"
            );
        }
    }
}
