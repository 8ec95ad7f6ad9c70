//! Bearer tokens with scopes and tag namespaces, from a token file.
//!
//! Token file: one token a line, `TOKEN SCOPE [TAG_PREFIX]`, `#` comments. SCOPE is `read`,
//! `write` (implies read) or `admin` (implies write). A TAG_PREFIX limits which tags the token
//! may write. Tokens are compared in constant time. A token is sent as `Bearer TOKEN`, or as
//! the password of basic auth (what registry clients send: `podman login -p TOKEN`).

use std::path::Path;
use std::sync::{Arc, RwLock};
use subtle::ConstantTimeEq;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Read objects.
    Read,
    /// Also upload packs and manifests and move tags.
    Write,
    /// Also write the store's config.
    Admin,
}

/// One configured token.
#[derive(Debug, Clone)]
pub struct Token {
    secret: Vec<u8>,
    /// Its scope.
    pub scope: Scope,
    /// Tags it may write must start with this.
    pub tag_prefix: String,
    /// The most stored bytes the images under `tag_prefix` may hold (`quota=SIZE`), if
    /// bounded (docs/SECURITY.md, "Quotas").
    pub quota: Option<u64>,
}

/// Every configured token.
#[derive(Debug, Clone, Default)]
pub struct Tokens(Vec<Arc<Token>>);

/// The tokens a running server checks requests against: replaced whole when the token file
/// is read again (`serve` does on SIGHUP), never switched off.
#[derive(Debug, Default)]
pub struct LiveTokens(RwLock<Arc<Tokens>>);

impl LiveTokens {
    /// The tokens `tokens` to start with.
    pub fn new(tokens: Tokens) -> LiveTokens {
        LiveTokens(RwLock::new(Arc::new(tokens)))
    }

    /// The tokens now: a request checks against one set, whatever a reload does meanwhile.
    pub fn current(&self) -> Arc<Tokens> {
        Arc::clone(&self.0.read().expect("token lock"))
    }

    /// Reads the token file at `path` again and serves its tokens from now on; returns how
    /// many there are. A file that cannot be read or parsed (one that lists no token would
    /// turn authentication off: [`Tokens::parse`] refuses it) changes nothing: the error says
    /// why.
    pub fn reload(&self, path: &Path) -> Result<usize, String> {
        let tokens = Tokens::read(path)?;
        let n = tokens.0.len();
        *self.0.write().expect("token lock") = Arc::new(tokens);
        Ok(n)
    }
}

/// Why a request is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Denied {
    /// No or an unknown token (401).
    Unauthenticated,
    /// A known token without the scope or namespace (403).
    Forbidden(String),
}

impl Tokens {
    /// Reads and parses the token file at `path`; errors name it.
    pub fn read(path: &Path) -> Result<Tokens, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("reading token file {}: {e}", path.display()))?;
        Tokens::parse(&text).map_err(|e| format!("token file {}: {e}", path.display()))
    }

    /// Parses a token file.
    pub fn parse(text: &str) -> Result<Tokens, String> {
        let mut out = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let parts: Vec<&str> = line.split_whitespace().collect();
            let scope = match parts.get(1).copied() {
                Some("read") => Scope::Read,
                Some("write") => Scope::Write,
                Some("admin") => Scope::Admin,
                other => {
                    return Err(format!("token file line {}: scope must be read, write or admin, not {other:?}", n + 1))
                }
            };
            let (quota, rest): (Vec<&str>, Vec<&str>) = parts[2..].iter().partition(|p| p.starts_with("quota="));
            if parts[0].len() < 16 || rest.len() > 1 || quota.len() > 1 {
                return Err(format!(
                    "token file line {}: expected TOKEN SCOPE [TAG_PREFIX] [quota=SIZE] with a token of 16+ characters",
                    n + 1
                ));
            }
            let quota = match quota.first() {
                None => None,
                Some(q) if scope == Scope::Read => {
                    return Err(format!("token file line {}: {q} on a read token, which stores nothing", n + 1))
                }
                Some(q) => Some(
                    gstore_store::units::size(&q["quota=".len()..])
                        .map_err(|e| format!("token file line {}: quota: {e}", n + 1))?,
                ),
            };
            out.push(Arc::new(Token {
                secret: parts[0].as_bytes().to_vec(),
                scope,
                tag_prefix: rest.first().unwrap_or(&"").to_string(),
                quota,
            }));
        }
        if out.is_empty() {
            return Err("token file holds no tokens".into());
        }
        Ok(Tokens(out))
    }

    /// Whether any token has a quota.
    pub fn any_quota(&self) -> bool {
        self.0.iter().any(|t| t.quota.is_some())
    }

    /// True when no token is configured (the server runs without auth).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Checks that the request presenting `header` (an `Authorization` value) may do
    /// something needing `scope` (on tag `tag`, if any): the token it presents, or `None`
    /// when no token is configured (the server runs without auth).
    pub fn authorize(
        &self,
        header: Option<&str>,
        scope: Scope,
        tag: Option<&str>,
    ) -> Result<Option<Arc<Token>>, Denied> {
        if self.is_empty() {
            return Ok(None);
        }
        let token = self.authenticate(header)?;
        token.allow(scope, tag)?;
        Ok(Some(token))
    }

    /// Checks an `Authorization` header value (`Bearer TOKEN`, or `Basic` with the token as
    /// the password) against the tokens.
    pub fn authenticate(&self, header: Option<&str>) -> Result<Arc<Token>, Denied> {
        let presented = presented_token(header.ok_or(Denied::Unauthenticated)?).ok_or(Denied::Unauthenticated)?;
        let presented = presented.as_slice();
        // Every token is compared, whatever matches, so timing tells nothing.
        let mut found = None;
        for t in &self.0 {
            if bool::from(t.secret.ct_eq(presented)) {
                found = Some(t);
            }
        }
        found.cloned().ok_or(Denied::Unauthenticated)
    }
}

