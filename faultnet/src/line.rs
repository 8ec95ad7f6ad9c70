//! One direction of one connection: a reader cuts what arrives into segments and stamps each
//! with its delivery time (half the round trip, jitter, a retransmission if a packet of it
//! was lost), a writer delivers them in order under the rate both directions' connections
//! share, and faults sit between segments where they were placed.

use crate::{Dir, Fault, Shared, PACKET};
use rand::Rng;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::time::{sleep, sleep_until, Instant};

/// Largest segment read at once.
const SEGMENT: usize = 64 << 10;
/// Bytes in a GiB, for the chaos rates.
const GIB: f64 = (1u64 << 30) as f64;

/// When one direction's shared rate is next free.
#[derive(Default)]
pub(crate) struct RateClock(Mutex<Option<Instant>>);

impl RateClock {
    /// Books the link for `n` bytes at `rate` bytes per second, after whatever was booked
    /// before; returns when they have gone through.
    fn book(&self, n: usize, rate: u64) -> Instant {
        let mut next = self.0.lock().unwrap();
        let now = Instant::now();
        let start = next.map_or(now, |t| t.max(now));
        let end = start + Duration::from_secs_f64(n as f64 / rate.max(1) as f64);
        *next = Some(end);
        end
    }
}

/// What the reader hands the writer.
enum Item {
    /// Bytes to deliver at `at`.
    Data { at: Instant, bytes: Vec<u8> },
    /// Deliver nothing for this long; `armed`: the id of the armed fault, if a test armed it.
    Stall { duration: Duration, armed: Option<u64> },
    /// Reset the connection; `armed`: the id of the armed fault, if a test armed it.
    Reset { armed: Option<u64> },
    /// The sender closed its side: pass the close on.
    End,
}

/// Runs direction `dir` from `src` to `dst` until its sender closes or the connection is
/// killed (by a fault, an error on either end, or [`crate::Proxy::reset_all`]); a killed
/// connection's sockets close with a reset.
pub(crate) async fn run(
    dir: Dir,
    mut src: OwnedReadHalf,
    mut dst: OwnedWriteHalf,
    shared: Arc<Shared>,
    kill: watch::Sender<bool>,
    mut killed: watch::Receiver<bool>,
) {
    let window = Arc::new(Semaphore::new(shared.link.window.max(SEGMENT)));
    let (tx, mut rx) = mpsc::unbounded_channel();
    tokio::select! {
        _ = async {
            tokio::join!(
                read_side(dir, &mut src, tx, window.clone(), &shared, &kill),
                write_side(dir, &mut dst, &mut rx, window, &shared, &kill),
            )
        } => {}
        _ = killed.wait_for(|k| *k) => {}
    }
    if *kill.borrow() {
        // No FIN first: the ends must see a reset, not a clean close.
        let _ = src.as_ref().set_zero_linger();
        let _ = dst.as_ref().set_zero_linger();
        dst.forget();
    }
}

