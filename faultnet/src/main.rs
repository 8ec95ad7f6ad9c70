//! `gstore-faultnet`: the fault proxy as a command, for benches and soaks driven by scripts.
//! Prints `listening on 127.0.0.1:PORT` once it accepts connections; on SIGINT or SIGTERM
//! prints its [`gstore_faultnet::Stats`] as one JSON line and exits.

use clap::Parser;
use gstore_faultnet::{Chaos, Link, Proxy};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// A TCP proxy that adds delay, jitter, a rate limit, loss and faults between clients and
/// one server.
#[derive(Parser)]
#[command(name = "gstore-faultnet", version)]
struct Args {
    /// Address to listen on (port 0: a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The server, HOST:PORT.
    #[arg(long)]
    to: String,
    /// Round-trip time added (e.g. 10ms).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    rtt: Duration,
    /// Jitter added to each segment, uniform in 0..JITTER.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    jitter: Duration,
    /// Rate each way, shared by all connections, in bits per second (e.g. 1g, 400m); 0: none.
    #[arg(long, default_value = "0", value_parser = parse_bits)]
    rate: u64,
    /// Bytes one connection may have in flight each way (its TCP window).
    #[arg(long, default_value_t = 6 << 20)]
    window: usize,
    /// Packet loss probability (0..1).
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Random connection resets per GiB moved.
    #[arg(long, default_value_t = 0.0)]
    resets_per_gib: f64,
    /// Random stalls per GiB moved.
    #[arg(long, default_value_t = 0.0)]
    stalls_per_gib: f64,
    /// How long a random stall lasts.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    stall: Duration,
    /// Seed of the random faults.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Bits per second with an optional k/m/g suffix, as bytes per second.
fn parse_bits(s: &str) -> Result<u64, String> {
    let s = s.trim().to_ascii_lowercase();
    let (num, scale) = match s.strip_suffix(['k', 'm', 'g']) {
        Some(n) => (
            n,
            match s.chars().last() {
                Some('k') => 1e3,
                Some('m') => 1e6,
                _ => 1e9,
            },
        ),
        None => (s.as_str(), 1.0),
    };
    let bits: f64 = num.trim_end_matches("bit").parse().map_err(|_| format!("not a rate: {s}"))?;
    Ok((bits * scale / 8.0) as u64)
}

fn main() {
    let a = Args::parse();
    let upstream = match a.to.to_socket_addrs().ok().and_then(|mut it| it.next()) {
        Some(addr) => addr,
        None => {
            eprintln!("gstore-faultnet: cannot resolve --to {}", a.to);
            std::process::exit(2);
        }
    };
    let link =
        Link { rtt: a.rtt, jitter: a.jitter, rate: (a.rate > 0).then_some(a.rate), window: a.window, loss: a.loss };
    let proxy = match Proxy::start_on(a.listen, upstream, link) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("gstore-faultnet: listening on {}: {e}", a.listen);
            std::process::exit(1);
        }
    };
    if a.resets_per_gib > 0.0 || a.stalls_per_gib > 0.0 {
        proxy.set_chaos(Some(Chaos {
            resets_per_gib: a.resets_per_gib,
            stalls_per_gib: a.stalls_per_gib,
            stall: a.stall,
            seed: a.seed,
        }));
    }
    println!("listening on {}", proxy.addr());
    let signals = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    signals.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    });
    println!("{}", serde_json::to_string(&proxy.stats()).expect("stats serialize"));
}
