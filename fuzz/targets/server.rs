//! The chunk server's routes (paths, query strings, Range and conditional headers, tokens,
//! uploads) on a real local store holding one image. Input: a method byte, then the request
//! target up to the first newline, then `Name: value` header lines up to an empty line, then
//! the body. The server must answer every request, never 5xx for a request it could parse
//! but did not like, and never panic.
use axum::body::Body;
use axum::http::Request;
use gstore_server::{auth::Tokens, chunks::ChunkMap, metrics::Metrics, routes, AppState, Settings};
use gstore_store::backend::Backend;
use gstore_store::progress::Silent;
use gstore_store::{Store, StoreConfig, StoreLocation, TagRef};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tower::ServiceExt;

struct Fixture {
    runtime: tokio::runtime::Runtime,
    router: axum::Router,
    _dir: tempfile::TempDir,
}

/// A store with one small pushed image, served with two tokens (`reader`, `writer` limited to
/// tags starting with `ci/`) and a caching tier.
fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let location = StoreLocation::Local(root.clone());
        Store::init(&location, &StoreConfig::default()).unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("a.bin"), (0..300_000u32).map(|i| (i * 31 / 7) as u8).collect::<Vec<u8>>()).unwrap();
        let store = Store::open_indexed(&location, &|_| ()).unwrap();
        gstore_store::commands::push::push(
            &store,
            &src,
            &TagRef::parse("app:v1").unwrap(),
            Default::default(),
            &Silent,
        )
        .unwrap();
        let backend = Backend::local(&root).unwrap();
        let objects = gstore_server::servable(&backend).unwrap();
        let settings = Settings {
            addr: "127.0.0.1:0".parse().unwrap(),
            tokens: Tokens::parse("reader-token-0123456789 read\nwriter-token-0123456789 write ci/\n").unwrap(),
            tokens_file: None,
            insecure: false,
            max_body: 4 << 20,
            timeout: Duration::from_secs(5),
            header_timeout: Duration::from_secs(5),
            max_concurrent: 4,
            tls: None,
            chunk_max: StoreConfig::default().chunk_max,
            sealed: false,
            location: None,
            cache: None,
            uploads: gstore_server::UploadLimits { total: 1 << 30, per_owner: 1 << 28 },
        };
        let state = AppState {
            backend,
            objects,
            tokens: Arc::new(gstore_server::auth::LiveTokens::new(settings.tokens.clone())),
            metrics: Arc::new(Metrics::new()),
            chunks: Arc::new(ChunkMap::new(settings.chunk_max)),
            chunk_max: settings.chunk_max,
            sealed: settings.sealed,
            registry: None,
            // Range reads of packs go through the caching tier, as with `serve --cache`.
            tier: gstore_server::tier::Tier::new(dir.path().join("tier"), 64 << 20).unwrap().map(Arc::new),
            quotas: Arc::default(),
        };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let router = runtime.block_on(async { routes::router(state, &settings) });
        Fixture { runtime, router, _dir: dir }
    })
}

/// Runs one input; panics on a bug.
pub fn run(data: &[u8]) {
    let Some((&m, rest)) = data.split_first() else { return };
    let method = ["GET", "HEAD", "PUT", "DELETE", "POST", "OPTIONS"][m as usize % 6];
    let text_end = rest.windows(2).position(|w| w == b"\n\n").unwrap_or(rest.len());
    let (head, body) = rest.split_at(text_end);
    let body = body.get(2..).unwrap_or_default().to_vec();
    let head = String::from_utf8_lossy(head);
    let mut lines = head.split('\n');
    let target = lines.next().unwrap_or("/");
    let mut req = Request::builder().method(method).uri(target);
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            req = req.header(name.trim(), value.trim());
        }
    }
    let Ok(req) = req.body(Body::from(body)) else { return };
    let f = fixture();
    let answer = f.runtime.block_on(f.router.clone().oneshot(req)).expect("the router answers");
    assert!(answer.status() != axum::http::StatusCode::INTERNAL_SERVER_ERROR, "500 for {method} {target}");
}
