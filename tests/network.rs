//! Remote stores behind the fault proxy (gstore-faultnet): S3 (s3s-fs) and `gstore serve`
//! across a slow, lossy link, with a connection reset in the middle of a pack, an answer that
//! stalls, a burst of 503s, a server restart, a store that stays down, and a push cut off and
//! run again. Nothing is lost, nothing wrong is returned, and every image restores byte-exact.

use gstore_faultnet::{Dir, Fault, Link, Proxy};
use gstore_tests::*;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A remote store reached through a proxy.
enum Remote {
    S3(S3),
    Serve { server: Server, _env: Env },
}

impl Remote {
    /// An S3 bucket with an image `app:v1` of `src` pushed directly (not through a proxy).
    fn s3(src: &Path) -> Remote {
        let s3 = S3::start();
        s3.ok("pusher", &["init"]);
        s3.ok("pusher", &["push", src.to_str().unwrap(), "--tag", "app:v1"]);
        Remote::S3(s3)
    }

    /// `gstore serve` in front of a local store holding an image `app:v1` of `src`.
    fn serve(src: &Path) -> Remote {
        let env = Env::new(&[]);
        env.ok(&["push", src.to_str().unwrap(), "--tag", "app:v1"]);
        let server = Server::start(&env.store, &[]);
        Remote::Serve { server, _env: env }
    }

    /// Where the server listens.
    fn upstream(&self) -> SocketAddr {
        let port = match self {
            Remote::S3(s3) => s3.port,
            Remote::Serve { server, .. } => server.port,
        };
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// `gstore ARGS` on machine `machine`, reaching the store through `proxy`.
    fn cmd(&self, proxy: &Proxy, machine: &str, args: &[&str]) -> Command {
        match self {
            Remote::S3(s3) => {
                let mut c = s3.cmd(machine, args);
                c.env("AWS_ENDPOINT", format!("http://{}", proxy.addr()));
                c
            }
            Remote::Serve { server, .. } => {
                let mut c = Command::new(gstore_bin());
                c.arg("--store")
                    .arg(format!("http://{}", proxy.addr()))
                    .args(args)
                    .env_remove("GSTORE_TOKEN")
                    .env("XDG_CACHE_HOME", server.tmp.path().join(machine));
                c
            }
        }
    }

    fn scratch(&self) -> &Path {
        match self {
            Remote::S3(s3) => s3.tmp.path(),
            Remote::Serve { server, .. } => server.tmp.path(),
        }
    }
}

fn both(src: &Path) -> Vec<Remote> {
    vec![Remote::s3(src), Remote::serve(src)]
}

fn source(tmp: &Path, seed: u64, scale: usize) -> std::path::PathBuf {
    let src = tmp.join(format!("src-{seed}"));
    make_tree(&src, seed, scale);
    src
}

fn succeeded(o: &Output, what: &str) {
    assert!(o.status.success(), "{what} failed:\n{}", String::from_utf8_lossy(&o.stderr));
}

/// Restores `app:v1` through `proxy` on a new machine into a new directory and checks it
/// against `src`; returns how long it took.
fn restore_exact(r: &Remote, proxy: &Proxy, src: &Path, machine: &str, env: &[(&str, &str)]) -> Duration {
    let out = r.scratch().join(format!("out-{machine}"));
    let t = Instant::now();
    let o = r
        .cmd(proxy, machine, &["restore", "app:v1", "--to", out.to_str().unwrap()])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let took = t.elapsed();
    succeeded(&o, "restore");
    assert_same_tree(src, &out);
    took
}

#[test]
fn restores_over_a_slow_lossy_link_are_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path(), 1, 6_000_000);
    for r in both(&src) {
        let link = Link {
            rtt: Duration::from_millis(20),
            jitter: Duration::from_millis(5),
            rate: Some(25_000_000),
            loss: 0.005,
            ..Link::default()
        };
        let proxy = Proxy::start(r.upstream(), link).unwrap();
        restore_exact(&r, &proxy, &src, "b", &[]);
        succeeded(&r.cmd(&proxy, "b", &["verify", "--read-data"]).output().unwrap(), "verify");
        let st = proxy.stats();
        assert!(st.bytes_down > 6_000_000 / 2 && st.lost_segments > 0, "{st:?}");
    }
}

