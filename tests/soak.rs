//! A soak: pushers, restorers, a tag remover and a gc loop, each on its own machine, against
//! S3 behind the fault proxy (5 ms round trip, random resets and stalls), while a killer sends
//! SIGKILL to one of them at random moments. It runs `GSTORE_SOAK_SECS` seconds (default 30;
//! longer by hand). Afterwards every tag restores byte-exact from its source, every push that
//! reported success has its tag, no restore ever returned wrong bytes, and `verify --read-data`
//! is clean.

use gstore_faultnet::{Chaos, Link, Proxy};
use gstore_tests::*;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What every actor shares.
struct World {
    s3: S3,
    proxy: Proxy,
    scratch: PathBuf,
    /// Each tag ever pushed (or tried) and its source tree.
    sources: Mutex<BTreeMap<String, PathBuf>>,
    /// Tags whose push reported success, and whether they were removed since.
    pushed: Mutex<BTreeMap<String, bool>>,
    /// The tag whose `rm` was killed and not yet run again: it may or may not be gone (the
    /// remover runs `rm` again to find out, unless the soak ends first).
    cut_short: Mutex<Option<String>>,
    /// Processes running now: (pid, role).
    running: Mutex<Vec<(u32, String)>>,
    stop: AtomicBool,
    kills: AtomicUsize,
    restores_checked: AtomicUsize,
}

impl World {
    /// `gstore ARGS` on `machine` through the proxy, faults ridden out quickly.
    fn cmd(&self, machine: &str, args: &[&str]) -> Command {
        let mut c = self.s3.cmd(machine, args);
        c.env("AWS_ENDPOINT", format!("http://{}", self.proxy.addr()))
            .env("GSTORE_IO_TIMEOUT", "1s")
            .env("GSTORE_RETRY_TIMEOUT", "20s")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Runs a command as a killable actor; returns (exit code, None when killed; stderr).
    fn run(&self, role: &str, mut c: Command) -> (Option<i32>, String) {
        let child = c.spawn().unwrap();
        let pid = child.id();
        self.running.lock().unwrap().push((pid, role.to_string()));
        let o = child.wait_with_output().unwrap();
        self.running.lock().unwrap().retain(|(p, _)| *p != pid);
        (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
    }
}

/// Seconds the soak runs.
fn soak_secs() -> u64 {
    std::env::var("GSTORE_SOAK_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(30)
}

/// A source tree for push `n` of pusher `p`: a file every push of the pusher shares (dedup
/// across images) and files of its own.
fn make_source(scratch: &Path, p: usize, n: usize) -> PathBuf {
    let dir = scratch.join(format!("src-{p}-{n}"));
    make_tree(&dir, (p * 1000 + n) as u64, 1_500_000);
    write_mixed_file(&dir.join("shared.img"), 3_000_000, p as u64);
    dir
}

fn pusher(w: &World, p: usize) {
    let mut n = 0;
    while !w.stop.load(Ordering::SeqCst) {
        n += 1;
        let tag = format!("p{p}:v{n}");
        let src = make_source(&w.scratch, p, n);
        w.sources.lock().unwrap().insert(tag.clone(), src.clone());
        let (code, err) = w.run("push", w.cmd(&format!("pusher{p}"), &["push", src.to_str().unwrap(), "--tag", &tag]));
        match code {
            Some(0) => {
                w.pushed.lock().unwrap().insert(tag, false);
            }
            None => {} // killed: the tag may or may not exist
            Some(c) => panic!("push {tag} failed with {c}: {err}"),
        }
    }
}

fn restorer(w: &World, r: usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(r as u64);
    let mut n = 0;
    while !w.stop.load(Ordering::SeqCst) {
        // Only tags no remover touches (pusher 0's images are the ones removed).
        let live: Vec<String> = w.pushed.lock().unwrap().keys().filter(|t| !t.starts_with("p0:")).cloned().collect();
        if live.is_empty() {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        let tag = &live[rng.random_range(0..live.len())];
        n += 1;
        let out = w.scratch.join(format!("restore-{r}-{n}"));
        let (code, err) =
            w.run("restore", w.cmd(&format!("restorer{r}"), &["restore", tag, "--to", out.to_str().unwrap()]));
        match code {
            Some(0) => {
                assert_same_tree(&w.sources.lock().unwrap()[tag], &out);
                w.restores_checked.fetch_add(1, Ordering::SeqCst);
            }
            None => {}
            Some(c) => panic!("restore {tag} failed with {c}: {err}"),
        }
        let _ = std::fs::remove_dir_all(&out);
    }
}

/// Removes pusher 0's images, oldest first, so that gc has packs to delete.
fn remover(w: &World) {
    // A tag whose rm was killed may be gone already: its next rm may find nothing.
    while !w.stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1500));
        let oldest = w
            .pushed
            .lock()
            .unwrap()
            .iter()
            .find(|(t, removed)| t.starts_with("p0:") && !**removed)
            .map(|(t, _)| t.clone());
        let Some(tag) = oldest else { continue };
        let (code, err) = w.run("rm", w.cmd("remover", &["rm", &tag]));
        let mut cut_short = w.cut_short.lock().unwrap();
        match code {
            Some(0) => {
                w.pushed.lock().unwrap().insert(tag, true);
                *cut_short = None;
            }
            Some(3) if cut_short.as_ref() == Some(&tag) => {
                w.pushed.lock().unwrap().insert(tag, true);
                *cut_short = None;
            }
            None => *cut_short = Some(tag),
            Some(c) => panic!("rm {tag} failed with {c}: {err}"),
        }
    }
}

fn collector(w: &World) {
    while !w.stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1000));
        let (code, err) = w.run("gc", w.cmd("collector", &["gc"]));
        // A gc that meets a lock held by a live gc (or one the killer just killed on another
        // check) stops with a conflict; anything else is a failure.
        assert!(matches!(code, Some(0) | Some(5) | None), "gc failed with {code:?}: {err}");
    }
}

