//! The HTTP chunk server through the real binary: round trips through `gstore serve`,
//! uploads that fail verification, path tricks, and tokens with scopes.

use gstore_tests::*;
use std::fs;

const READ: &str = "readtoken-0123456789";
const WRITE: &str = "writetoken-0123456789";
const TEAM: &str = "teamtoken-0123456789";

fn token_file(env: &Env) -> std::path::PathBuf {
    let p = env.path("tokens");
    fs::write(&p, format!("# scopes\n{READ} read\n{WRITE} write\n{TEAM} write team-\n")).unwrap();
    p
}

#[test]
fn push_and_restore_through_the_server() {
    let env = Env::new(&[]);
    let tokens = token_file(&env);
    let server = Server::start(&env.store, &["--tokens", tokens.to_str().unwrap()]);
    let src = env.path("src");
    make_tree(&src, 1, 6_000_000);
    let ok = |machine: &str, token: &str, args: &[&str]| {
        let o = server.cmd(machine, token, args).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    ok("a", WRITE, &["push", src.to_str().unwrap(), "--tag", "app:v1"]);
    // Another machine restores and verifies through the server with a read token.
    let out = env.path("out");
    ok("b", READ, &["restore", "app:v1", "--to", out.to_str().unwrap()]);
    assert_same_tree(&src, &out);
    ok("b", READ, &["verify", "--read-data"]);
    assert!(ok("b", READ, &["show", "app:v1"]).contains("sub/deeper/tiny"));
    // A second server on the same port fails at once and never says it is serving.
    let busy = env.run(&["serve", "--listen", &format!("127.0.0.1:{}", server.port)]);
    let err = String::from_utf8_lossy(&busy.stderr);
    assert!(!busy.status.success(), "{err}");
    assert!(err.contains("cannot listen on") && !err.contains("serving"), "{err}");
    // What the server stored is a normal store: it verifies directly too.
    drop(server);
    env.ok(&["verify", "--read-data"]);
}

#[test]
fn tokens_and_scopes() {
    let env = Env::new(&[]);
    let tokens = token_file(&env);
    let server = Server::start(&env.store, &["--tokens", tokens.to_str().unwrap()]);
    let f = env.path("f");
    fs::write(&f, b"data").unwrap();
    let run =
        |token: &str, tag: &str| server.cmd("m", token, &["push", f.to_str().unwrap(), "--tag", tag]).output().unwrap();
    let no_token = run("", "x");
    assert!(
        String::from_utf8_lossy(&no_token.stderr).contains("missing or unknown token"),
        "{}",
        String::from_utf8_lossy(&no_token.stderr)
    );
    assert!(!run("not-a-real-token-000", "x").status.success());
    let read_only = run(READ, "x");
    assert!(
        String::from_utf8_lossy(&read_only.stderr).contains("access denied"),
        "{}",
        String::from_utf8_lossy(&read_only.stderr)
    );
    // A refused token is a usage error (exit 2, docs/CLI.md), like any other refusal.
    assert_eq!(read_only.status.code(), Some(2), "{}", String::from_utf8_lossy(&read_only.stderr));
    assert_eq!(no_token.status.code(), Some(2));
    assert!(!run(TEAM, "other-model").status.success(), "a namespaced token wrote outside its namespace");
    assert!(run(TEAM, "team-model").status.success());
    // Raw status codes.
    assert_eq!(server.curl("GET", "/v1/list?prefix=tags", None, &[], None).0, 401);
    assert_eq!(server.curl("GET", "/v1/list?prefix=tags", Some("wrong-token-000000000"), &[], None).0, 401);
    assert_eq!(server.curl("GET", "/v1/list?prefix=tags", Some(READ), &[], None).0, 200);
    assert_eq!(server.curl("DELETE", "/v1/o/tags/team-model/latest.tag", Some(READ), &[], None).0, 403);
    assert_eq!(server.curl("GET", "/v1/health", None, &[], None).0, 200);
}

#[test]
fn bad_uploads_are_refused_and_nothing_is_stored() {
    // A pack to play with, from a local push.
    let env = Env::new(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("data"), random_bytes(3_000_000, 5)).unwrap();
    env.ok(&["push", src.to_str().unwrap(), "--tag", "x"]);
    let pack = env.packs().pop().unwrap();
    let bytes = fs::read(&pack).unwrap();

    let target = Env::new(&[]);
    let server = Server::start(&target.store, &["--max-body", "2000000"]);
    let put = |name: &str, data: &[u8], key: &str| {
        let p = env.path(name);
        fs::write(&p, data).unwrap();
        server.curl("PUT", &format!("/v1/o/{key}"), None, &[], Some(&p))
    };
    let key_of = |data: &[u8]| {
        let h = blake3_hex(data);
        format!("packs/{}/{h}.pack", &h[..2])
    };
    // Too big for --max-body.
    assert_eq!(put("big", &bytes, &key_of(&bytes)).0, 413);
    // A small valid pack is accepted under its name (the hash of its header and tail) and
    // under the hash of all its bytes (how stores made before name packs); damaged ones are not.
    let (small_key, small) = small_pack();
    let mut wrong_hash = small.clone();
    // A byte of the first chunk (after the 8-byte magic and the 16-byte salt).
    wrong_hash[30] ^= 1;
    // Its name does not cover the chunks' bytes: their ids do, checked by decoding them.
    let (code, body) = put("wrong-named", &wrong_hash, &small_key);
    assert_eq!(code, 422, "{body}");
    assert!(body.contains("mismatch") || body.contains("zstd"), "{body}");
    assert_eq!(put("ok", &small, &small_key).0, 201);
    assert_eq!(put("ok-whole", &small, &key_of(&small)).0, 201);
    let truncated = &small[..small.len() - 10];
    let (code, body) = put("trunc", truncated, &key_of(truncated));
    assert_eq!(code, 422, "{body}");
    let (code, body) = put("wrong", &wrong_hash, &key_of(&small));
    assert_eq!(code, 422, "{body}");
    assert!(body.contains("is not named by its content"), "{body}");
    let (code, body) = put("flip", &wrong_hash, &key_of(&wrong_hash));
    assert_eq!(code, 422);
    assert!(body.contains("mismatch") || body.contains("zstd"), "{body}");
    let mut footer = small.clone();
    let n = footer.len();
    footer[n - 70] ^= 1;
    let (code, body) = put("footer", &footer, &key_of(&footer));
    assert_eq!(code, 422);
    assert!(body.contains("footer"), "{body}");
    // Manifests and tags are checked too.
    assert_eq!(put("m", b"GSMANIF1garbage", &format!("manifests/00/{}.manifest", "0".repeat(64))).0, 422);
    assert_eq!(put("t", b"{not json", "tags/app/v1.tag").0, 422);
    // Path tricks never reach the store.
    for key in [
        "tags/../config.json",
        "tags/a%00b/v.tag",
        &format!("tags/{}/v.tag", "a".repeat(500)),
        "index/LOCK",
        "packs/../../etc/passwd",
    ] {
        let (code, _) = put("trick", b"x", key);
        assert!(code == 400 || code == 404, "{key}: {code}");
    }
    // Only the good pack was stored, under its two names.
    assert_eq!(target.packs().len(), 2);
    assert!(!target.store.join("tags").exists() || fs::read_dir(target.store.join("tags")).unwrap().next().is_none());
}

#[test]
fn tag_updates_are_compare_and_swap_and_exposure_is_refused() {
    let env = Env::new(&[]);
    let server = Server::start(&env.store, &[]);
    let f = env.path("f");
    fs::write(&f, b"one").unwrap();
    let o = server.cmd("a", "", &["push", f.to_str().unwrap(), "--tag", "t"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // If-None-Match on an existing tag, and If-Match with a stale ETag: 412.
    let rec = env.path("rec");
    fs::write(&rec, fs::read(env.store.join("tags/t/latest.tag")).unwrap()).unwrap();
    let (code, body) = server.curl("PUT", "/v1/o/tags/t/latest.tag", None, &["If-None-Match: *"], Some(&rec));
    assert_eq!(code, 412, "{body}");
    let (code, body) = server.curl("PUT", "/v1/o/tags/t/latest.tag", None, &["If-Match: \"stale\""], Some(&rec));
    assert_eq!(code, 412, "{body}");
    // A client moving the tag sends the right ETag and succeeds; the old value is in history.
    fs::write(&f, b"two").unwrap();
    let o = server.cmd("a", "", &["push", f.to_str().unwrap(), "--tag", "t"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rec: serde_json::Value =
        serde_json::from_slice(&fs::read(env.store.join("tags/t/latest.tag")).unwrap()).unwrap();
    assert_eq!(rec["history"].as_array().unwrap().len(), 1);
    // Binding a non-loopback address without tokens is refused.
    let o = std::process::Command::new(gstore_bin())
        .arg("--store")
        .arg(&env.store)
        .args(["serve", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("without authentication"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A pack of a few small chunks (pushed to a throwaway store).
/// A small pack of a push, with its key (`packs/<h[0..2]>/<h>.pack`).
fn small_pack() -> (String, Vec<u8>) {
    let e = Env::new(&[]);
    let src = e.path("s");
    fs::create_dir_all(&src).unwrap();
    write_mixed_file(&src.join("d"), 300_000, 9);
    e.ok(&["push", src.to_str().unwrap(), "--tag", "s"]);
    let path = e.packs().pop().unwrap();
    let key = path.strip_prefix(&e.store).unwrap().to_str().unwrap().to_string();
    (key, fs::read(path).unwrap())
}

fn blake3_hex(data: &[u8]) -> String {
    gstore_store::ObjectId::of(data).to_hex()
}

#[test]
fn shutdown_finishes_requests_in_flight() {
    let env = Env::new(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("data"), random_bytes(60_000_000, 8)).unwrap();
    env.ok(&["push", src.to_str().unwrap(), "--tag", "x"]);
    let pack = env.packs().into_iter().max_by_key(|p| fs::metadata(p).unwrap().len()).unwrap();
    let key = pack.strip_prefix(&env.store).unwrap().to_str().unwrap().to_string();
    let mut server = Server::start(&env.store, &[]);
    // A slow download (20 MB/s for ~48 MB: more than socket buffers hold) is in flight when
    // the server is told to stop.
    let out = env.path("download");
    let started = std::time::Instant::now();
    let curl = std::process::Command::new("curl")
        .args(["-s", "--limit-rate", "20M", "-o"])
        .arg(&out)
        .arg(format!("{}/v1/o/{key}", server.url()))
        .spawn()
        .unwrap();
    // Stopped once the download is under way (a megabyte of it written), however slow the start.
    let t = std::time::Instant::now();
    while fs::metadata(&out).map_or(0, |m| m.len()) < 1_000_000 {
        assert!(t.elapsed() < std::time::Duration::from_secs(60), "the download never started");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let status = server.terminate();
    assert!(status.success(), "server exited with {status}");
    assert!(curl.wait_with_output().unwrap().status.success());
    assert_eq!(fs::read(&out).unwrap(), fs::read(&pack).unwrap(), "the download in flight was cut short");
    assert!(started.elapsed() > std::time::Duration::from_secs(1), "the download was not slow enough to be in flight");
}

#[test]
fn chunks_by_id_and_the_missing_query() {
    let env = Env::new(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    write_mixed_file(&src.join("data"), 2_000_000, 4);
    let server = Server::start(&env.store, &[]);
    // Pushed after the server started: it learns of the new pack on the first miss.
    env.ok(&["push", src.to_str().unwrap(), "--tag", "x"]);
    let show = env.json(&["show", "x"]);
    assert!(show["chunks"].as_u64().unwrap() > 2);
    let m = env.json(&["ls"])[0]["manifest"].as_str().unwrap().to_string();
    let bytes = fs::read(env.store.join(format!("manifests/{}/{m}.manifest", &m[..2]))).unwrap();
    let manifest =
        gstore_store::format::manifest::Manifest::decode(&bytes, &gstore_store::ObjectId::from_hex(&m).unwrap())
            .unwrap();
    let chunk = manifest.chunks.iter().find(|c| !c.zero).unwrap();
    let out = env.path("chunk");
    let (code, _) = server.curl("GET", &format!("/v1/chunks/{}", chunk.id.to_hex()), None, &[], None);
    assert_eq!(code, 200);
    let o = std::process::Command::new("curl")
        .args(["-s", "-o"])
        .arg(&out)
        .arg(format!("{}/v1/chunks/{}", server.url(), chunk.id.to_hex()))
        .status()
        .unwrap();
    assert!(o.success());
    let got = fs::read(&out).unwrap();
    assert_eq!(got.len(), chunk.len as usize);
    assert_eq!(gstore_store::ObjectId::of(&got), chunk.id, "the chunk served is not the chunk asked for");
    let (code, stored) = server.curl("GET", &format!("/v1/chunks/{}?stored=true", chunk.id.to_hex()), None, &[], None);
    assert_eq!(code, 200);
    assert!(!stored.is_empty());
    let unknown = gstore_store::ObjectId::of(b"no such chunk").to_hex();
    assert_eq!(server.curl("GET", &format!("/v1/chunks/{unknown}"), None, &[], None).0, 404);
    assert_eq!(server.curl("GET", "/v1/chunks/zz", None, &[], None).0, 400);
    let q = env.path("q.json");
    fs::write(&q, serde_json::to_vec(&[chunk.id.to_hex(), unknown.clone()]).unwrap()).unwrap();
    let (code, body) = server.curl("POST", "/v1/chunks/missing", None, &["Content-Type: application/json"], Some(&q));
    assert_eq!(code, 200, "{body}");
    assert_eq!(serde_json::from_str::<Vec<String>>(&body).unwrap(), vec![unknown]);
    fs::write(&q, b"[\"nothex\"]").unwrap();
    assert_eq!(server.curl("POST", "/v1/chunks/missing", None, &[], Some(&q)).0, 400);
    fs::write(&q, b"{oops").unwrap();
    assert_eq!(server.curl("POST", "/v1/chunks/missing", None, &[], Some(&q)).0, 400);
    // Once gc has tombstoned the only pack holding a chunk, a push must not rely on that pack
    // (docs/GC.md): the query calls the chunk missing, though it is still served until gc
    // deletes the pack.
    // A gc run deletes what its own first pass tombstoned; the state between its passes (a
    // tombstone, the pack still there) is made here the way that pass makes it.
    env.ok(&["rm", "x"]);
    for pack in env.packs() {
        let key = pack.strip_prefix(&env.store).unwrap().to_string_lossy().into_owned();
        let tombstone = env.store.join("tombstones").join(&key);
        fs::create_dir_all(tombstone.parent().unwrap()).unwrap();
        fs::write(&tombstone, format!("{{\"format\": 1, \"object\": \"{key}\"}}")).unwrap();
    }
    assert!(files_below(&env.store.join("tombstones")).iter().any(|p| p.to_string_lossy().ends_with(".pack")));
    fs::write(&q, serde_json::to_vec(&[chunk.id.to_hex()]).unwrap()).unwrap();
    let (code, body) = server.curl("POST", "/v1/chunks/missing", None, &["Content-Type: application/json"], Some(&q));
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Vec<String>>(&body).unwrap(),
        vec![chunk.id.to_hex()],
        "a tombstoned pack offered for dedup"
    );
    assert_eq!(server.curl("GET", &format!("/v1/chunks/{}", chunk.id.to_hex()), None, &[], None).0, 200);
    // Pushed again, the chunk lands in a new pack, and the query finds it there.
    env.ok(&["push", src.to_str().unwrap(), "--tag", "x"]);
    let (code, body) = server.curl("POST", "/v1/chunks/missing", None, &["Content-Type: application/json"], Some(&q));
    assert_eq!((code, serde_json::from_str::<Vec<String>>(&body).unwrap()), (200, vec![]), "{body}");
}

/// Two machines pushing the same tag at once through one server (in front of a local store,
/// whose create-only writes are atomic links and whose If-Match the server checks under a
/// lock): one wins and the other gets a conflict, or both land in order; no value is lost.
/// (s3s-fs, the S3 server of the tests, checks conditions and writes non-atomically, so the
/// same race against it can lose an update; see docs/BENCHMARKS.md. The stale-ETag race is
/// tested deterministically against it in tests/s3.rs.)
#[test]
fn two_machines_racing_on_one_tag_lose_nothing() {
    let env = Env::new(&[]);
    let server = Server::start(&env.store, &[]);
    let (a, b) = (env.path("a.bin"), env.path("b.bin"));
    fs::write(&a, random_bytes(3_000_000, 1)).unwrap();
    fs::write(&b, random_bytes(3_000_000, 2)).unwrap();
    for round in 0..5 {
        let tag = format!("shared{round}");
        let push = |m: &str, f: &std::path::Path| {
            server
                .cmd(m, "", &["--json", "push", f.to_str().unwrap(), "--tag", &tag])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (pa, pb) = (push("a", &a), push("b", &b));
        let (oa, ob) = (pa.wait_with_output().unwrap(), pb.wait_with_output().unwrap());
        let mut landed = Vec::new();
        for o in [&oa, &ob] {
            if o.status.success() {
                let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
                landed.push(r["manifest"].as_str().unwrap().to_string());
            } else {
                let err = String::from_utf8_lossy(&o.stderr);
                assert!(err.contains("changed by another writer"), "{err}");
            }
        }
        assert!(!landed.is_empty());
        let rec = fs::read_to_string(env.store.join(format!("tags/{tag}/latest.tag"))).unwrap();
        for m in &landed {
            assert!(
                rec.contains(m.as_str()),
                "manifest {m} was pushed but is neither the tag's value nor in its history: {rec}"
            );
        }
    }
}

#[test]
fn https_with_a_trusted_certificate() {
    let env = Env::new(&[]);
    let (cert, key) = self_signed_cert(&env);
    let server = Server::start(&env.store, &["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()]);
    let url = format!("https://127.0.0.1:{}", server.port);
    let f = env.path("f");
    fs::write(&f, random_bytes(500_000, 3)).unwrap();
    let gstore = |args: &[&str], ca: Option<&std::path::Path>| {
        let mut c = std::process::Command::new(gstore_bin());
        c.arg("--store").arg(&url).args(args).env("XDG_CACHE_HOME", env.path("cache")).env_remove("GSTORE_CA_CERT");
        if let Some(ca) = ca {
            c.env("GSTORE_CA_CERT", ca);
        }
        c.output().unwrap()
    };
    // Without trusting the certificate the client refuses to talk.
    let o = gstore(&["ls"], None);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("certificate"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = gstore(&["push", f.to_str().unwrap(), "--tag", "secure"], Some(&cert));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = env.path("out");
    let o = gstore(&["restore", "secure", "--to", out.to_str().unwrap()], Some(&cert));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(fs::read(out.join("f")).unwrap(), fs::read(&f).unwrap());
}

/// A create-only write whose answer was lost (the server wrote it, the client saw a 503) is
/// retried and meets its own object: the lease of a push and the lock of a gc must count that
/// as their success, not as another writer's.
#[test]
fn a_retried_create_that_had_landed_is_its_writers_own() {
    let env = Env::new(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    write_mixed_file(&src.join("data"), 300_000, 9);
    let server = Server::start(&env.store, &[]);
    for (patterns, args) in [
        (&["put /v1/o/leases/", "if-none-match"][..], vec!["push", src.to_str().unwrap(), "--tag", "x"]),
        (&["put /v1/o/gc/lock", "if-none-match"][..], vec!["gc"]),
        // A tag made (If-None-Match), then moved (If-Match), each answer lost once.
        (&["put /v1/o/tags/y/", "if-none-match"][..], vec!["tag", "x", "y"]),
        (&["put /v1/o/tags/y/", "if-match"][..], vec!["tag", "x", "y"]),
    ] {
        let patterns: &'static [&'static str] = Box::leak(patterns.to_vec().into_boxed_slice());
        let proxy = LostAnswers::start(server.port, patterns, 1);
        let o = std::process::Command::new(gstore_bin())
            .arg("--store")
            .arg(format!("http://127.0.0.1:{}", proxy.port))
            .args(&args)
            .env("XDG_CACHE_HOME", env.path("cache"))
            .output()
            .unwrap();
        assert_eq!(proxy.lost.load(std::sync::atomic::Ordering::SeqCst), 2, "one answer lost, then the retry's");
        assert!(o.status.success(), "gstore {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
    env.ok(&["show", "x"]);
}

/// The value of counter `gstore_tier_reads_total{result="RESULT"}` in a metrics page.
fn tier_reads(metrics: &str, result: &str) -> u64 {
    let prefix = format!("gstore_tier_reads_total{{result=\"{result}\"}} ");
    metrics.lines().find_map(|l| l.strip_prefix(&prefix)).map_or(0, |v| v.trim().parse().unwrap())
}

#[test]
fn a_caching_tier_reads_each_range_once_and_never_keeps_damage() {
    let env = Env::new(&[]);
    let tokens = token_file(&env);
    let src = env.path("src");
    make_tree(&src, 3, 6_000_000);
    env.ok(&["push", src.to_str().unwrap(), "--tag", "app:v1"]);
    let tier = env.path("tier");
    let args = ["--tokens", tokens.to_str().unwrap(), "--cache", tier.to_str().unwrap(), "--cache-bytes", "1GiB"];
    let server = Server::start(&env.store, &args);
    // Four machines restore the image at once through the tier.
    let restore = |server: &Server, machine: &str| {
        let out = env.path(&format!("out-{machine}"));
        let child = server.cmd(machine, READ, &["-q", "restore", "app:v1", "--to", out.to_str().unwrap()]).spawn();
        (out, child.unwrap())
    };
    let running: Vec<_> = ["m0", "m1", "m2", "m3"].into_iter().map(|m| restore(&server, m)).collect();
    for (out, mut child) in running {
        assert!(child.wait().unwrap().success(), "a restore through the tier failed");
        assert_same_tree(&src, &out);
    }
    let (status, metrics) = server.curl("GET", "/metrics", Some(READ), &[], None);
    assert_eq!(status, 200, "{metrics}");
    let (misses, served) = (tier_reads(&metrics, "miss"), tier_reads(&metrics, "hit") + tier_reads(&metrics, "joined"));
    assert!(misses > 0, "nothing went through the tier: {metrics}");
    // Each range was read from the store once; the three other machines got it from the tier.
    assert_eq!(served, 3 * misses, "{metrics}");
    assert!(tier.read_dir().unwrap().count() as u64 >= misses, "the tier kept what it read");

    // A damaged pack in the store: the tier checks what it reads and keeps none of it, the
    // restore fails on the damage (never a wrong file), and once the pack is whole again a
    // restore through the tier succeeds.
    drop(server);
    fs::remove_dir_all(&tier).unwrap();
    let pack = env.files_under("packs").into_iter().max_by_key(|p| fs::metadata(p).unwrap().len()).unwrap();
    let whole = fs::read(&pack).unwrap();
    let mut bad = whole.clone();
    bad[whole.len() / 3] ^= 0x40;
    fs::write(&pack, &bad).unwrap();
    let server = Server::start(&env.store, &args);
    let (out, mut child) = restore(&server, "m4");
    assert!(!child.wait().unwrap().success(), "a restore of a damaged pack succeeded");
    let (_, metrics) = server.curl("GET", "/metrics", Some(READ), &[], None);
    assert!(tier_reads(&metrics, "passed") > 0, "the damaged range was not passed through: {metrics}");
    fs::write(&pack, &whole).unwrap();
    // Every range kept (named PACK-START-END-HASH) is that range of its pack as it should be.
    let kept_ranges = || -> usize {
        let entries: Vec<_> = fs::read_dir(&tier).unwrap().flatten().collect();
        for e in &entries {
            let name = e.file_name().to_string_lossy().to_string();
            let parts: Vec<&str> = name.split('-').collect();
            let file = env.packs().into_iter().find(|p| p.file_stem().unwrap().to_string_lossy() == parts[0]).unwrap();
            let (start, end): (usize, usize) = (parts[1].parse().unwrap(), parts[2].parse().unwrap());
            assert_eq!(fs::read(e.path()).unwrap(), fs::read(&file).unwrap()[start..end], "{name} was kept damaged");
        }
        entries.len()
    };
    let before = kept_ranges();
    let _ = fs::remove_dir_all(&out);
    let (out, mut child) = restore(&server, "m5");
    assert!(child.wait().unwrap().success(), "the restore after the repair failed");
    assert_same_tree(&src, &out);
    assert!(kept_ranges() > before, "the repaired ranges were not kept");
}

#[test]
fn restore_nodes_of_an_http_store_read_packs_through_a_tier() {
    let env = Env::new(&[]);
    let tokens = token_file(&env);
    let src = env.path("src");
    make_tree(&src, 4, 3_000_000);
    env.ok(&["push", src.to_str().unwrap(), "--tag", "app:v1"]);
    let origin = Server::start(&env.store, &["--tokens", tokens.to_str().unwrap()]);
    // A caching tier of the store behind the origin server (a server is never served again).
    let tier_cache = env.path("tier");
    let tier_args = ["--tokens", tokens.to_str().unwrap(), "--cache", tier_cache.to_str().unwrap()];
    let tier = Server::start(&env.store, &tier_args);
    let out = env.path("out");
    let node = origin.cmd("node", READ, &["-q", "restore", "app:v1", "--to", out.to_str().unwrap()]);
    let o = { node }.env("GSTORE_TIERS", tier.url()).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_same_tree(&src, &out);
    let (_, metrics) = tier.curl("GET", "/metrics", Some(READ), &[], None);
    assert!(tier_reads(&metrics, "miss") > 0, "the node's packs did not come through the tier: {metrics}");
}

/// A copy of `env`'s store (at `name` in its scratch directory) whose packs each list `absent`
/// in place of their first chunk, under a footer hash recomputed to match: footers that pass
/// their own check, but not their packs' names.
fn with_rewritten_footers(env: &Env, name: &str, absent: &gstore_store::ObjectId) -> std::path::PathBuf {
    let copy = env.path(name);
    assert!(std::process::Command::new("cp").arg("-r").arg(&env.store).arg(&copy).status().unwrap().success());
    for pack in pack_files(&copy.join("packs")) {
        let mut bytes = fs::read(&pack).unwrap();
        let trailer = bytes.len() - 56;
        let footer = u64::from_le_bytes(bytes[trailer..trailer + 8].try_into().unwrap()) as usize;
        bytes[footer..footer + 32].copy_from_slice(&absent.0);
        let hash = gstore_store::ObjectId::of(&bytes[footer..trailer]);
        bytes[trailer + 16..trailer + 48].copy_from_slice(&hash.0);
        fs::write(&pack, bytes).unwrap();
    }
    copy
}

#[test]
fn a_tier_rewriting_footer_entries_poisons_no_node() {
    for pack_ids in ["header_footer", "whole"] {
        let env = Env::new(&[]);
        if pack_ids == "whole" {
            // A store made before pack_ids: its packs are named by all their bytes.
            let path = env.store.join("config.json");
            let mut config: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
            config.as_object_mut().unwrap().remove("pack_ids");
            fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
        }
        let tokens = token_file(&env);
        let src = env.path("src");
        make_tree(&src, 5, 400_000);
        env.ok(&["push", src.to_str().unwrap(), "--tag", "app:v1"]);
        // A chunk the store does not hold: a file below chunk_min is one chunk.
        let new = env.path("new");
        fs::create_dir_all(&new).unwrap();
        let content = random_bytes(5000, 77);
        fs::write(new.join("f"), &content).unwrap();
        let absent = gstore_store::ObjectId::of(&content);
        let tokens_arg = ["--tokens", tokens.to_str().unwrap()];
        let origin = Server::start(&env.store, &tokens_arg);
        let tier = Server::start(&with_rewritten_footers(&env, "tier-store", &absent), &tokens_arg);
        let through = |tier: &Server, machine: &str, token: &str, args: &[&str]| {
            let o = origin.cmd(machine, token, args).env("GSTORE_TIERS", tier.url()).output().unwrap();
            let err = String::from_utf8(o.stderr).unwrap();
            assert!(o.status.success(), "{pack_ids}: {args:?} through the tier failed: {err}");
            err
        };
        // A node pushing that chunk through the tier: the footers it serves name the chunk in
        // the store's packs, and are refused (they are not what the packs' names cover), so
        // the push uploads it instead of deduplicating against bytes that are another chunk's.
        let pushed = through(&tier, "node", WRITE, &["push", new.to_str().unwrap(), "--tag", "new:v1"]);
        // The store holds the new chunk: a machine without a tier restores the new image.
        let out = env.path("out-b");
        let o = origin.cmd("b", READ, &["restore", "new:v1", "--to", out.to_str().unwrap()]).output().unwrap();
        assert!(o.status.success(), "{pack_ids}: {}", String::from_utf8_lossy(&o.stderr));
        assert_same_tree(&new, &out);
        // A node restoring through the tier indexes the chunks the packs really hold.
        let out = env.path("out-node");
        through(&tier, "other-node", READ, &["restore", "app:v1", "--to", out.to_str().unwrap()]);
        assert_same_tree(&src, &out);
        // A tier serving the store as it is is never blamed, whichever way its packs are named.
        let honest = Server::start(&env.store, &tokens_arg);
        let out = env.path("out-honest");
        let err = through(&honest, "third-node", READ, &["restore", "app:v1", "--to", out.to_str().unwrap()]);
        assert!(!err.contains("gstore: tier "), "{pack_ids}: an honest tier was blamed: {err}");
        assert_same_tree(&src, &out);
        // Verify reads every chunk of both images, from the store itself.
        drop((origin, tier, honest));
        let verify = env.json(&["verify", "--read-data"]);
        assert!(verify["images"].as_array().unwrap().iter().all(|i| i["ok"] == true), "{pack_ids}: {verify}");
        // The node said it went past the tier.
        assert!(pushed.contains("failed their check"), "{pack_ids}: the tier was not gone around: {pushed}");
    }
}
