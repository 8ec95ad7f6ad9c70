//! gstore's HTTP chunk server: a stateless axum service in front of any store (local
//! directory or S3 bucket), so several can run behind a balancer over one bucket. Routes,
//! status codes and headers are in docs/HTTP.md.

pub mod auth;
pub mod chunks;
pub mod keys;
pub mod metrics;
pub mod routes;
pub mod verify;

use auth::Tokens;
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
    /// Allow a non-loopback address without tokens.
    pub insecure: bool,
    /// Largest request body (a pack upload) in bytes.
    pub max_body: usize,
    /// Requests taking longer are answered 408.
    pub timeout: Duration,
    /// Requests handled at once; more wait.
    pub max_concurrent: usize,
    /// TLS certificate chain and private key (PEM files); plain HTTP when `None`.
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// A local store's compare-and-swap lock file, shared with gstore processes writing the
    /// same directory (see `Backend::cas_lock_path`).
    pub cas_file: Option<std::path::PathBuf>,
}

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The store's objects.
    pub objects: Arc<dyn ObjectStore>,
    /// Configured tokens.
    pub tokens: Arc<Tokens>,
    /// Prometheus metrics.
    pub metrics: Arc<metrics::Metrics>,
    /// Which pack holds each chunk.
    pub chunks: Arc<chunks::ChunkMap>,
    /// Serializes compare-and-swap writes on stores without native If-Match (local directory).
    pub cas_lock: Arc<tokio::sync::Mutex<()>>,
    /// The local store's lock file, taken too so that other processes are excluded.
    pub cas_file: Option<std::path::PathBuf>,
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

/// Serves until `shutdown` completes, then finishes the requests in flight.
pub async fn serve(
    objects: Arc<dyn ObjectStore>,
    s: Settings,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    check_exposure(&s)?;
    let state = AppState {
        objects,
        tokens: Arc::new(s.tokens.clone()),
        metrics: Arc::new(metrics::Metrics::new()),
        cas_lock: Arc::default(),
        cas_file: s.cas_file.clone(),
        chunks: Arc::default(),
    };
    let app = routes::router(state, &s);
    match &s.tls {
        None => {
            let listener =
                tokio::net::TcpListener::bind(s.addr).await.map_err(|e| format!("binding {}: {e}", s.addr))?;
            axum::serve(listener, app).with_graceful_shutdown(shutdown).await.map_err(|e| e.to_string())
        }
        Some((cert, key)) => {
            let config = axum_server::tls_rustls::RustlsConfig::from_pem_file(cert, key)
                .await
                .map_err(|e| format!("TLS certificate {} / key {}: {e}", cert.display(), key.display()))?;
            let handle = axum_server::Handle::new();
            let h = handle.clone();
            tokio::spawn(async move {
                shutdown.await;
                h.graceful_shutdown(None);
            });
            axum_server::bind_rustls(s.addr, config)
                .handle(handle)
                .serve(app.into_make_service())
                .await
                .map_err(|e| format!("serving {}: {e}", s.addr))
        }
    }
}