async fn read_side(
    dir: Dir,
    src: &mut OwnedReadHalf,
    tx: mpsc::UnboundedSender<Item>,
    window: Arc<Semaphore>,
    shared: &Shared,
    kill: &watch::Sender<bool>,
) {
    let link = &shared.link;
    let mut moved = 0u64;
    // The fault placed ahead in this direction, at its byte offset.
    let mut placed: Option<(u64, Item)> = None;
    let mut last = Instant::now();
    loop {
        let Ok(permit) = window.acquire_many(SEGMENT as u32).await else { return };
        permit.forget();
        let mut buf = vec![0u8; SEGMENT];
        let n = match src.read(&mut buf).await {
            Ok(0) => {
                let _ = tx.send(Item::End);
                break;
            }
            Ok(n) => n,
            Err(_) => {
                let _ = kill.send(true);
                break;
            }
        };
        window.add_permits(SEGMENT - n);
        buf.truncate(n);
        // A fault another connection fired first is not this one's to fire.
        if let Some((_, Item::Reset { armed: Some(id) } | Item::Stall { armed: Some(id), .. })) = placed {
            if !shared.is_armed(id) {
                placed = None;
            }
        }
        if placed.is_none() {
            placed = place_fault(dir, moved, n, shared);
        }
        // When the segment is due: after what came before it, half a round trip, jitter, and
        // a round trip more if one of its packets was lost.
        let mut delay = link.rtt / 2;
        {
            let mut rng = shared.rng.lock().unwrap();
            if !link.jitter.is_zero() {
                delay += link.jitter.mul_f64(rng.random::<f64>());
            }
            if link.loss > 0.0 {
                let packets = n.div_ceil(PACKET) as i32;
                if rng.random::<f64>() < 1.0 - (1.0 - link.loss).powi(packets) {
                    delay += link.rtt.max(Duration::from_millis(1));
                    shared.counters.lost_segments.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        let at = (Instant::now() + delay).max(last);
        last = at;
        let end = moved + n as u64;
        let mut sent = Ok(());
        match placed.take() {
            Some((offset, fault)) if offset <= end => {
                let mut rest = buf.split_off((offset - moved) as usize);
                if !buf.is_empty() {
                    sent = tx.send(Item::Data { at, bytes: buf });
                }
                if sent.is_ok() {
                    sent = tx.send(fault);
                }
                if sent.is_ok() && !rest.is_empty() {
                    sent = tx.send(Item::Data { at, bytes: std::mem::take(&mut rest) });
                }
            }
            later => {
                placed = later;
                sent = tx.send(Item::Data { at, bytes: buf });
            }
        }
        if sent.is_err() {
            break;
        }
        moved = end;
    }
}

/// A fault for the next bytes of this direction, `moved` bytes in, with a segment of `n`
/// bytes just read: an armed one, else a random one.
fn place_fault(dir: Dir, moved: u64, n: usize, shared: &Shared) -> Option<(u64, Item)> {
    if let Some((id, f)) = shared.claim(dir) {
        return Some(match f {
            Fault::Reset { after, .. } => (moved + after, Item::Reset { armed: Some(id) }),
            Fault::Stall { after, duration, .. } => (moved + after, Item::Stall { duration, armed: Some(id) }),
            Fault::Unavailable { .. } => unreachable!("claim takes resets and stalls only"),
        });
    }
    let mut chaos = shared.chaos.lock().unwrap();
    let (c, rng) = chaos.as_mut()?;
    let share = n as f64 / GIB;
    let at = moved + rng.random_range(0..n as u64);
    if rng.random::<f64>() < c.resets_per_gib * share {
        Some((at, Item::Reset { armed: None }))
    } else if rng.random::<f64>() < c.stalls_per_gib * share {
        Some((at, Item::Stall { duration: c.stall, armed: None }))
    } else {
        None
    }
}

async fn write_side(
    dir: Dir,
    dst: &mut OwnedWriteHalf,
    rx: &mut mpsc::UnboundedReceiver<Item>,
    window: Arc<Semaphore>,
    shared: &Shared,
    kill: &watch::Sender<bool>,
) {
    let c = &shared.counters;
    let (clock, bytes) = match dir {
        Dir::Up => (&shared.clocks[0], &c.bytes_up),
        Dir::Down => (&shared.clocks[1], &c.bytes_down),
    };
    while let Some(item) = rx.recv().await {
        match item {
            Item::Data { at, bytes: data } => {
                sleep_until(at).await;
                if let Some(rate) = shared.link.rate {
                    sleep_until(clock.book(data.len(), rate)).await;
                }
                if dst.write_all(&data).await.is_err() {
                    let _ = kill.send(true);
                    return;
                }
                bytes.fetch_add(data.len() as u64, Ordering::SeqCst);
                // The window opens again when the acknowledgement is back, half a round trip on.
                let (n, ack) = (data.len(), shared.link.rtt / 2);
                if ack.is_zero() {
                    window.add_permits(n);
                } else {
                    let window = window.clone();
                    tokio::spawn(async move {
                        sleep(ack).await;
                        window.add_permits(n);
                    });
                }
            }
            Item::Stall { duration, armed } => {
                if armed.is_some_and(|id| !shared.take(id)) {
                    continue;
                }
                c.stalls.fetch_add(1, Ordering::SeqCst);
                sleep(duration).await;
            }
            Item::Reset { armed } => {
                if armed.is_some_and(|id| !shared.take(id)) {
                    continue;
                }
                c.resets.fetch_add(1, Ordering::SeqCst);
                let _ = kill.send(true);
                return;
            }
            Item::End => {
                let _ = dst.shutdown().await;
                return;
            }
        }
    }
}
