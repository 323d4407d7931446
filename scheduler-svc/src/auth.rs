//! Authentication: bearer tokens for users, a join token for agents.
//!
//! Tokens are secrets: they are read from the environment or from files, kept
//! in [`Secret`] (whose `Debug` prints nothing), compared in constant time,
//! and never logged.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use fmsched_core::UserName;
pub use fmsched_runtime::Secret;
use tonic::metadata::MetadataMap;

use crate::config::AuthConfig;

/// Constant-time comparison, so response timing does not leak a token prefix.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Who is calling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub user: UserName,
    pub admin: bool,
}

impl Principal {
    /// May this caller see or change a job owned by `owner`?
    pub fn may_access(&self, owner: &str) -> bool {
        self.admin || self.user.0 == owner
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("missing `authorization: Bearer <token>` metadata")]
    MissingToken,
    #[error("invalid bearer token")]
    InvalidToken,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthSetupError {
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{origin} line {line}: {message}")]
    Parse {
        origin: String,
        line: usize,
        message: String,
    },
    #[error(
        "no API tokens configured: set auth.tokens_file or FMSCHED_API_TOKENS (user=token,...); \
         a scheduler that accepts anyone is refused"
    )]
    NoTokens,
    #[error("no agent join token configured: set FMSCHED_JOIN_TOKEN or auth.join_token_file")]
    NoJoinToken,
    #[error("join token is shorter than 16 characters")]
    WeakJoinToken,
}

/// Token → principal map plus the agent join token.
#[derive(Clone)]
pub struct Authenticator {
    // Keyed by the token itself; lookups go through every entry with a
    // constant-time compare to avoid timing side channels on the map.
    tokens: Vec<(Secret, Principal)>,
    by_token: HashMap<String, usize>,
    join_token: Secret,
}

impl fmt::Debug for Authenticator {
    // Lists users only: the token map's keys are the secrets themselves.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let users: Vec<&str> = self.tokens.iter().map(|(_, p)| p.user.0.as_str()).collect();
        f.debug_struct("Authenticator")
            .field("users", &users)
            .finish_non_exhaustive()
    }
}

fn parse_tokens(
    origin: &str,
    text: &str,
    sep: char,
) -> Result<Vec<(String, Secret)>, AuthSetupError> {
    let mut out = Vec::new();
    let entries: Vec<&str> = if sep == '\n' {
        text.lines().collect()
    } else {
        text.split(sep).collect()
    };
    for (i, raw) in entries.iter().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (user, token) = if sep == '\n' {
            let mut it = line.split_whitespace();
            (it.next().unwrap_or(""), it.next().unwrap_or(""))
        } else {
            line.split_once('=').unwrap_or((line, ""))
        };
        let perr = |message: &str| AuthSetupError::Parse {
            origin: origin.to_string(),
            line: i + 1,
            message: message.to_string(),
        };
        if user.is_empty() || token.is_empty() {
            return Err(perr("expected a user and a token"));
        }
        if token.len() < 16 {
            return Err(perr("token is shorter than 16 characters"));
        }
        out.push((user.to_string(), Secret::new(token)));
    }
    Ok(out)
}

impl Authenticator {
    pub fn new(
        users: Vec<(String, Secret)>,
        admins: &[String],
        join_token: Secret,
    ) -> Result<Self, AuthSetupError> {
        if users.is_empty() {
            return Err(AuthSetupError::NoTokens);
        }
        if join_token.expose().len() < 16 {
            return Err(AuthSetupError::WeakJoinToken);
        }
        let tokens: Vec<(Secret, Principal)> = users
            .into_iter()
            .map(|(u, t)| {
                let admin = admins.contains(&u);
                (
                    t,
                    Principal {
                        user: UserName(u),
                        admin,
                    },
                )
            })
            .collect();
        let by_token = tokens
            .iter()
            .enumerate()
            .map(|(i, (t, _))| (t.expose().to_string(), i))
            .collect();
        Ok(Self {
            tokens,
            by_token,
            join_token,
        })
    }