#[test]
fn a_reset_in_the_middle_of_a_pack_read_is_retried() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path(), 2, 8_000_000);
    for r in both(&src) {
        let proxy = Proxy::start(r.upstream(), Link::default()).unwrap();
        // Machine b learns the store first, so the resets land in the restore's pack reads.
        succeeded(&r.cmd(&proxy, "b", &["ls"]).output().unwrap(), "ls");
        for after in [200_000, 500_000, 1_000_000] {
            proxy.arm(Fault::Reset { dir: Dir::Down, after });
        }
        restore_exact(&r, &proxy, &src, "b", &[]);
        assert_eq!(proxy.pending(), 0, "every reset fired");
        assert_eq!(proxy.stats().resets, 3);
    }
}

#[test]
fn a_stalled_answer_is_dropped_and_asked_again() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path(), 3, 4_000_000);
    for r in both(&src) {
        let proxy = Proxy::start(r.upstream(), Link::default()).unwrap();
        succeeded(&r.cmd(&proxy, "b", &["ls"]).output().unwrap(), "ls");
        proxy.arm(Fault::Stall { dir: Dir::Down, after: 500_000, duration: Duration::from_secs(120) });
        let took = restore_exact(&r, &proxy, &src, "b", &[("GSTORE_IO_TIMEOUT", "1s")]);
        assert_eq!(proxy.stats().stalls, 1);
        // The stall was noticed after a second of silence, not waited out.
        assert!(took < Duration::from_secs(60), "the restore waited {took:?} on a stalled answer");
    }
}

#[test]
fn a_burst_of_server_errors_is_ridden_out() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path(), 4, 3_000_000);
    for r in both(&src) {
        let proxy = Proxy::start(r.upstream(), Link::default()).unwrap();
        succeeded(&r.cmd(&proxy, "b", &["ls"]).output().unwrap(), "ls");
        proxy.arm(Fault::Unavailable { connections: 12 });
        restore_exact(&r, &proxy, &src, "b", &[]);
        assert_eq!(proxy.stats().unavailable, 12);
    }
}

/// An S3 restore slow enough (a 40 Mbit/s link) to be cut in the middle.
fn slow_s3(src: &Path) -> (S3, Proxy) {
    let Remote::S3(s3) = Remote::s3(src) else { unreachable!() };
    let proxy =
        Proxy::start(SocketAddr::from(([127, 0, 0, 1], s3.port)), Link { rate: Some(5_000_000), ..Link::default() })
            .unwrap();
    (s3, proxy)
}

#[test]
fn a_server_restart_in_the_middle_of_a_restore_is_ridden_out() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path(), 5, 15_000_000);
    let (mut s3, proxy) = slow_s3(&src);
    let out = tmp.path().join("out");
    let mut c = s3.cmd("b", &["restore", "app:v1", "--to", out.to_str().unwrap()]);
    c.env("AWS_ENDPOINT", format!("http://{}", proxy.addr()));
    let child = c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    // Stop the server once the restore is reading packs, start it again 2 s later.
    let t = Instant::now();
    while proxy.stats().bytes_down < 3_000_000 && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    s3.stop();
    proxy.reset_all();
    std::thread::sleep(Duration::from_secs(2));
    s3.resume();
    let o = child.wait_with_output().unwrap();
    succeeded(&o, "restore across a restart");
    assert_same_tree(&src, &out);
}

