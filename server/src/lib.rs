//! gstore's HTTP chunk server: a stateless axum service in front of any store (local
//! directory or S3 bucket), so several can run behind a balancer over one bucket. Routes,
//! status codes and headers are in docs/HTTP.md.

mod answers;
pub mod auth;
pub mod chunks;
mod headers;
mod lookup;
pub mod metrics;
pub mod quota;
pub mod registry;
pub mod routes;
pub mod tier;
pub mod verify;

use auth::Tokens;
/// The bounds on the registry's uploads ([`Settings::uploads`]).
pub use gstore_registry::uploads::Limits as UploadLimits;
use gstore_store::backend::Backend;
use object_store::ObjectStore;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How to run the server.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Address to listen on.
    pub addr: SocketAddr,
    /// Tokens; empty means no authentication (loopback only unless `insecure`).
    pub tokens: Tokens,
    /// The file `tokens` came from: read again on SIGHUP (a file that does not read keeps
    /// the tokens in force, and says why).
    pub tokens_file: Option<std::path::PathBuf>,
    /// Allow a non-loopback address without tokens.
    pub insecure: bool,
    /// Largest request body (a pack upload) in bytes.
    pub max_body: usize,
    /// Requests taking longer are answered 408.
    pub timeout: Duration,
    /// A connection that has not sent a whole request head (request line and headers) this long
    /// after it opened or its last response is closed; so is a TLS handshake taking longer.
    pub header_timeout: Duration,
    /// Requests handled at once; more wait.
    pub max_concurrent: usize,
    /// TLS certificate chain and private key (PEM files); plain HTTP when `None`.
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// The store's `chunk_max` (its config's): uploaded or served packs listing a longer
    /// chunk are corrupt, and nothing longer is ever decoded.
    pub chunk_max: u32,
    /// Whether the store is encrypted: its objects are kept sealed as they come, and chunks
    /// cannot be found by id (the server has no key).
    pub sealed: bool,
    /// Where the store is, for the OCI registry under `/v2/` (it opens the store with its
    /// index on this machine); `None`, or an encrypted store, serves no registry.
    pub location: Option<gstore_store::StoreLocation>,
    /// The caching tier: a directory and the most bytes of pack ranges it keeps there
    /// ([`tier`]); `None` reads every range from the store.
    pub cache: Option<(std::path::PathBuf, u64)>,
    /// The most bytes the registry's uploads hold in the store, in all and per token.
    pub uploads: UploadLimits,
}

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The store: its protocol (compare-and-swap, listings, pack footers) goes through this.
    pub backend: Backend,
    /// The same store's objects, for streaming reads and plain writes.
    pub objects: Arc<dyn ObjectStore>,
    /// Configured tokens (reloaded on SIGHUP).
    pub tokens: Arc<auth::LiveTokens>,
    /// Prometheus metrics.
    pub metrics: Arc<metrics::Metrics>,
    /// Which pack holds each chunk.
    pub chunks: Arc<chunks::ChunkMap>,
    /// The store's `chunk_max`: the longest chunk a pack may list.
    pub chunk_max: u32,
    /// Whether the store is encrypted.
    pub sealed: bool,
    /// The OCI registry, where the server has one.
    pub registry: Option<Arc<gstore_registry::Registry>>,
    /// The caching tier, where the server has one.
    pub tier: Option<Arc<tier::Tier>>,
    /// What quota checks have read.
    pub quotas: Arc<quota::Quotas>,
}

/// Refuses an exposed address without authentication unless `insecure` is set.
pub fn check_exposure(s: &Settings) -> Result<(), String> {
    if s.tokens.is_empty() && !s.addr.ip().is_loopback() && !s.insecure {
        return Err(format!(
            "refusing to serve {} without authentication: give --tokens FILE, bind a loopback address, or pass --insecure",
            s.addr
        ));
    }
    Ok(())
}

/// The objects of a store that can be served: any but an HTTP one (serve the store behind it).
pub fn servable(backend: &Backend) -> Result<Arc<dyn ObjectStore>, String> {
    backend.object_store().ok_or_else(|| {
        format!("{} is a gstore server already: serve the store behind it instead", backend.description())
    })
}

/// Binds the address `s` listens on: done before anything says the server is serving, so that
/// a busy port is an error at once.
pub fn bind(s: &Settings) -> Result<std::net::TcpListener, String> {
    let listener = std::net::TcpListener::bind(s.addr).map_err(|e| format!("cannot listen on {}: {e}", s.addr))?;
    listener.set_nonblocking(true).map_err(|e| format!("listening on {}: {e}", s.addr))?;
    Ok(listener)
}