/// The token an `Authorization` header presents.
fn presented_token(header: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    if let Some(t) = header.strip_prefix("Bearer ") {
        return Some(t.as_bytes().to_vec());
    }
    let credentials = base64::engine::general_purpose::STANDARD.decode(header.strip_prefix("Basic ")?.trim()).ok()?;
    let colon = credentials.iter().position(|&b| b == b':')?;
    Some(credentials[colon + 1..].to_vec())
}

impl Token {
    /// The prefix of the names of the leases this token may write and delete
    /// ([`gstore_store::format::lease::owner_prefix`]).
    pub fn lease_prefix(&self) -> String {
        gstore_store::format::lease::owner_prefix(&self.secret)
    }

    /// Checks that this token may do something needing `scope` (on tag `tag`, if any).
    pub fn allow(&self, scope: Scope, tag: Option<&str>) -> Result<(), Denied> {
        if self.scope < scope {
            return Err(Denied::Forbidden(format!("this token has {:?} scope; {scope:?} is needed", self.scope)));
        }
        match tag {
            Some(t) if scope >= Scope::Write && !t.starts_with(&self.tag_prefix) => {
                Err(Denied::Forbidden(format!("this token may only write tags starting with {:?}", self.tag_prefix)))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_and_namespaces() {
        let t = Tokens::parse("# tokens\nreadreadreadread01 read\nwritewritewrite01 write team-a-\n").unwrap();
        let r = t.authenticate(Some("Bearer readreadreadread01")).unwrap();
        assert!(r.allow(Scope::Read, None).is_ok());
        assert!(matches!(r.allow(Scope::Write, Some("x")), Err(Denied::Forbidden(_))));
        let w = t.authenticate(Some("Bearer writewritewrite01")).unwrap();
        assert!(w.allow(Scope::Write, Some("team-a-model")).is_ok());
        assert!(matches!(w.allow(Scope::Write, Some("team-b-model")), Err(Denied::Forbidden(_))));
        assert!(matches!(w.allow(Scope::Admin, None), Err(Denied::Forbidden(_))));
        assert_eq!(t.authenticate(None).unwrap_err(), Denied::Unauthenticated);
        assert_eq!(t.authenticate(Some("Bearer nope")).unwrap_err(), Denied::Unauthenticated);
        assert_eq!(t.authenticate(Some("readreadreadread01")).unwrap_err(), Denied::Unauthenticated);
        // Basic auth: any user name, the token as the password.
        assert!(t.authenticate(Some("Basic cG9kbWFuOnJlYWRyZWFkcmVhZHJlYWQwMQ==")).is_ok()); // podman:readreadreadread01
        assert_eq!(t.authenticate(Some("Basic cG9kbWFuOm5vcGU=")).unwrap_err(), Denied::Unauthenticated); // podman:nope
        assert_eq!(t.authenticate(Some("Basic !!!")).unwrap_err(), Denied::Unauthenticated);
        assert!(Tokens::parse("short read").is_err());
        assert!(Tokens::parse("longenoughtoken01 root").is_err());
    }

    #[test]
    fn quotas_in_the_token_file() {
        let t =
            Tokens::parse("writewritewrite01 write team-a- quota=10M\nwritewritewrite02 write quota=1.5G\n").unwrap();
        let a = t.authenticate(Some("Bearer writewritewrite01")).unwrap();
        assert_eq!((a.tag_prefix.as_str(), a.quota), ("team-a-", Some(10 << 20)));
        let b = t.authenticate(Some("Bearer writewritewrite02")).unwrap();
        assert_eq!((b.tag_prefix.as_str(), b.quota), ("", Some(3 << 29)));
        assert!(t.any_quota());
        assert!(!Tokens::parse("writewritewrite01 write team-a-").unwrap().any_quota());
        assert!(Tokens::parse("writewritewrite01 write quota=lots").unwrap_err().contains("quota"));
        assert!(Tokens::parse("readreadreadread01 read quota=1G").unwrap_err().contains("read token"));
        assert!(Tokens::parse("writewritewrite01 write a- b-").is_err());
        assert!(Tokens::parse("writewritewrite01 write quota=1G quota=2G").is_err());
    }
}
