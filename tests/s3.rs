//! Stores in a real S3-compatible server (s3s-fs on 127.0.0.1): push and restore from two
//! machines, the local range cache, damage in the bucket, and a server that fails.

use gstore_faultnet::{Link, Proxy, Stats};
use gstore_tests::*;
use std::fs;
use std::time::{Duration, Instant};

/// A 20 MB/s link in front of `s3`, slow enough for a command to be stopped in the middle.
fn slow_link(s3: &S3) -> Proxy {
    let link = Link { rate: Some(20_000_000), ..Link::default() };
    Proxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], s3.port)), link).unwrap()
}

/// Waits until `moved` of the proxy's stats passes `bytes` (at most a minute), so that the
/// command going through it is known to be under way, then stops the server and the link, as
/// a server that went away: the command's connections are cut and new ones are refused.
fn stop_when_moved(s3: &mut S3, proxy: Proxy, moved: fn(&Stats) -> u64, bytes: u64) {
    let t = Instant::now();
    while moved(&proxy.stats()) < bytes {
        assert!(t.elapsed() < Duration::from_secs(60), "only {} bytes moved in a minute", moved(&proxy.stats()));
        std::thread::sleep(Duration::from_millis(10));
    }
    s3.stop();
    drop(proxy);
}

#[test]
fn push_on_one_machine_restore_on_another() {
    let s3 = S3::start();
    let src = s3.tmp.path().join("src");
    make_tree(&src, 1, 6_000_000);
    s3.ok("a", &["init"]);
    s3.ok("a", &["push", src.to_str().unwrap(), "--tag", "app:v1"]);
    // Machine b has never seen this store: its index is built from the pack footers.
    let ls: serde_json::Value = serde_json::from_str(&s3.ok("b", &["--json", "ls"])).unwrap();
    assert_eq!(ls[0]["tag"], "app:v1");
    let out = s3.tmp.path().join("out-b");
    s3.ok("b", &["restore", "app:v1", "--to", out.to_str().unwrap()]);
    assert_same_tree(&src, &out);
    s3.ok("b", &["verify", "--read-data"]);
    let du: serde_json::Value = serde_json::from_str(&s3.ok("b", &["--json", "du"])).unwrap();
    assert!(du["packs"].as_u64().unwrap() >= 1);
    // Pushes from both machines land; both images restore.
    let src2 = s3.tmp.path().join("src2");
    make_tree(&src2, 2, 3_000_000);
    s3.ok("b", &["push", src2.to_str().unwrap(), "--tag", "other"]);
    let out2 = s3.tmp.path().join("out-a2");
    s3.ok("a", &["restore", "other", "--to", out2.to_str().unwrap()]);
    assert_same_tree(&src2, &out2);
}

#[test]
fn a_second_restore_reads_from_the_local_cache() {
    let s3 = S3::start();
    let src = s3.tmp.path().join("src");
    make_tree(&src, 3, 5_000_000);
    s3.ok("a", &["init"]);
    s3.ok("a", &["push", src.to_str().unwrap(), "--tag", "x"]);
    s3.ok("c", &["restore", "x", "--to", s3.tmp.path().join("o1").to_str().unwrap()]);
    // Wreck the chunk data of every pack in the bucket (footers stay readable): only the
    // cache can still serve the chunks.
    for p in pack_files(&s3.bucket_dir()) {
        let mut b = fs::read(&p).unwrap();
        for i in (8..b.len() / 2).step_by(4096) {
            b[i] ^= 0xff;
        }
        fs::write(&p, b).unwrap();
    }
    let o2 = s3.tmp.path().join("o2");
    s3.ok("c", &["restore", "x", "--to", o2.to_str().unwrap()]);
    assert_same_tree(&src, &o2);
    // A machine without the cache sees the damage, and verify names the image.
    let err = s3.fails("d", &["restore", "x", "--to", s3.tmp.path().join("o3").to_str().unwrap()]);
    assert!(err.contains("corrupt chunk"), "{err}");
    let o = s3.cmd("d", &["verify", "--read-data"]).env("GSTORE_CACHE_BYTES", "0").output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("DAMAGED  x:latest"), "{}", String::from_utf8_lossy(&o.stdout));
}

/// Where machine `machine` keeps its range cache of the test bucket.
fn range_cache(s3: &S3, machine: &str) -> std::path::PathBuf {
    s3.tmp.path().join(machine).join("gstore/s3-gstore-test-images/ranges")
}