fn killer(w: &World) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    while !w.stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(rng.random_range(800..3000)));
        let victim = {
            let running = w.running.lock().unwrap();
            (!running.is_empty()).then(|| running[rng.random_range(0..running.len())].0)
        };
        if let Some(pid) = victim {
            if Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success() {
                w.kills.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

#[test]
fn pushes_restores_and_gc_under_faults_and_kills_lose_nothing() {
    let s3 = S3::start();
    s3.ok("pusher0", &["init"]);
    let link = Link { rtt: Duration::from_millis(5), ..Link::default() };
    let proxy = Proxy::start(SocketAddr::from(([127, 0, 0, 1], s3.port)), link).unwrap();
    proxy.set_chaos(Some(Chaos { resets_per_gib: 40.0, stalls_per_gib: 10.0, stall: Duration::from_secs(3), seed: 7 }));
    let scratch = s3.tmp.path().join("soak");
    std::fs::create_dir_all(&scratch).unwrap();
    let w = Arc::new(World {
        s3,
        proxy,
        scratch,
        sources: Mutex::default(),
        pushed: Mutex::default(),
        cut_short: Mutex::default(),
        running: Mutex::default(),
        stop: AtomicBool::new(false),
        kills: AtomicUsize::new(0),
        restores_checked: AtomicUsize::new(0),
    });
    let mut actors = Vec::new();
    for p in 0..3 {
        let w = w.clone();
        actors.push(std::thread::spawn(move || pusher(&w, p)));
    }
    for r in 0..2 {
        let w = w.clone();
        actors.push(std::thread::spawn(move || restorer(&w, r)));
    }
    let (w1, w2, w3) = (w.clone(), w.clone(), w.clone());
    actors.push(std::thread::spawn(move || remover(&w1)));
    actors.push(std::thread::spawn(move || collector(&w2)));
    actors.push(std::thread::spawn(move || killer(&w3)));
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(soak_secs()) && !actors.iter().any(|a| a.is_finished()) {
        std::thread::sleep(Duration::from_millis(200));
    }
    w.stop.store(true, Ordering::SeqCst);
    for a in actors {
        if let Err(panic) = a.join() {
            std::panic::resume_unwind(panic);
        }
    }
    w.proxy.set_chaos(None);
    let st = w.proxy.stats();
    eprintln!(
        "soak: {} kills, {} restores checked, {} pushes landed, proxy {st:?}",
        w.kills.load(Ordering::SeqCst),
        w.restores_checked.load(Ordering::SeqCst),
        w.pushed.lock().unwrap().len()
    );
    assert!(w.kills.load(Ordering::SeqCst) > 0 && st.resets > 0, "the soak injected nothing: {st:?}");

    // After: one more gc, then every tag restores exact and the store verifies.
    w.s3.ok("after", &["gc"]);
    let ls: serde_json::Value = serde_json::from_str(&w.s3.ok("after", &["--json", "ls"])).unwrap();
    let listed: Vec<String> = ls.as_array().unwrap().iter().map(|i| i["tag"].as_str().unwrap().to_string()).collect();
    // A tag whose last `rm` was killed (the soak ended before it ran again) may be either.
    let cut_short = w.cut_short.lock().unwrap().clone();
    for (tag, removed) in w.pushed.lock().unwrap().iter() {
        let maybe_removed = *removed || cut_short.as_ref() == Some(tag);
        assert!(maybe_removed || listed.contains(tag), "{tag} was pushed and never removed, but is gone");
    }
    for tag in &listed {
        let out = w.scratch.join(format!("final-{}", tag.replace(':', "-")));
        w.s3.ok("after", &["restore", tag, "--to", out.to_str().unwrap()]);
        assert_same_tree(&w.sources.lock().unwrap()[tag], &out);
    }
    w.s3.ok("after", &["verify", "--read-data"]);
}
