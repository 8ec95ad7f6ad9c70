//! A fault-injecting TCP proxy, the network of gstore's remote tests and benches.
//!
//! [`Proxy`] listens on a loopback port and forwards every connection to one upstream server
//! (an S3 server, `gstore serve`). Each direction of each connection passes through a delay
//! line ([`Link`]): half the round-trip time each way, jitter, a rate shared by all
//! connections, a per-connection window (what a TCP window allows in flight, so one connection
//! moves at most `window / rtt`), and packet loss, modelled as the retransmission it causes.
//! Faults come on top: one-shot [`Fault`]s armed by a test (reset or stall a connection after
//! so many bytes, answer the next connections `503 Slow Down`), random ones at a given rate
//! ([`Chaos`]), and [`Proxy::reset_all`]. [`Stats`] counts what moved and what was injected.
//!
//! The kernel here has no `netem` qdisc, so delay and loss are done in user space; the cost
//! is a copy through the proxy, about a tenth of a core at 1 Gbit/s.

mod line;

use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Bytes a packet carries (Ethernet MTU less IP and TCP headers), for the loss model.
pub const PACKET: usize = 1448;

/// What the link between client and server is like. Both directions get the same.
#[derive(Debug, Clone)]
pub struct Link {
    /// Round-trip time added: half of it on each direction.
    pub rtt: Duration,
    /// Extra delay of each segment, uniform in `0..jitter`; bytes still arrive in order.
    pub jitter: Duration,
    /// Bytes per second each way, shared by every connection; `None`: unlimited.
    pub rate: Option<u64>,
    /// Bytes one connection may have in its delay line each way (its TCP window): one
    /// connection moves at most `window / rtt`.
    pub window: usize,
    /// Probability that a packet ([`PACKET`] bytes) is lost; a segment that lost one arrives a
    /// round trip later, as after a fast retransmit (the congestion window is not modelled).
    pub loss: f64,
}

impl Default for Link {
    /// No delay, no limit, a 6 MiB window (Linux's default largest receive window).
    fn default() -> Link {
        Link { rtt: Duration::ZERO, jitter: Duration::ZERO, rate: None, window: 6 << 20, loss: 0.0 }
    }
}

/// A direction of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Client to server: requests and uploads.
    Up,
    /// Server to client: answers and downloads.
    Down,
}

/// A one-shot fault. Every connection moving bytes in its direction once it is armed places it
/// `after` bytes ahead; the first to get there fires it, and it is then gone for the others.
/// (A connection that took it alone would keep it from firing by idling in a keep-alive pool.)
#[derive(Debug, Clone)]
pub enum Fault {
    /// Resets the connection (RST to both ends) once `after` more bytes have passed.
    Reset {
        /// Direction counted.
        dir: Dir,
        /// Bytes delivered before the reset.
        after: u64,
    },
    /// Delivers nothing for `duration` once `after` more bytes have passed.
    Stall {
        /// Direction stalled.
        dir: Dir,
        /// Bytes delivered before the stall.
        after: u64,
        /// How long nothing moves.
        duration: Duration,
    },
    /// The next `connections` new connections are answered `503 Slow Down` after their first
    /// request head, then closed (a burst of server errors).
    Unavailable {
        /// Connections answered so.
        connections: u32,
    },
}

/// Random faults, at a rate per GiB moved in either direction.
#[derive(Debug, Clone)]
pub struct Chaos {
    /// Resets per GiB.
    pub resets_per_gib: f64,
    /// Stalls per GiB.
    pub stalls_per_gib: f64,
    /// How long a stall lasts.
    pub stall: Duration,
    /// Seed of the random choices.
    pub seed: u64,
}

/// What the proxy has moved and injected so far.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Stats {
    /// Connections accepted.
    pub connections: u64,
    /// Most connections open at once.
    pub peak_open: u64,
    /// Bytes delivered client to server.
    pub bytes_up: u64,
    /// Bytes delivered server to client.
    pub bytes_down: u64,
    /// Connections reset (armed, random, or by [`Proxy::reset_all`]).
    pub resets: u64,
    /// Stalls injected.
    pub stalls: u64,
    /// Connections answered 503.
    pub unavailable: u64,
    /// Segments delayed by a lost packet.
    pub lost_segments: u64,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    open: AtomicU64,
    peak_open: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    resets: AtomicU64,
    stalls: AtomicU64,
    unavailable: AtomicU64,
    lost_segments: AtomicU64,
}

/// What every connection of one proxy shares.
struct Shared {
    upstream: SocketAddr,
    link: Link,
    /// When each direction's shared rate is next free (Up, Down).
    clocks: [line::RateClock; 2],
    /// Armed resets and stalls, not yet fired, by id.
    armed: Mutex<Vec<(u64, Fault)>>,
    /// The id of the next fault armed.
    next_fault: AtomicU64,
    unavailable: AtomicU32,
    chaos: Mutex<Option<(Chaos, StdRng)>>,
    rng: Mutex<StdRng>,
    kills: Mutex<HashMap<u64, watch::Sender<bool>>>,
    counters: Counters,
}

impl Shared {
    /// The first armed reset or stall for `dir` (it stays armed until one connection fires it).
    fn claim(&self, dir: Dir) -> Option<(u64, Fault)> {
        let armed = self.armed.lock().unwrap();
        armed
            .iter()
            .find(|(_, f)| match f {
                Fault::Reset { dir: d, .. } | Fault::Stall { dir: d, .. } => *d == dir,
                Fault::Unavailable { .. } => false,
            })
            .cloned()
    }