#[test]
fn the_range_cache_keeps_only_checked_ranges() {
    let s3 = S3::start();
    let src = s3.tmp.path().join("src");
    make_tree(&src, 6, 5_000_000);
    s3.ok("a", &["init"]);
    s3.ok("a", &["push", src.to_str().unwrap(), "--tag", "x"]);
    // Damage every pack in the bucket (footers stay readable), keeping the originals.
    let packs = pack_files(&s3.bucket_dir());
    let originals: Vec<Vec<u8>> = packs.iter().map(|p| fs::read(p).unwrap()).collect();
    for (p, b) in packs.iter().zip(&originals) {
        let mut b = b.clone();
        for i in (8..b.len() / 2).step_by(4096) {
            b[i] ^= 0xff;
        }
        fs::write(p, b).unwrap();
    }
    let restore = |name: &str, cache_bytes: Option<&str>| {
        let mut c = s3.cmd("c", &["restore", "x", "--to", s3.tmp.path().join(name).to_str().unwrap()]);
        if let Some(n) = cache_bytes {
            c.env("GSTORE_CACHE_BYTES", n);
        }
        c.output().unwrap()
    };
    let o = restore("o1", None);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("corrupt chunk"), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(files_below(&range_cache(&s3, "c")).is_empty(), "ranges that failed their check were cached");
    // The packs are repaired: every restore works again, with and without the cache.
    for (p, b) in packs.iter().zip(&originals) {
        fs::write(p, b).unwrap();
    }
    s3.ok("c", &["verify", "--read-data"]);
    let o = restore("o2", Some("0"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_same_tree(&src, &s3.tmp.path().join("o2"));
    assert!(files_below(&range_cache(&s3, "c")).is_empty(), "GSTORE_CACHE_BYTES=0 cached ranges");
    let o = restore("o3", None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_same_tree(&src, &s3.tmp.path().join("o3"));
    // A cached range whose chunks do not check out (cached by an older gstore) is dropped and
    // read again from the bucket.
    let entries = files_below(&range_cache(&s3, "c"));
    assert!(!entries.is_empty(), "checked ranges are cached");
    let damaged: Vec<std::path::PathBuf> = entries
        .iter()
        .map(|e| {
            let mut b = fs::read(e).unwrap();
            let mid = b.len() / 2;
            b[mid] ^= 0xff;
            // Named after its new content, so the cache's own hash check passes.
            let name = e.file_name().unwrap().to_str().unwrap();
            let (prefix, _) = name.rsplit_once('-').unwrap();
            let hash = &gstore_store::ObjectId::of(&b).to_hex()[..16];
            let renamed = e.with_file_name(format!("{prefix}-{hash}"));
            fs::remove_file(e).unwrap();
            fs::write(&renamed, b).unwrap();
            renamed
        })
        .collect();
    let o = restore("o4", None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_same_tree(&src, &s3.tmp.path().join("o4"));
    assert!(damaged.iter().all(|e| !e.exists()), "a damaged cache entry was kept");
    assert_eq!(files_below(&range_cache(&s3, "c")), entries, "the ranges read again are cached");
}

#[test]
fn server_failures_give_clear_errors_and_lose_nothing() {
    let mut s3 = S3::start();
    let src = s3.tmp.path().join("src");
    make_tree(&src, 4, 30_000_000);
    // Small packs, so an interrupted push has uploaded some before the server goes away.
    s3.ok("a", &["init", "--pack-size", "4194304"]);
    s3.ok("a", &["push", src.to_str().unwrap(), "--tag", "x"]);
    // Wrong credentials.
    let o = s3.cmd_as("a", "wrong-secret-0000000000", &["ls"]).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("access denied"), "{}", String::from_utf8_lossy(&o.stderr));
    // The server goes away in the middle of a restore: a clear error once the retries give up
    // (after 2 s here rather than the default minute); the rerun resumes. The restore and the
    // push below go through a 20 MB/s link, and the server is stopped once they are under way.
    let proxy = slow_link(&s3);
    let endpoint = format!("http://{}", proxy.addr());
    let dest = s3.tmp.path().join("out");
    let child = s3
        .cmd("m", &["-q", "restore", "x", "--to", dest.to_str().unwrap(), "--memory-budget", "1"])
        .env("AWS_ENDPOINT", &endpoint)
        .env("GSTORE_RETRY_TIMEOUT", "2s")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The image is ~38 MiB: stop once 8 MB of it came down.
    stop_when_moved(&mut s3, proxy, |s| s.bytes_down, 8_000_000);
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "the restore outran the server's stop");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the S3 endpoint"), "{err}");
    assert!(!dest.exists());
    let err = s3.fails("m", &["ls"]);
    assert!(err.contains("cannot reach the S3 endpoint"), "{err}");
    s3.resume();
    s3.ok("m", &["restore", "x", "--to", dest.to_str().unwrap()]);
    assert_same_tree(&src, &dest);
    // The server goes away in the middle of a push: the store still verifies, the rerun lands.
    let src2 = s3.tmp.path().join("src2");
    make_tree(&src2, 5, 120_000_000);
    let proxy = slow_link(&s3);
    let endpoint = format!("http://{}", proxy.addr());
    let child = s3
        .cmd("a", &["-q", "push", src2.to_str().unwrap(), "--tag", "y"])
        .env("AWS_ENDPOINT", &endpoint)
        .env("GSTORE_RETRY_TIMEOUT", "2s")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // ~48 MiB of new 4 MiB packs go up, 4 at a time: after 24 MB at least four have landed.
    stop_when_moved(&mut s3, proxy, |s| s.bytes_up, 24_000_000);
    let out = child.wait_with_output().unwrap();
    s3.resume();
    assert!(!out.status.success(), "the push outran the server's stop");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the S3 endpoint"), "{err}");
    // The rerun does not upload again what reached the bucket before the failure.
    let r: serde_json::Value =
        serde_json::from_str(&s3.ok("a", &["--json", "push", src2.to_str().unwrap(), "--tag", "y"])).unwrap();
    let (new, all) = (r["new_chunks"].as_u64().unwrap(), r["chunks"].as_u64().unwrap());
    assert!(new < all, "the rerun uploaded all {all} chunks again");
    s3.ok("b", &["verify", "--read-data"]);
    let o = s3.tmp.path().join("out-y");
    s3.ok("b", &["restore", "y", "--to", o.to_str().unwrap()]);
    assert_same_tree(&src2, &o);
}

#[test]
fn racing_tag_updates_conflict_instead_of_losing_one() {
    use gstore_store::format::tag::{SetTime, TagRecord};
    use gstore_store::{ObjectId, Store, StoreError, StoreLocation, TagRef};
    let s3 = S3::start();
    s3.ok("a", &["init"]);
    let ids: Vec<ObjectId> = (0..3)
        .map(|i| {
            let f = s3.tmp.path().join(format!("f{i}"));
            fs::write(&f, format!("image {i}")).unwrap();
            let out: serde_json::Value = serde_json::from_str(
                &s3.ok("a", &["--json", "push", f.to_str().unwrap(), "--tag", &format!("img{i}")]),
            )
            .unwrap();
            ObjectId::from_hex(out["manifest"].as_str().unwrap()).unwrap()
        })
        .collect();
    s3.ok("a", &["tag", "img0", "shared"]);
    s3.use_in_process("lib");
    let loc = StoreLocation::parse(&s3.url).unwrap();
    let (a, b) = (Store::open(&loc).unwrap(), Store::open(&loc).unwrap());
    let tag = TagRef::parse("shared").unwrap();
    let at = |unix| SetTime { unix, nanos: 0 };
    // Both machines read the tag, then both try to move it.
    let (rec_a, ver_a) = a.get_tag_versioned(&tag).unwrap().unwrap();
    let (rec_b, ver_b) = b.get_tag_versioned(&tag).unwrap().unwrap();
    b.put_tag(&TagRecord::new(&tag, ids[1], at(2), Some(rec_b)), Some(&ver_b)).unwrap();
    let err = a.put_tag(&TagRecord::new(&tag, ids[2], at(3), Some(rec_a)), Some(&ver_a)).unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    assert!(err.to_string().contains("changed by another writer"), "{err}");
    // The winner's value stands, with the first value in its history.
    let now = a.get_tag(&tag).unwrap().unwrap();
    assert_eq!(now.manifest, ids[1].to_hex());
    assert_eq!(now.history[0].manifest, ids[0].to_hex());
    // Creating a tag that someone else created first is a conflict too.
    let fresh = TagRef::parse("fresh").unwrap();
    a.put_tag(&TagRecord::new(&fresh, ids[0], at(1), None), None).unwrap();
    assert!(matches!(b.put_tag(&TagRecord::new(&fresh, ids[1], at(1), None), None), Err(StoreError::Conflict(_))));
}

#[test]
fn two_machines_pushing_different_images_at_once_both_land() {
    let s3 = S3::start();
    s3.ok("a", &["init"]);
    let (src_a, src_b) = (s3.tmp.path().join("src-a"), s3.tmp.path().join("src-b"));
    make_tree(&src_a, 11, 20_000_000);
    make_tree(&src_b, 12, 20_000_000);
    let push = |m: &str, src: &std::path::Path, tag: &str| {
        s3.cmd(m, &["--json", "push", src.to_str().unwrap(), "--tag", tag])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Different images from two machines at once: both land.
    let (pa, pb) = (push("a", &src_a, "from-a"), push("b", &src_b, "from-b"));
    for o in [pa.wait_with_output().unwrap(), pb.wait_with_output().unwrap()] {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let ls: serde_json::Value = serde_json::from_str(&s3.ok("c", &["--json", "ls"])).unwrap();
    let tags: Vec<&str> = ls.as_array().unwrap().iter().map(|t| t["tag"].as_str().unwrap()).collect();
    assert_eq!(tags, ["from-a:latest", "from-b:latest"]);
    for (tag, src) in [("from-a", &src_a), ("from-b", &src_b)] {
        let out = s3.tmp.path().join(format!("out-{tag}"));
        s3.ok("c", &["restore", tag, "--to", out.to_str().unwrap()]);
        assert_same_tree(src, &out);
    }
}

#[test]
fn credentials_from_a_config_file() {
    let s3 = S3::start();
    s3.ok("a", &["init"]);
    let cfg = s3.tmp.path().join("s3.env");
    fs::write(&cfg, format!("# gstore S3 settings\nAWS_ACCESS_KEY_ID={S3_KEY}\nAWS_SECRET_ACCESS_KEY={S3_SECRET}\n"))
        .unwrap();
    let o = s3
        .cmd("a", &["ls"])
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env("GSTORE_S3_CONFIG", &cfg)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Without the file, the same command has no credentials.
    let o = s3
        .cmd("a", &["ls"])
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env("GSTORE_S3_CONFIG", "/nonexistent")
        .output()
        .unwrap();
    assert!(!o.status.success());
}

#[test]
fn packs_larger_than_the_multipart_threshold_upload_in_parts() {
    let s3 = S3::start();
    s3.ok("a", &["init", "--pack-size", "134217728"]);
    let src = s3.tmp.path().join("big");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("weights.bin"), random_bytes(80_000_000, 21)).unwrap();
    let r: serde_json::Value =
        serde_json::from_str(&s3.ok("a", &["--json", "push", src.to_str().unwrap(), "--tag", "big"])).unwrap();
    assert_eq!(r["packs"], 1);
    let packs = pack_files(&s3.bucket_dir());
    assert!(fs::metadata(&packs[0]).unwrap().len() > 64 << 20);
    let out = s3.tmp.path().join("out");
    s3.ok("b", &["restore", "big", "--to", out.to_str().unwrap()]);
    assert_same_tree(&src, &out);
}

/// object_store's S3 client retries a 503 too: a create-only write whose answer was lost after
/// it landed meets its own object on the retry, and the push's lease and gc's lock count that
/// as their success.
#[test]
fn a_retried_create_that_had_landed_is_its_writers_own() {
    let s3 = S3::start();
    let src = s3.tmp.path().join("src");
    fs::create_dir_all(&src).unwrap();
    write_mixed_file(&src.join("data"), 300_000, 10);
    s3.ok("a", &["init"]);
    for (patterns, args) in [
        (&["put /gstore-test/images/leases/", "if-none-match"][..], vec!["push", src.to_str().unwrap(), "--tag", "x"]),
        (&["put /gstore-test/images/gc/lock", "if-none-match"][..], vec!["gc"]),
    ] {
        let patterns: &'static [&'static str] = Box::leak(patterns.to_vec().into_boxed_slice());
        let proxy = LostAnswers::start(s3.port, patterns, 1);
        let o = s3.cmd("a", &args).env("AWS_ENDPOINT", format!("http://127.0.0.1:{}", proxy.port)).output().unwrap();
        assert_eq!(proxy.lost.load(std::sync::atomic::Ordering::SeqCst), 2, "one answer lost, then the retry's");
        assert!(o.status.success(), "gstore {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
    s3.ok("a", &["show", "x"]);
}

#[test]
fn a_plain_http_endpoint_without_allow_http_is_a_setting_to_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let o = gstore_in(tmp.path())
        .args(["--store", "s3://bucket/x", "ls"])
        .env_remove("GSTORE_STORE")
        .env_remove("AWS_ALLOW_HTTP")
        .env("AWS_ENDPOINT", "http://127.0.0.1:9")
        .env("AWS_ACCESS_KEY_ID", "k")
        .env("AWS_SECRET_ACCESS_KEY", "s")
        .env("GSTORE_S3_CONFIG", tmp.path().join("none"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    // A usage error (2), not an outage retried and given up on (6).
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("AWS_ALLOW_HTTP=true") && !err.contains("retries"), "{err}");
}