    /// Builds from config plus the process environment.
    pub fn from_config(
        cfg: &AuthConfig,
        env: &HashMap<String, String>,
    ) -> Result<Self, AuthSetupError> {
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|source| AuthSetupError::Io {
                path: p.display().to_string(),
                source,
            })
        };
        let mut users = Vec::new();
        if let Some(p) = &cfg.tokens_file {
            users.extend(parse_tokens(&p.display().to_string(), &read(p)?, '\n')?);
        }
        if let Some(v) = env.get("FMSCHED_API_TOKENS") {
            users.extend(parse_tokens("FMSCHED_API_TOKENS", v, ',')?);
        }
        let join =
            fmsched_runtime::read_secret(env, "FMSCHED_JOIN_TOKEN", cfg.join_token_file.as_deref())
                .map_err(|source| AuthSetupError::Io {
                    path: format!("{:?}", cfg.join_token_file),
                    source,
                })?
                .ok_or(AuthSetupError::NoJoinToken)?;
        Self::new(users, &cfg.admins, join)
    }

    /// Authenticates a user call from its `authorization` metadata.
    pub fn authenticate(&self, md: &MetadataMap) -> Result<Principal, AuthError> {
        let value = md.get("authorization").ok_or(AuthError::MissingToken)?;
        let value = value.to_str().map_err(|_| AuthError::InvalidToken)?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or(AuthError::MissingToken)?
            .trim();
        // The map finds the candidate; the constant-time compare confirms it.
        let idx = self
            .by_token
            .get(token)
            .copied()
            .ok_or(AuthError::InvalidToken)?;
        let (secret, principal) = &self.tokens[idx];
        if constant_time_eq(secret.expose().as_bytes(), token.as_bytes()) {
            Ok(principal.clone())
        } else {
            Err(AuthError::InvalidToken)
        }
    }

    pub fn check_join_token(&self, presented: &str) -> bool {
        constant_time_eq(self.join_token.expose().as_bytes(), presented.as_bytes())
    }

    /// Who a registering agent is (kubelet-style bootstrap): a node token
    /// valid for `node` (`stored` is the SHA-256 on record for it) admits
    /// the node as itself; otherwise the join token enrolls a node that
    /// holds no credential (new, or revoked by an admin), with a new node
    /// token. The join token never re-issues the credential of a node that
    /// holds one: whoever has the join token (any host of the cluster)
    /// could otherwise take over a live node, revoking its real agent's
    /// token and receiving its plans. A node token presented for another
    /// node id never admits, whatever it is.
    pub fn authenticate_node(
        &self,
        node: &str,
        node_token: &str,
        join_token: &str,
        stored: Option<&str>,
    ) -> Result<NodeAuth, NodeAuthError> {
        if !node_token.is_empty()
            && stored.is_some_and(|h| {
                constant_time_eq(h.as_bytes(), token_sha256(node_token).as_bytes())
            })
        {
            return Ok(NodeAuth::NodeToken);
        }
        if self.check_join_token(join_token) {
            if stored.is_some() {
                return Err(NodeAuthError::CredentialHeld(node.to_string()));
            }
            let token = new_node_token();
            let sha256 = token_sha256(token.expose());
            return Ok(NodeAuth::Enroll { token, sha256 });
        }
        if node_token.is_empty() {
            Err(NodeAuthError::InvalidJoinToken)
        } else {
            Err(NodeAuthError::WrongNodeToken(node.to_string()))
        }
    }
}

/// How a registering agent proved who it is.
#[derive(Debug)]
pub enum NodeAuth {
    /// Its own node token.
    NodeToken,
    /// The join token: `token` is issued to it (Postgres keeps `sha256`).
    Enroll { token: Secret, sha256: String },
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NodeAuthError {
    #[error(
        "the node token is not valid for node {0}: a node token admits only the node it was issued to \
         (present the join token to enroll the node again)"
    )]
    WrongNodeToken(String),
    #[error("invalid join token")]
    InvalidJoinToken,
    #[error(
        "node {0} holds a node credential: register with its node token (the agent keeps it in \
         its node_token_file), or have an admin revoke it (`fmctl admin revoke-token {0}`) \
         before enrolling the node again with the join token"
    )]
    CredentialHeld(String),
}

