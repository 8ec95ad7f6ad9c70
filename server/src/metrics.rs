//! Prometheus metrics: requests by method and status, bytes in and out, latency.

use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry, TextEncoder};

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    /// Requests by method and status code.
    pub requests: IntCounterVec,
    /// Response body bytes sent for object reads.
    pub bytes_out: IntCounter,
    /// Request body bytes accepted for uploads.
    pub bytes_in: IntCounter,
    /// Request latency by method.
    pub latency: HistogramVec,
    /// Chunk-map lookups: `hit`, or `miss` (which reads new pack footers).
    pub chunk_lookups: IntCounterVec,
    /// Pack range reads through the caching tier (`--cache`): `hit` (from its disk), `miss`
    /// (read from the store, checked and kept), `joined` (waited on another client's read of
    /// the same range), `passed` (not whole chunks, or unreadable: read through).
    pub tier_reads: IntCounterVec,
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let requests =
            IntCounterVec::new(Opts::new("gstore_http_requests_total", "HTTP requests"), &["method", "status"])
                .expect("metric");
        let bytes_out = IntCounter::new("gstore_http_bytes_out_total", "object bytes sent").expect("metric");
        let bytes_in = IntCounter::new("gstore_http_bytes_in_total", "upload bytes accepted").expect("metric");
        let latency = HistogramVec::new(
            HistogramOpts::new("gstore_http_request_seconds", "request latency")
                .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0]),
            &["method"],
        )
        .expect("metric");
        let chunk_lookups = IntCounterVec::new(
            Opts::new("gstore_chunk_map_lookups_total", "chunk map lookups (cache hits and misses)"),
            &["result"],
        )
        .expect("metric");
        let tier_reads = IntCounterVec::new(
            Opts::new("gstore_tier_reads_total", "pack range reads through the caching tier"),
            &["result"],
        )
        .expect("metric");
        for m in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(bytes_out.clone()),
            Box::new(bytes_in.clone()),
            Box::new(latency.clone()),
            Box::new(chunk_lookups.clone()),
            Box::new(tier_reads.clone()),
        ] {
            registry.register(m).expect("unique metric names");
        }
        Metrics { registry, requests, bytes_out, bytes_in, latency, chunk_lookups, tier_reads }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out).expect("text encoding");
        String::from_utf8(out).expect("utf-8 metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
