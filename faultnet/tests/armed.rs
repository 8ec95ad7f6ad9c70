//! Armed faults fire on the first connection that carries their bytes, whichever connection
//! saw them first: an HTTP client's keep-alive pool leaves connections open and idle.

use gstore_faultnet::{Dir, Fault, Link, Proxy};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// A server on loopback answering each line "N" with N bytes, on as many requests per
/// connection as the client sends.
fn upstream() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            std::thread::spawn(move || {
                let mut out = conn.try_clone().unwrap();
                for line in BufReader::new(conn).lines() {
                    let Ok(n) = line.unwrap_or_default().trim().parse::<usize>() else { return };
                    if out.write_all(&vec![7u8; n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Asks `conn` for `n` bytes and reads them all; returns how long that took.
fn fetch(conn: &mut TcpStream, n: usize) -> Duration {
    let t = Instant::now();
    conn.write_all(format!("{n}\n").as_bytes()).unwrap();
    let mut got = vec![0u8; n];
    conn.read_exact(&mut got).unwrap();
    assert!(got.iter().all(|&b| b == 7));
    t.elapsed()
}

#[test]
fn a_stall_fires_on_the_busy_connection_while_an_idle_one_saw_it_first() {
    let proxy = Proxy::start(upstream(), Link::default()).unwrap();
    let stall = Duration::from_millis(400);
    proxy.arm(Fault::Stall { dir: Dir::Down, after: 1000, duration: stall });
    // The first connection moves a few bytes after the fault is armed, then idles.
    let mut idle = TcpStream::connect(proxy.addr()).unwrap();
    fetch(&mut idle, 10);
    let mut busy = TcpStream::connect(proxy.addr()).unwrap();
    let took = fetch(&mut busy, 100_000);
    assert_eq!(proxy.stats().stalls, 1, "the stall fired on the connection that carried its bytes");
    assert!(took >= stall, "the busy connection was stalled ({took:?})");
    assert_eq!(proxy.pending(), 0);
    // Fired once: the idle connection carries its bytes later without a stall.
    fetch(&mut idle, 5000);
    assert_eq!(proxy.stats().stalls, 1);
}

#[test]
fn armed_resets_each_fire_once() {
    let proxy = Proxy::start(upstream(), Link::default()).unwrap();
    for after in [2000, 3000] {
        proxy.arm(Fault::Reset { dir: Dir::Down, after });
    }
    let mut reset = 0;
    for _ in 0..4 {
        let mut conn = TcpStream::connect(proxy.addr()).unwrap();
        conn.write_all(b"10000\n").unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut got = vec![0u8; 10_000];
        if conn.read_exact(&mut got).is_err() {
            reset += 1;
        }
    }
    assert_eq!(reset, 2, "each armed reset cut one connection");
    assert_eq!(proxy.stats().resets, 2);
    assert_eq!(proxy.pending(), 0);
}
