//! `gstore serve`: the store over HTTP (docs/HTTP.md), until Ctrl-C or SIGTERM.

use crate::args::ServeArgs;
use crate::failure::Usage;
use crate::output::Output;
use anyhow::Result;
use gstore_store::{Store, StoreLocation};
use std::time::Duration;

/// `gstore serve`: until Ctrl-C or SIGTERM.
pub(crate) fn serve(location: &StoreLocation, a: ServeArgs, out: &Output) -> Result<()> {
    let ServeArgs {
        listen,
        tokens,
        insecure,
        max_body,
        timeout,
        header_timeout,
        max_concurrent,
        tls_cert,
        tls_key,
        cache,
        cache_bytes,
        upload_bytes,
        upload_bytes_per_token,
    } = a;
    if let Some(own) = gstore_store::backend::tiers_from_env()?.iter().find(|u| names_listener(u, listen)) {
        return Err(
            Usage(format!("GSTORE_TIERS names this server itself ({own}): its reads would come back to it")).into()
        );
    }
    // A server needs no key: it keeps an encrypted store's objects as they come, sealed.
    let backend = location.backend()?;
    let config = Store::read_config(&backend, location)?;
    let tokens_file = tokens;
    let tokens = match &tokens_file {
        Some(p) => gstore_server::auth::Tokens::read(p).map_err(Usage)?,
        None => gstore_server::auth::Tokens::default(),
    };
    let tls = tls_cert.zip(tls_key);
    let scheme = if tls.is_some() { "https" } else { "http" };
    let settings = gstore_server::Settings {
        addr: listen,
        tokens,
        tokens_file,
        insecure,
        max_body,
        timeout: Duration::from_secs(timeout),
        header_timeout: Duration::from_secs(header_timeout),
        max_concurrent,
        tls,
        chunk_max: config.chunk_max,
        sealed: config.encryption.is_some(),
        location: Some(location.clone()),
        cache: cache.map(|dir| (dir, cache_bytes)),
        uploads: gstore_server::UploadLimits { total: upload_bytes, per_owner: upload_bytes_per_token },
    };
    gstore_server::check_exposure(&settings).map_err(anyhow::Error::msg)?;
    gstore_server::servable(&backend).map_err(anyhow::Error::msg)?;
    let listener = gstore_server::bind(&settings).map_err(anyhow::Error::msg)?;
    // The address bound, not the one asked for: `--listen 127.0.0.1:0` gets a free port.
    let bound = listener.local_addr()?;
    let url = format!("{scheme}://{bound}");
    eprintln!("gstore: serving {} on {url}", backend.description());
    if out.json {
        out.emit_line(&serde_json::json!({ "ready": true, "url": url, "listen": bound.to_string() }))?;
    }
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(gstore_server::serve(backend, settings, listener, shutdown_signal())).map_err(anyhow::Error::msg)
}

/// Whether tier URL `url` names the address `listen`: the same port, on its IP, on loopback
/// (when it listens on loopback or every address), or on `localhost`.
fn names_listener(url: &str, listen: std::net::SocketAddr) -> bool {
    let host_port = url.split("://").nth(1).unwrap_or(url).split('/').next().unwrap_or("");
    let Some((host, port)) = host_port.rsplit_once(':') else { return false };
    let local = listen.ip().is_loopback() || listen.ip().is_unspecified();
    port.parse() == Ok(listen.port())
        && (host.trim_matches(['[', ']']) == listen.ip().to_string()
            || (local && (host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback()))))
}

/// Completes on Ctrl-C or SIGTERM; the server then finishes the requests in flight.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("gstore: shutting down after the requests in flight");
}
