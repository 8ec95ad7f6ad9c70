//! The proxy against small std servers: bytes intact and in order, the delay and the rate
//! never beaten, each fault delivered where it was placed.

use super::*;
use std::io::{Read, Write};
use std::net::TcpListener as StdListener;
use std::time::Instant;

/// A server that echoes every connection back.
fn echo_server() -> SocketAddr {
    let l = StdListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut r = s.try_clone().unwrap();
                let _ = std::io::copy(&mut r, &mut s);
            });
        }
    });
    addr
}

/// A server that sends `len` patterned bytes to every connection, then closes it.
fn sending_server(len: usize) -> SocketAddr {
    let l = StdListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let _ = s.write_all(&pattern(len));
            });
        }
    });
    addr
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

fn connect(p: &Proxy) -> std::net::TcpStream {
    std::net::TcpStream::connect(p.addr()).unwrap()
}

/// Reads until the end or an error; returns the bytes and the error.
fn read_all(s: &mut std::net::TcpStream) -> (Vec<u8>, Option<std::io::Error>) {
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (got, None),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => return (got, Some(e)),
        }
    }
}

#[test]
fn bytes_arrive_intact_and_a_round_trip_takes_the_rtt() {
    let link = Link { rtt: Duration::from_millis(40), jitter: Duration::from_millis(5), loss: 0.01, ..Link::default() };
    let p = Proxy::start(echo_server(), link).unwrap();
    let mut s = connect(&p);
    let t = Instant::now();
    s.write_all(b"ping").unwrap();
    let mut four = [0u8; 4];
    s.read_exact(&mut four).unwrap();
    assert_eq!(&four, b"ping");
    assert!(t.elapsed() >= Duration::from_millis(40), "{:?}", t.elapsed());
    let data = pattern(3 << 20);
    let mut w = s.try_clone().unwrap();
    let sent = data.clone();
    let writer = std::thread::spawn(move || {
        w.write_all(&sent).unwrap();
        w.shutdown(std::net::Shutdown::Write).unwrap();
    });
    let (got, err) = read_all(&mut s);
    writer.join().unwrap();
    assert!(err.is_none(), "{err:?}");
    assert!(got == data, "{} bytes came back, {} sent, or not in order", got.len(), data.len());
    let st = p.stats();
    assert_eq!(st.bytes_up, 4 + data.len() as u64);
    assert_eq!(st.bytes_down, st.bytes_up);
    assert!(st.lost_segments > 0, "1 % packet loss over 6 MB lost nothing");
}

#[test]
fn the_rate_is_never_beaten() {
    let len = 2_000_000;
    let p = Proxy::start(sending_server(len), Link { rate: Some(10_000_000), ..Link::default() }).unwrap();
    let t = Instant::now();
    let (got, err) = read_all(&mut connect(&p));
    assert!(err.is_none() && got == pattern(len));
    // 2 MB at 10 MB/s: at least 0.2 s (less the first segment, which goes at once).
    assert!(t.elapsed() >= Duration::from_millis(190), "{:?}", t.elapsed());
}

#[test]
fn a_window_bounds_one_connection() {
    // 64 KiB in flight at a 50 ms round trip: ~1.3 MB/s, so 1 MB takes >= 0.7 s.
    let len = 1_000_000;
    let link = Link { rtt: Duration::from_millis(50), window: 64 << 10, ..Link::default() };
    let p = Proxy::start(sending_server(len), link).unwrap();
    let t = Instant::now();
    let (got, _) = read_all(&mut connect(&p));
    assert_eq!(got.len(), len);
    assert!(t.elapsed() >= Duration::from_millis(700), "{:?}", t.elapsed());
}

#[test]
fn an_armed_reset_cuts_the_answer_where_it_was_placed() {
    let p = Proxy::start(sending_server(1 << 20), Link::default()).unwrap();
    p.arm(Fault::Reset { dir: Dir::Down, after: 100_000 });
    let (got, err) = read_all(&mut connect(&p));
    assert!(got.len() <= 100_000, "{} bytes came before the reset", got.len());
    assert_eq!(got, pattern(got.len()));
    let err = err.expect("the connection was reset, not closed");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    assert_eq!(p.stats().resets, 1);
    // The fault was one-shot: the next connection gets everything.
    let (got, err) = read_all(&mut connect(&p));
    assert!(err.is_none() && got.len() == 1 << 20);
    assert_eq!(p.pending(), 0);
}

#[test]
fn a_stall_holds_the_bytes_then_lets_them_through() {
    let p = Proxy::start(sending_server(500_000), Link::default()).unwrap();
    p.arm(Fault::Stall { dir: Dir::Down, after: 1000, duration: Duration::from_millis(300) });
    let t = Instant::now();
    let (got, err) = read_all(&mut connect(&p));
    assert!(err.is_none() && got == pattern(500_000));
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert_eq!(p.stats().stalls, 1);
}

#[test]
fn unavailable_answers_503_then_the_server_answers() {
    let p = Proxy::start(echo_server(), Link::default()).unwrap();
    p.arm(Fault::Unavailable { connections: 1 });
    let mut s = connect(&p);
    s.write_all(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    let (got, _) = read_all(&mut s);
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 503 ") && text.contains("SlowDown"), "{text}");
    let mut s = connect(&p);
    s.write_all(b"GET /x HTTP/1.1\r\n\r\n").unwrap();
    let mut back = [0u8; 19];
    s.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"GET /x HTTP/1.1\r\n\r\n"[..19].as_ref());
    assert_eq!(p.stats().unavailable, 1);
}

#[test]
fn reset_all_resets_open_connections() {
    let p = Proxy::start(echo_server(), Link::default()).unwrap();
    let mut s = connect(&p);
    s.write_all(b"x").unwrap();
    let mut one = [0u8; 1];
    s.read_exact(&mut one).unwrap();
    p.reset_all();
    let (_, err) = read_all(&mut s);
    assert_eq!(err.map(|e| e.kind()), Some(std::io::ErrorKind::ConnectionReset));
    assert_eq!(p.stats().resets, 1);
}