/// Serves `backend`'s store on `listener` ([`bind`]) until `shutdown` completes, then
/// finishes the requests in flight.
///
/// HTTP/1.1 only (the gstore client speaks it; TLS offers only `http/1.1` by ALPN), so that
/// every connection is under hyper's header-read timeout from its first byte: one that does not
/// send a whole request head within `header_timeout`, idle ones between requests included, is
/// closed. (HTTP/2, or the version sniffing that serving both needs, would wait on a silent
/// connection for ever.)
pub async fn serve(
    backend: Backend,
    s: Settings,
    listener: std::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    check_exposure(&s)?;
    if s.sealed && s.tokens.any_quota() {
        return Err("the token file sets quotas, but this store is encrypted: the server cannot read its manifests to count what a prefix holds".into());
    }
    let objects = servable(&backend)?;
    let registry = match (&s.location, s.sealed) {
        (Some(location), false) => {
            let r =
                gstore_registry::Registry::new(location.clone(), s.uploads).map_err(|e| format!("registry: {e}"))?;
            let r = Arc::new(r);
            tokio::spawn(registry::sweep_uploads(Arc::downgrade(&r)));
            Some(r)
        }
        _ => None,
    };
    let tier = match (&s.cache, s.sealed) {
        (None, _) => None,
        (Some(_), true) => {
            return Err(
                "--cache: the server of an encrypted store holds no key and cannot check the chunks it would keep"
                    .into(),
            )
        }
        (Some((dir, limit)), false) => tier::Tier::new(dir.clone(), *limit)?.map(Arc::new),
    };
    let state = AppState {
        backend,
        objects,
        tokens: Arc::new(auth::LiveTokens::new(s.tokens.clone())),
        metrics: Arc::new(metrics::Metrics::new()),
        chunks: Arc::new(chunks::ChunkMap::new(s.chunk_max)),
        chunk_max: s.chunk_max,
        sealed: s.sealed,
        registry,
        tier,
        quotas: Arc::new(quota::Quotas::default()),
    };
    reload_tokens_on_hangup(Arc::clone(&state.tokens), s.tokens_file.clone())?;
    let app = routes::router(state, &s).into_make_service();
    let handle = axum_server::Handle::new();
    let h = handle.clone();
    tokio::spawn(async move {
        shutdown.await;
        h.graceful_shutdown(None);
    });
    let server = axum_server::from_tcp(listener).map_err(|e| format!("listening on {}: {e}", s.addr))?;
    let served = match &s.tls {
        None => {
            let mut server = server.handle(handle).http1_only();
            limit_header_reads(&mut server, s.header_timeout);
            server.serve(app).await
        }
        Some((cert, key)) => {
            let config = axum_server::tls_rustls::RustlsConfig::from_pem_file(cert, key)
                .await
                .map_err(|e| format!("TLS certificate {} / key {}: {e}", cert.display(), key.display()))?;
            let mut only_http1 = (*config.get_inner()).clone();
            only_http1.alpn_protocols = vec![b"http/1.1".to_vec()];
            config.reload_from_config(Arc::new(only_http1));
            let acceptor = axum_server::tls_rustls::RustlsAcceptor::new(config).handshake_timeout(s.header_timeout);
            let mut server = server.acceptor(acceptor).handle(handle).http1_only();
            limit_header_reads(&mut server, s.header_timeout);
            server.serve(app).await
        }
    };
    served.map_err(|e| format!("serving {}: {e}", s.addr))
}

/// Installs the SIGHUP handler of a running server: with a token file, each SIGHUP reads it
/// again into `tokens` (a file that does not read keeps the tokens in force, and says why on
/// stderr); without one, a SIGHUP is said to change nothing. Either way SIGHUP no longer ends
/// the server.
fn reload_tokens_on_hangup(tokens: Arc<auth::LiveTokens>, file: Option<std::path::PathBuf>) -> Result<(), String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = signal(SignalKind::hangup()).map_err(|e| format!("handling SIGHUP: {e}"))?;
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match &file {
                None => eprintln!("gstore: SIGHUP: this server has no token file to read again (--tokens)"),
                Some(path) => match tokens.reload(path) {
                    Ok(n) => eprintln!("gstore: SIGHUP: serving the {n} token(s) of {}", path.display()),
                    Err(why) => eprintln!("gstore: SIGHUP: kept the tokens in force: {why}"),
                },
            }
        }
    });
    Ok(())
}

/// Closes connections that take longer than `timeout` to send a request head.
fn limit_header_reads<A>(server: &mut axum_server::Server<SocketAddr, A>, timeout: Duration) {
    server.http_builder().http1().timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(timeout);
}