/// A fresh node token: 244 random bits (two v4 UUIDs) behind a prefix that
/// tells it from user and join tokens in a leaked log.
pub fn new_node_token() -> Secret {
    Secret::new(format!(
        "fmn_{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    ))
}

/// Hex SHA-256 of a token: what Postgres keeps of a node token. A plain
/// hash suffices: node tokens are random, not passwords.
pub fn token_sha256(token: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataValue;

    fn auth() -> Authenticator {
        Authenticator::new(
            vec![
                ("alice".into(), Secret::new("alice-token-0123456789")),
                ("root".into(), Secret::new("root-token-0123456789")),
            ],
            &["root".to_string()],
            Secret::new("join-token-0123456789"),
        )
        .unwrap()
    }

    fn md(v: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert("authorization", MetadataValue::try_from(v).unwrap());
        m
    }

    #[test]
    fn a_node_token_admits_only_its_own_node_and_the_join_token_enrolls() {
        let a = auth();
        let join = "join-token-0123456789";
        let NodeAuth::Enroll { token, sha256 } = a.authenticate_node("n1", "", join, None).unwrap()
        else {
            panic!("the join token enrolls")
        };
        assert!(token.expose().starts_with("fmn_") && token.expose().len() == 68);
        assert_eq!(sha256, token_sha256(token.expose()));
        assert_ne!(
            sha256,
            token.expose(),
            "Postgres keeps the hash, not the token"
        );
        let t = token.expose();
        // Its own node: admitted as itself, with or without the join token.
        assert!(matches!(
            a.authenticate_node("n1", t, "", Some(&sha256)),
            Ok(NodeAuth::NodeToken)
        ));
        // Another node id (whose record holds another hash, or none).
        let other = token_sha256("fmn_other");
        assert_eq!(
            a.authenticate_node("n2", t, "", Some(&other)).unwrap_err(),
            NodeAuthError::WrongNodeToken("n2".into())
        );
        assert_eq!(
            a.authenticate_node("n2", t, "", None).unwrap_err(),
            NodeAuthError::WrongNodeToken("n2".into())
        );
        assert_eq!(
            a.authenticate_node("n1", "", "wrong-join-token-000", Some(&sha256))
                .unwrap_err(),
            NodeAuthError::InvalidJoinToken
        );
        // The join token does not re-issue a held credential: not beside a
        // stale token, nor alone (a take-over of a live node).
        for presented in ["fmn_stale", ""] {
            assert_eq!(
                a.authenticate_node("n1", presented, join, Some(&sha256))
                    .unwrap_err(),
                NodeAuthError::CredentialHeld("n1".into())
            );
        }
        // Revoked (no hash on record): the join token enrolls it again,
        // with a new token.
        let NodeAuth::Enroll { token: t2, .. } =
            a.authenticate_node("n1", "fmn_stale", join, None).unwrap()
        else {
            panic!("re-enrolled")
        };
        assert_ne!(t2.expose(), t);
    }

    #[test]
    fn bearer_tokens_map_to_users_and_roles() {
        let a = auth();
        let p = a
            .authenticate(&md("Bearer alice-token-0123456789"))
            .unwrap();
        assert_eq!(p.user.0, "alice");
        assert!(!p.admin);
        assert!(p.may_access("alice") && !p.may_access("bob"));
        let r = a.authenticate(&md("Bearer root-token-0123456789")).unwrap();
        assert!(r.admin && r.may_access("bob"));
        assert!(matches!(
            a.authenticate(&MetadataMap::new()),
            Err(AuthError::MissingToken)
        ));
        assert!(matches!(
            a.authenticate(&md("Bearer nope")),
            Err(AuthError::InvalidToken)
        ));
        assert!(matches!(
            a.authenticate(&md("Basic abc")),
            Err(AuthError::MissingToken)
        ));
        assert!(a.check_join_token("join-token-0123456789"));
        assert!(!a.check_join_token("join-token-012345678"));
    }

    #[test]
    fn secrets_do_not_print() {
        let s = format!("{:?}", auth());
        assert!(!s.contains("alice-token"), "{s}");
        assert!(!s.contains("join-token"), "{s}");
    }

    #[test]
    fn token_sources_parse_and_refuse_weak_setups() {
        let env: HashMap<String, String> = [
            (
                "FMSCHED_API_TOKENS".to_string(),
                "bob=bob-token-0123456789abc".to_string(),
            ),
            (
                "FMSCHED_JOIN_TOKEN".to_string(),
                "join-token-0123456789".to_string(),
            ),
        ]
        .into();
        let a = Authenticator::from_config(&AuthConfig::default(), &env).unwrap();
        assert_eq!(
            a.authenticate(&md("Bearer bob-token-0123456789abc"))
                .unwrap()
                .user
                .0,
            "bob"
        );

        let no_join: HashMap<String, String> = [(
            "FMSCHED_API_TOKENS".into(),
            "bob=bob-token-0123456789abc".into(),
        )]
        .into();
        assert!(matches!(
            Authenticator::from_config(&AuthConfig::default(), &no_join),
            Err(AuthSetupError::NoJoinToken)
        ));
        let weak: HashMap<String, String> = [
            ("FMSCHED_API_TOKENS".into(), "bob=short".into()),
            ("FMSCHED_JOIN_TOKEN".into(), "join-token-0123456789".into()),
        ]
        .into();
        assert!(
            Authenticator::from_config(&AuthConfig::default(), &weak)
                .unwrap_err()
                .to_string()
                .contains("line 1")
        );
        let none: HashMap<String, String> =
            [("FMSCHED_JOIN_TOKEN".into(), "join-token-0123456789".into())].into();
        assert!(matches!(
            Authenticator::from_config(&AuthConfig::default(), &none),
            Err(AuthSetupError::NoTokens)
        ));
    }
}
