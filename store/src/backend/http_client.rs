//! The client side of gstore's HTTP chunk server (docs/HTTP.md): the same object operations
//! as the other backends, over HTTP, with a bearer token (`GSTORE_TOKEN`) and retries with
//! backoff on 5xx answers and lost connections.

use crate::error::{Result, StoreError};
use crate::ObjectKind;
use bytes::Bytes;
use reqwest::{header, Method, StatusCode};
use std::ops::Range;
use std::time::Duration;

/// Attempts per request (the first plus retries).
const ATTEMPTS: u32 = 4;

/// A client for one server.
pub struct HttpClient {
    base: String,
    token: Option<String>,
    client: reqwest::Client,
}

/// An answer: status, ETag, body.
pub struct Answer {
    /// HTTP status.
    pub status: StatusCode,
    /// The ETag header, if any.
    pub etag: Option<String>,
    /// The Content-Length header, if any (HEAD answers have no body).
    pub content_length: Option<u64>,
    /// The body.
    pub body: Bytes,
}

impl HttpClient {
    /// A client for the server at `base` (`http://host:port` or `https://…`), token from
    /// `GSTORE_TOKEN`; an extra trusted CA certificate (PEM) from `GSTORE_CA_CERT`. A request
    /// that receives nothing for `stall` is dropped and tried again.
    pub fn new(base: &str, stall: Duration) -> Result<HttpClient> {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .read_timeout(stall)
            .timeout(Duration::from_secs(3600));
        let env = crate::environment::Http::read();
        if let Some(path) = env.ca_cert {
            let pem = std::fs::read(&path)
                .map_err(|e| StoreError::io("reading GSTORE_CA_CERT", std::path::PathBuf::from(&path), e))?;
            let cert = reqwest::Certificate::from_pem(&pem)
                .map_err(|e| StoreError::Setting { name: "GSTORE_CA_CERT".into(), why: e.to_string() })?;
            builder = builder.add_root_certificate(cert);
        }
        let client = builder.build().map_err(|e| StoreError::Internal(format!("HTTP client: {e}")))?;
        let token = env.token;
        Ok(HttpClient { base: base.trim_end_matches('/').to_string(), token, client })
    }

    /// Sends one request, retrying 5xx answers, connection failures and answers cut off or
    /// stalled mid-body, with backoff; when every attempt failed so, the store is
    /// [`StoreError::Unavailable`].
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(header::HeaderName, String)],
        body: Option<Bytes>,
    ) -> Result<Answer> {
        let url = format!("{}{path}", self.base);
        let mut delay = Duration::from_millis(100);
        let mut last = String::new();
        let mut reached = false;
        for attempt in 1..=ATTEMPTS {
            let mut req = self.client.request(method.clone(), &url);
            if let Some(t) = &self.token {
                req = req.bearer_auth(t);
            }
            for (k, v) in headers {
                req = req.header(k, v);
            }
            if let Some(b) = &body {
                req = req.body(b.clone());
            }
            let sent = req.send().await;
            reached |= sent.as_ref().map_or_else(|e| !e.is_connect(), |_| true);
            match sent {
                Ok(resp) if !resp.status().is_server_error() => {
                    let status = resp.status();
                    let etag = resp.headers().get(header::ETAG).and_then(|v| v.to_str().ok()).map(str::to_string);
                    let content_length = resp
                        .headers()
                        .get(header::CONTENT_LENGTH)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse().ok());
                    match resp.bytes().await {
                        Ok(body) => return Ok(Answer { status, etag, content_length, body }),
                        Err(e) => last = format!("the answer was cut off: {}", describe(&e)),
                    }
                }
                Ok(resp) => last = format!("HTTP {}", resp.status()),
                Err(e) => last = describe(&e),
            }
            if attempt < ATTEMPTS {
                tokio::time::sleep(delay).await;
                delay *= 4;
            }
        }
        Err(StoreError::Unavailable {
            action: "requesting",
            key: format!("{}{path}", self.base),
            message: format!("{last} (after {ATTEMPTS} attempts)"),
            reached,
        })
    }

    fn err(&self, path: &str, message: String) -> StoreError {
        StoreError::Backend { action: "requesting", key: format!("{}{path}", self.base), message }
    }

    /// A request the server refused for what it asked or who asked (a usage error).
    fn refused(&self, path: &str, why: &str) -> StoreError {
        StoreError::Refused(format!("{}{path}: {why}", self.base))
    }

    /// Turns a non-success answer into the store's error.
    pub fn check(&self, key: &str, a: &Answer) -> Result<()> {
        let msg = || {
            serde_json::from_slice::<serde_json::Value>(&a.body)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or_else(|| String::from_utf8_lossy(&a.body).into_owned())
        };
        let path = Self::object_path(key);
        match a.status {
            s if s.is_success() => Ok(()),
            StatusCode::NOT_FOUND => Err(StoreError::NotFound { what: ObjectKind::Object, key: key.to_string() }),
            StatusCode::PRECONDITION_FAILED => Err(StoreError::lost_race(key)),
            // Refusals: the same request fails again (exit 2, docs/CLI.md), not a failure in
            // transit.
            StatusCode::UNAUTHORIZED => {
                Err(self.refused(&path, "access denied: missing or unknown token (set GSTORE_TOKEN)"))
            }
            StatusCode::FORBIDDEN => Err(self.refused(&path, &format!("access denied: {}", msg()))),
            StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE | StatusCode::UNPROCESSABLE_ENTITY => {
                Err(self.refused(&path, &format!("refused (HTTP {}): {}", a.status.as_u16(), msg())))
            }
            s => Err(self.err(&path, format!("HTTP {s}: {}", msg()))),
        }
    }

    /// Path of an object.
    pub fn object_path(key: &str) -> String {
        format!("/v1/o/{key}")
    }

    /// Range header value for `r`.
    pub fn range(r: &Range<u64>) -> String {
        format!("bytes={}-{}", r.start, r.end.saturating_sub(1))
    }
}

fn describe(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut cur: Option<&dyn std::error::Error> = std::error::Error::source(e);
    while let Some(c) = cur {
        s = format!("{s}: {c}");
        cur = c.source();
    }
    if e.is_connect() {
        format!("cannot reach the gstore server: {s}")
    } else {
        s
    }
}