#[test]
fn a_store_that_stays_down_fails_the_restore_clearly_and_it_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path(), 6, 15_000_000);
    let (mut s3, proxy) = slow_s3(&src);
    let out = tmp.path().join("out");
    let restore = |s3: &S3| {
        let mut c = s3.cmd("b", &["--json", "restore", "app:v1", "--to", out.to_str().unwrap()]);
        c.env("AWS_ENDPOINT", format!("http://{}", proxy.addr())).env("GSTORE_RETRY_TIMEOUT", "3s");
        c
    };
    let child = restore(&s3).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let t = Instant::now();
    while proxy.stats().bytes_down < 5_000_000 && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    s3.stop();
    proxy.reset_all();
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(6),
        "exit status for an unavailable store: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let err: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let message = err["error"]["message"].as_str().unwrap();
    assert_eq!(err["error"]["code"], "unavailable");
    assert!(message.contains("still failing after") && message.contains("GSTORE_RETRY_TIMEOUT"), "{message}");
    // Back up: the restore resumes from what it had written and ends exact.
    s3.resume();
    let o = restore(&s3).output().unwrap();
    succeeded(&o, "resumed restore");
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(report["resumed_chunks"].as_u64().unwrap() > 0, "{report}");
    assert_same_tree(&src, &out);
}

#[test]
fn a_push_cut_off_runs_again_without_uploading_what_landed() {
    let tmp = tempfile::tempdir().unwrap();
    // ~150 MB that does not compress: several 48 MiB packs.
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..3 {
        std::fs::write(src.join(format!("part-{i}")), random_bytes(50_000_000, 70 + i)).unwrap();
    }
    let s3 = S3::start();
    s3.ok("a", &["init"]);
    let proxy =
        Proxy::start(SocketAddr::from(([127, 0, 0, 1], s3.port)), Link { rate: Some(25_000_000), ..Link::default() })
            .unwrap();
    let push = |s3: &S3| {
        let mut c = s3.cmd("a", &["push", src.to_str().unwrap(), "--tag", "big:v1"]);
        c.env("AWS_ENDPOINT", format!("http://{}", proxy.addr())).env("GSTORE_RETRY_TIMEOUT", "2s");
        c
    };
    let mut s3 = s3;
    let child = push(&s3).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    // Cut the store off as soon as a pack has landed (the packs go up side by side).
    let t = Instant::now();
    while pack_files(&s3.bucket_dir()).is_empty() && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(10));
    }
    s3.stop();
    proxy.reset_all();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(6), "{}", String::from_utf8_lossy(&o.stderr));
    let landed = pack_files(&s3.bucket_dir()).len();
    assert!(landed >= 1, "no pack had landed before the cut");
    s3.resume();
    let before = proxy.stats().bytes_up;
    succeeded(&push(&s3).output().unwrap(), "push again");
    let again = proxy.stats().bytes_up - before;
    assert!(
        again < 150_000_000 - 40_000_000 * landed as u64,
        "the second push uploaded {again} bytes although {landed} packs had landed"
    );
    let out = tmp.path().join("out");
    s3.ok("b", &["restore", "big:v1", "--to", out.to_str().unwrap()]);
    assert_same_tree(&src, &out);
    s3.ok("b", &["verify", "--read-data"]);
}

/// A process killed when this is dropped (a failing test leaves no server behind).
struct Killed(std::process::Child);

