//! HTTP requests the registry and server tests make through curl (every header in the test's
//! hands, a body sent at a limited rate so that it can be cut short), and the small documents
//! they send: SHA-256 digests and plain tar archives.

use std::fs;
use std::process::{Child, Command};

/// A plain (ustar) tar of regular files, in order.
pub fn ustar(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in entries {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        for (at, field) in [(100, "0000644"), (108, "0000000"), (116, "0000000"), (136, "00000000000")] {
            h[at..at + field.len()].copy_from_slice(field.as_bytes());
        }
        h[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
        h[148..156].copy_from_slice(b"        ");
        h[156] = b'0';
        h[257..265].copy_from_slice(b"ustar\x0000");
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

/// The OCI digest of `bytes`: `sha256:HEX`.
pub fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// What an HTTP request sends ([`http`]).
#[derive(Default)]
pub struct Req<'a> {
    /// Sent as the password of basic auth, as registry clients send a gstore token.
    pub token: Option<&'a str>,
    /// Extra headers, `Name: value`.
    pub headers: &'a [&'a str],
    /// The body.
    pub body: Option<&'a [u8]>,
    /// Sent with `Transfer-Encoding: chunked` rather than a `Content-Length`.
    pub chunked: bool,
    /// More curl arguments (`--limit-rate 8M`).
    pub extra: &'a [&'a str],
}

/// What came back: the status, the headers (lowercased) and the body.
pub struct Answer {
    /// The status (0 when the connection failed).
    pub status: u16,
    /// The headers, lowercased.
    pub headers: String,
    /// The body.
    pub body: Vec<u8>,
}

impl Answer {
    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_string()
    }

    /// The value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> String {
        let line = self.headers.lines().find_map(|l| l.strip_prefix(&format!("{name}: ")));
        line.unwrap_or_else(|| panic!("no {name} in {}", self.headers)).trim().to_string()
    }

    /// Asserts the status and, for an error, the distribution API's error code.
    pub fn expect(&self, status: u16, code: Option<&str>) -> &Answer {
        assert_eq!(self.status, status, "{}", self.text());
        if let Some(c) = code {
            assert!(self.text().contains(&format!("\"code\":\"{c}\"")), "not {c}: {}", self.text());
        }
        self
    }
}

/// An HTTP request running in the background ([`http_start`]).
pub struct Pending {
    child: Child,
    dir: tempfile::TempDir,
}

impl Pending {
    /// Waits for the answer.
    pub fn wait(self) -> Answer {
        let Pending { child, dir } = self;
        let out = child.wait_with_output().expect("curl runs");
        Answer {
            status: String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0),
            headers: fs::read_to_string(dir.path().join("h")).unwrap_or_default().to_lowercase(),
            body: fs::read(dir.path().join("b")).unwrap_or_default(),
        }
    }
}

/// `METHOD URL` with curl, started in the background.
pub fn http_start(method: &str, url: &str, r: Req) -> Pending {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Command::new("curl");
    c.args(["-s", "-D"]).arg(dir.path().join("h")).arg("-o").arg(dir.path().join("b")).args(["-w", "%{http_code}"]);
    if method == "HEAD" {
        c.arg("-I");
    } else {
        c.args(["-X", method]);
    }
    if let Some(t) = r.token {
        c.args(["-u", &format!("podman:{t}")]);
    }
    for h in r.headers {
        c.args(["-H", h]);
    }
    if let Some(b) = r.body {
        let file = dir.path().join("data");
        fs::write(&file, b).unwrap();
        c.arg("--data-binary").arg(format!("@{}", file.display()));
        if r.chunked {
            c.args(["-H", "Transfer-Encoding: chunked"]);
        }
    }
    let child = c.args(r.extra).arg(url).stdout(std::process::Stdio::piped()).spawn().expect("curl runs");
    Pending { child, dir }
}

/// `METHOD URL` with curl.
pub fn http(method: &str, url: &str, r: Req) -> Answer {
    http_start(method, url, r).wait()
}