    /// Whether fault `id` is still armed.
    fn is_armed(&self, id: u64) -> bool {
        self.armed.lock().unwrap().iter().any(|(armed, _)| *armed == id)
    }

    /// Disarms fault `id` for the connection that fires it: false when another fired it first.
    fn take(&self, id: u64) -> bool {
        let mut armed = self.armed.lock().unwrap();
        let at = armed.iter().position(|(armed, _)| *armed == id);
        at.map(|at| armed.remove(at)).is_some()
    }
}

/// A running proxy; stops when dropped.
pub struct Proxy {
    /// The loopback port clients connect to.
    pub port: u16,
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Proxy {
    /// Starts a proxy on a free loopback port in front of `upstream`.
    pub fn start(upstream: SocketAddr, link: Link) -> std::io::Result<Proxy> {
        Proxy::start_on("127.0.0.1:0".parse().unwrap(), upstream, link)
    }

    /// Starts a proxy listening on `listen` in front of `upstream`.
    pub fn start_on(listen: SocketAddr, upstream: SocketAddr, link: Link) -> std::io::Result<Proxy> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("faultnet")
            .enable_all()
            .build()?;
        let listener = runtime.block_on(TcpListener::bind(listen))?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            upstream,
            link,
            clocks: Default::default(),
            armed: Mutex::new(Vec::new()),
            next_fault: AtomicU64::new(0),
            unavailable: AtomicU32::new(0),
            chaos: Mutex::new(None),
            rng: Mutex::new(StdRng::seed_from_u64(0x6661756c74)),
            kills: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        });
        runtime.spawn(accept_loop(listener, shared.clone()));
        Ok(Proxy { port, shared, runtime: Some(runtime) })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Arms a one-shot fault.
    pub fn arm(&self, fault: Fault) {
        match fault {
            Fault::Unavailable { connections } => {
                self.shared.unavailable.fetch_add(connections, Ordering::SeqCst);
            }
            other => {
                let id = self.shared.next_fault.fetch_add(1, Ordering::SeqCst);
                self.shared.armed.lock().unwrap().push((id, other));
            }
        }
    }

    /// Sets (or with `None` stops) random faults.
    pub fn set_chaos(&self, chaos: Option<Chaos>) {
        *self.shared.chaos.lock().unwrap() = chaos.map(|c| {
            let rng = StdRng::seed_from_u64(c.seed);
            (c, rng)
        });
    }

    /// Resets every open connection, as a server restart or a failed link would.
    pub fn reset_all(&self) {
        for kill in self.shared.kills.lock().unwrap().values() {
            if !kill.send_replace(true) {
                self.shared.counters.resets.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// Faults armed and not yet fired (resets, stalls and 503 answers).
    pub fn pending(&self) -> usize {
        let s = &self.shared;
        s.armed.lock().unwrap().len() + s.unavailable.load(Ordering::SeqCst) as usize
    }

    /// What has moved and been injected so far.
    pub fn stats(&self) -> Stats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::SeqCst);
        Stats {
            connections: get(&c.connections),
            peak_open: get(&c.peak_open),
            bytes_up: get(&c.bytes_up),
            bytes_down: get(&c.bytes_down),
            resets: get(&c.resets),
            stalls: get(&c.stalls),
            unavailable: get(&c.unavailable),
            lost_segments: get(&c.lost_segments),
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut next_id = 0u64;
    loop {
        let Ok((client, _)) = listener.accept().await else { continue };
        let _ = client.set_nodelay(true);
        shared.counters.connections.fetch_add(1, Ordering::SeqCst);
        let unavailable =
            shared.unavailable.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if unavailable {
            shared.counters.unavailable.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(answer_unavailable(client));
            continue;
        }
        next_id += 1;
        tokio::spawn(connection(next_id, client, shared.clone()));
    }
}

/// Answers a connection's first request `503 Slow Down` (the S3 code clients retry), then
/// reads and drops whatever it still sends until it closes, so the answer is not lost to a
/// reset.
async fn answer_unavailable(mut client: TcpStream) {
    let mut head = Vec::new();
    let mut buf = [0u8; 8192];
    let read_head = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        true
    };
    if !matches!(tokio::time::timeout(Duration::from_secs(5), read_head).await, Ok(true)) {
        return;
    }
    let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code><Message>injected by faultnet</Message></Error>";
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if client.write_all(answer.as_bytes()).await.is_err() {
        return;
    }
    let _ = client.shutdown().await;
    let drain = async { while matches!(client.read(&mut buf).await, Ok(n) if n > 0) {} };
    let _ = tokio::time::timeout(Duration::from_secs(5), drain).await;
}

/// Forwards one connection through two delay lines until both directions end or it is reset.
async fn connection(id: u64, client: TcpStream, shared: Arc<Shared>) {
    let Ok(server) = TcpStream::connect(shared.upstream).await else { return };
    let _ = server.set_nodelay(true);
    let c = &shared.counters;
    let open = c.open.fetch_add(1, Ordering::SeqCst) + 1;
    c.peak_open.fetch_max(open, Ordering::SeqCst);
    let (kill, killed) = watch::channel(false);
    shared.kills.lock().unwrap().insert(id, kill.clone());
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = line::run(Dir::Up, client_read, server_write, shared.clone(), kill.clone(), killed.clone());
    let down = line::run(Dir::Down, server_read, client_write, shared.clone(), kill, killed);
    tokio::join!(up, down);
    shared.kills.lock().unwrap().remove(&id);
    c.open.fetch_sub(1, Ordering::SeqCst);
}

#[cfg(test)]
mod tests;