impl Killed {
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Restores `app:v1` of `s3` on machine `machine` with `GSTORE_TIERS=tiers`, checks it against
/// `src`, and returns its stderr.
fn restore_through_tiers(s3: &S3, tiers: &str, src: &Path, machine: &str) -> String {
    let out = s3.tmp.path().join(format!("out-{machine}"));
    let o = s3.cmd(machine, &["restore", "app:v1", "--to", out.to_str().unwrap()]).env("GSTORE_TIERS", tiers).output();
    let o = o.unwrap();
    succeeded(&o, "restore through the tier");
    assert_same_tree(src, &out);
    String::from_utf8(o.stderr).unwrap()
}

#[test]
fn restore_nodes_read_packs_through_a_tier_and_go_around_it_when_it_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path(), 7, 8_000_000);
    let s3 = S3::start();
    s3.ok("pusher", &["init"]);
    s3.ok("pusher", &["push", src.to_str().unwrap(), "--tag", "app:v1"]);
    // The tier serves the bucket with a cache; restore nodes reach it through a proxy.
    let port = free_port();
    let cache = tmp.path().join("tier");
    let mut tier = Killed(
        s3.cmd("tier", &["serve", "--listen", &format!("127.0.0.1:{port}"), "--cache", cache.to_str().unwrap()])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_port(port, "the tier");
    let proxy = Proxy::start(SocketAddr::from(([127, 0, 0, 1], port)), Link::default()).unwrap();
    let tiers = format!("http://{}", proxy.addr());

    // Through the tier: the packs come from it, and it kept them.
    let err = restore_through_tiers(&s3, &tiers, &src, "a");
    assert!(!err.contains("failed"), "{err}");
    let packs: u64 = pack_files(&s3.bucket_dir()).iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
    let through = proxy.stats().bytes_down;
    assert!(through > packs * 9 / 10, "{through} bytes came through the tier, the packs hold {packs}");
    assert!(cache.read_dir().unwrap().count() > 0, "the tier kept nothing");

    // The tier's answers cut mid-body, every one, over and over (a tier dying): once a read
    // has failed its attempts, the node reads past the tier, from the bucket, and says so.
    for _ in 0..64 {
        proxy.arm(Fault::Reset { dir: Dir::Down, after: 1000 });
    }
    let err = restore_through_tiers(&s3, &tiers, &src, "b");
    assert!(proxy.stats().resets >= 4, "{:?}", proxy.stats());
    assert!(err.contains("tier") && err.contains("failed"), "{err}");

    // The tier gone: the restore reads everything from the bucket.
    tier.kill();
    let err = restore_through_tiers(&s3, &tiers, &src, "c");
    assert!(err.contains("failed"), "{err}");
}

#[test]
fn a_tier_serving_damaged_bytes_is_gone_around_and_the_restore_is_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path(), 8, 6_000_000);
    let other = tmp.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    write_mixed_file(&other.join("f"), 1_000_000, 9);
    let s3 = S3::start();
    s3.ok("pusher", &["init"]);
    s3.ok("pusher", &["push", other.to_str().unwrap(), "--tag", "other:v1"]);
    let earlier = pack_files(&s3.bucket_dir());
    s3.ok("pusher", &["push", src.to_str().unwrap(), "--tag", "app:v1"]);
    // The tier serves a copy of the bucket whose packs get damaged: first the image's in
    // its chunks, then also the other image's in its trailer (a node reads every pack's tail
    // through the tier when it syncs its index).
    let mirror = tmp.path().join("mirror");
    assert!(Command::new("cp").arg("-r").arg(s3.bucket_dir().join("images")).arg(&mirror).status().unwrap().success());
    let damage = |tails: bool| {
        for p in pack_files(&mirror) {
            let mut bytes = std::fs::read(&p).unwrap();
            let len = bytes.len();
            match earlier.iter().any(|e| e.file_name() == p.file_name()) {
                true if tails => bytes[len - 1] ^= 0x20,
                true => continue,
                false if tails => continue,
                false => (0..len * 3 / 4).step_by(4096).for_each(|at| bytes[at] ^= 0x20),
            }
            std::fs::write(&p, bytes).unwrap();
        }
    };
    let port = free_port();
    let _tier = Killed(
        gstore_in(tmp.path())
            .args(["--store", mirror.to_str().unwrap(), "serve", "--listen", &format!("127.0.0.1:{port}")])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_port(port, "the damaged tier");
    let tier = format!("http://127.0.0.1:{port}");
    damage(false);
    let err = restore_through_tiers(&s3, &tier, &src, "a");
    assert!(err.contains("failed their check"), "{err}");
    damage(true);
    let err = restore_through_tiers(&s3, &tier, &src, "b");
    assert!(err.contains("failed their check"), "{err}");
}
