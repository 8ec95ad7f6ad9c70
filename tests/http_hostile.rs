//! `gstore serve` against hostile clients (issue 11): requests without a valid token must cost
//! no more than their headers, connections that send headers slowly (or nothing) are closed,
//! `/metrics` needs a token, and a pack claiming a huge chunk is corrupt, not an allocation.

use gstore_store::codec::Codec;
use gstore_store::format::key::ObjectKey;
use gstore_store::format::pack::{PackBuilder, PackIds};
use gstore_store::ObjectId;
use gstore_tests::*;
use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const READ: &str = "readtoken-0123456789";
const ADMIN: &str = "admintoken-0123456789";

fn token_file(env: &Env) -> std::path::PathBuf {
    let p = env.path("tokens");
    fs::write(&p, format!("{READ} read\n{ADMIN} admin\n")).unwrap();
    p
}

/// Sends only the head of a request whose body is announced (`framing` header) but never sent,
/// and returns the status line the server answers with; panics if none comes within 10 s.
fn answer_to_head(port: u16, method: &str, path: &str, token: Option<&str>, framing: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let head = format!("{method} {path} HTTP/1.1\r\nHost: gstore\r\n{auth}{framing}\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        match s.read(&mut byte) {
            Ok(1) => line.push(byte[0]),
            Ok(_) => panic!("{method} {path} ({framing}): connection closed without an answer"),
            Err(e) => panic!("{method} {path} ({framing}): no answer while the body was not sent: {e}"),
        }
    }
    String::from_utf8_lossy(&line).trim_end().to_string()
}

#[test]
fn requests_without_a_valid_token_are_answered_from_their_headers() {
    let env = Env::new(&[]);
    let tokens = token_file(&env);
    // A handler waiting for the body would answer 408 only after a minute.
    let server = Server::start(&env.store, &["--tokens", tokens.to_str().unwrap(), "--timeout", "60"]);
    let id = ObjectId::of(b"anything");
    let pack = ObjectKey::Pack(id).to_string();
    let puts = [
        pack.clone(),
        ObjectKey::Manifest(id).to_string(),
        ObjectKey::Tag(gstore_store::TagRef::parse("app:v1").unwrap()).to_string(),
        ObjectKey::Config.to_string().to_string(),
        ObjectKey::Lease("0a".repeat(16)).to_string(),
        ObjectKey::Pack(id).tombstone().to_string(),
        ObjectKey::GcLock.to_string(),
    ];
    let mut requests: Vec<(&str, String)> = puts.iter().map(|k| ("PUT", format!("/v1/o/{k}"))).collect();
    requests.push(("POST", "/v1/chunks/missing".to_string()));
    // A 250 MB upload (under the default --max-body) announced by length, or a streamed one.
    for framing in ["Content-Length: 250000000", "Transfer-Encoding: chunked"] {
        for (method, path) in &requests {
            for token in [None, Some("wrong-token-0123456789")] {
                let status = answer_to_head(server.port, method, path, token, framing);
                assert!(status.starts_with("HTTP/1.1 401"), "{method} {path} ({framing}, {token:?}): {status}");
            }
            // A valid token without the scope is refused as early.
            if *method == "PUT" {
                let status = answer_to_head(server.port, method, path, Some(READ), framing);
                assert!(status.starts_with("HTTP/1.1 403"), "{method} {path} ({framing}, read token): {status}");
            }
        }
    }
    // The server is fine and still reads bodies of authorized requests.
    let q = env.path("q.json");
    fs::write(&q, b"[]").unwrap();
    assert_eq!(server.curl("POST", "/v1/chunks/missing", Some(READ), &[], Some(&q)), (200, "[]".to_string()));
}

#[test]
fn metrics_need_a_read_token() {
    let env = Env::new(&[]);
    let tokens = token_file(&env);
    let server = Server::start(&env.store, &["--tokens", tokens.to_str().unwrap()]);
    assert_eq!(server.curl("GET", "/metrics", None, &[], None).0, 401);
    assert_eq!(server.curl("GET", "/metrics", Some("wrong-token-0123456789"), &[], None).0, 401);
    let (code, body) = server.curl("GET", "/metrics", Some(READ), &[], None);
    assert_eq!(code, 200);
    assert!(body.contains("gstore_http_requests_total"), "{body}");
    // Health stays open, for load balancers.
    assert_eq!(server.curl("GET", "/v1/health", None, &[], None), (200, "ok".to_string()));
}

/// The 129-byte pack of issue 11: one zero chunk whose footer entry claims 4 GiB.
fn pack_claiming_4_gib() -> (ObjectId, Vec<u8>) {
    let chunk = ObjectId::of(b"not really 4 GiB of zeros");
    let mut b = PackBuilder::new(PackIds::Whole);
    b.push(chunk, Codec::Zero, &[], u32::MAX);
    let p = b.finish();
    assert_eq!(p.size(), 129);
    (chunk, p.pieces.iter().flat_map(|b| b.iter().copied()).collect())
}

#[test]
fn a_pack_claiming_a_4_gib_chunk_is_corrupt() {
    let env = Env::new(&[]);
    let (chunk, bytes) = pack_claiming_4_gib();
    let id = ObjectId::of(&bytes);
    let key = ObjectKey::Pack(id).to_string();
    let server = Server::start(&env.store, &["--timeout", "60"]);
    // An upload is refused before anything is allocated for the chunk.
    let p = env.path("p");
    fs::write(&p, &bytes).unwrap();
    let (code, body) = server.curl("PUT", &format!("/v1/o/{key}"), None, &[], Some(&p));
    assert_eq!(code, 422, "{body}");
    assert!(body.contains(&format!("corrupt pack {}", id.to_hex())), "{body}");
    assert!(body.contains("plain length 4294967295 exceeds the store's chunk max 262144"), "{body}");
    assert!(env.packs().is_empty());
    // Put into the store behind the server's back, its chunk is never served ...
    let path = env.store.join(&key);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, &bytes).unwrap();
    let (code, body) = server.curl("GET", &format!("/v1/chunks/{}", chunk.to_hex()), None, &[], None);
    assert_eq!(code, 404, "{body}");
    // ... and the store's own footer reads call the pack damaged.
    assert_eq!(env.json(&["index", "rebuild"])["packs_damaged"], 1);
}

/// A connection that sends a request head one byte every 400 ms, never finishing it, or
/// (`silent`) nothing at all.
struct Slow {
    stream: TcpStream,
    silent: bool,
    closed_after: Option<Duration>,
}

impl Slow {
    fn open(port: u16, silent: bool) -> Slow {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_nonblocking(true).unwrap();
        Slow { stream, silent, closed_after: None }
    }

    /// Sends byte `n` of the head (unless silent); notes when the server has closed.
    fn step(&mut self, n: usize, since: Instant) {
        const HEAD: &[u8] = b"GET /v1/health HTTP/1.1\r\nHost: gstore\r\nX-Slow: ";
        let mut buf = [0u8; 256];
        let closed = match self.stream.read(&mut buf) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != ErrorKind::WouldBlock,
        };
        let closed = closed || (!self.silent && self.stream.write(&[*HEAD.get(n).unwrap_or(&b'a')]).is_err());
        if closed {
            self.closed_after = Some(since.elapsed());
        }
    }
}

/// Dribbles on `conns` until the server closed them all (or 30 s passed).
fn dribble(conns: &mut [Slow], since: Instant) {
    let mut n = 0;
    while conns.iter().any(|c| c.closed_after.is_none()) && since.elapsed() < Duration::from_secs(30) {
        for c in conns.iter_mut().filter(|c| c.closed_after.is_none()) {
            c.step(n, since);
        }
        n += 1;
        std::thread::sleep(Duration::from_millis(400));
    }
}

#[test]
fn slow_or_silent_connections_are_closed_and_health_stays_answered() {
    let env = Env::new(&[]);
    // 100 slow connections against a server with 64 file descriptors: it stays answerable only
    // if it closes them.
    let server = Server::start_with_fd_limit(&env.store, &["--header-timeout", "2"], 64);
    let since = Instant::now();
    let mut conns: Vec<Slow> = (0..100).map(|i| Slow::open(server.port, i % 2 == 0)).collect();
    let url = format!("{}/v1/health", server.url());
    let health = std::thread::spawn(move || {
        let o = std::process::Command::new("curl").args(["-s", "--max-time", "25"]).arg(&url).output().unwrap();
        (String::from_utf8_lossy(&o.stdout).to_string(), since.elapsed())
    });
    dribble(&mut conns, since);
    let (body, took) = health.join().unwrap();
    assert_eq!(body, "ok", "/v1/health went unanswered for {took:?} while slow connections were open");
    let times: Vec<Duration> = conns.iter().map(|c| c.closed_after.unwrap_or(Duration::MAX)).collect();
    let (first, last) = (times.iter().min().unwrap(), times.iter().max().unwrap());
    assert!(*last < Duration::from_secs(20), "slow connections were still open after {last:?}");
    assert!(*first >= Duration::from_secs(1), "a connection was closed after {first:?}, before the header timeout");
}

#[test]
fn slow_headers_over_tls_are_cut_off() {
    let env = Env::new(&[]);
    let (cert, key) = self_signed_cert(&env);
    let args = ["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap(), "--header-timeout", "2"];
    let server = Server::start(&env.store, &args);
    // The handshake completes; then half a request head, and the client waits.
    let mut client = std::process::Command::new("openssl")
        .args(["s_client", "-quiet", "-connect", &format!("127.0.0.1:{}", server.port)])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("openssl runs");
    let mut stdin = client.stdin.take().unwrap();
    stdin.write_all(b"GET /v1/health HTTP/1.1\r\nHost: gstore\r\n").unwrap();
    stdin.flush().unwrap();
    let since = Instant::now();
    while client.try_wait().unwrap().is_none() && since.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let open = client.try_wait().unwrap().is_none();
    let _ = client.kill();
    let _ = client.wait();
    drop(stdin);
    assert!(!open, "the server kept a TLS connection with an unfinished request head open for 15 s");
}

const WRITER: &str = "writetoken-app-0123456789";

/// A forged delta of chunk `id` (`plain_len` bytes) against `base`: decodes to the wrong bytes.
fn forged_delta_pack(id: ObjectId, plain_len: u32, base: ObjectId) -> (ObjectId, Vec<u8>) {
    let mut stored = vec![1u8];
    stored.extend_from_slice(&base.0);
    stored.extend_from_slice(&zstd::bulk::compress(&vec![b'A'; plain_len as usize], 1).unwrap());
    let mut b = PackBuilder::new(PackIds::HeaderFooter);
    b.push_delta(id, gstore_store::codec::DeltaBases::one(base), stored, plain_len);
    let p = b.finish();
    (p.id, p.pieces.iter().flat_map(|b| b.iter().copied()).collect())
}

#[test]
fn a_write_token_for_some_tags_cannot_harm_other_images() {
    use gstore_store::{Store, StoreLocation};
    let env = Env::new(&[]);
    let victim = env.path("victim");
    make_tree(&victim, 45, 600_000);
    env.ok(&["-q", "push", victim.to_str().unwrap(), "--tag", "victim:1"]);
    let store = Store::open(&StoreLocation::Local(env.store.clone())).unwrap();
    let manifest = store.get_manifest(&store.resolve("victim:1").unwrap()).unwrap();
    let chunks: Vec<_> = manifest.chunks.iter().filter(|c| !c.zero).collect();
    assert!(chunks.len() >= 2);
    let tokens = env.path("tokens");
    fs::write(&tokens, format!("{WRITER} write app\n{ADMIN} admin\n")).unwrap();
    let server = Server::start(&env.store, &["--tokens", tokens.to_str().unwrap()]);
    let packs_before = env.packs();
    // A delta that names a chunk of the victim's and decodes to other bytes is refused,
    // whether its base is stored (and whole) or not.
    for base in [chunks[1].id, ObjectId::of(b"no such base")] {
        let (id, bytes) = forged_delta_pack(chunks[0].id, chunks[0].len, base);
        let p = env.path("forged");
        fs::write(&p, &bytes).unwrap();
        let (code, body) = server.curl("PUT", &format!("/v1/o/{}", ObjectKey::Pack(id)), Some(WRITER), &[], Some(&p));
        assert_eq!(code, 422, "{body}");
        assert!(body.contains("rejected, nothing stored"), "{body}");
    }
    assert_eq!(env.packs(), packs_before);
    // Genuine deltas, pushed through the server, pass: a page image and the same with pages
    // changed here and there.
    let (v1, v2) = (env.path("v1"), env.path("v2"));
    let mut pages = random_bytes(8 << 20, 7);
    fs::create_dir_all(&v1).unwrap();
    fs::write(v1.join("pages-1.img"), &pages).unwrap();
    let push = |src: &std::path::Path, tag: &str| {
        server.cmd("w", WRITER, &["--json", "push", src.to_str().unwrap(), "--tag", tag]).output().unwrap()
    };
    let first = push(&v1, "app:1");
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    for at in (0..pages.len()).step_by(300 * 1024) {
        pages[at..at + 64].copy_from_slice(&random_bytes(64, at as u64));
    }
    fs::create_dir_all(&v2).unwrap();
    fs::write(v2.join("pages-1.img"), &pages).unwrap();
    let second = push(&v2, "app:2");
    assert!(second.status.success(), "{}", String::from_utf8_lossy(&second.stderr));
    let report: serde_json::Value = serde_json::from_slice(&second.stdout).unwrap();
    assert!(report["delta_chunks"].as_u64().unwrap() > 0, "{report}");
    // A push to a tag the token may not write is refused before any pack is sent.
    let packs_before = env.packs();
    let other = push(&victim, "other:x");
    assert!(!other.status.success());
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(err.contains("app"), "{err}");
    assert_eq!(env.packs(), packs_before, "packs uploaded for a refused tag");
    env.ok(&["verify", "--read-data"]);
    let out = env.path("out");
    env.ok(&["restore", "victim:1", "--to", out.to_str().unwrap()]);
    assert_same_tree(&victim, &out);
}

/// A lease belongs to the token that wrote it: another write token (limited to other tags)
/// can neither delete nor overwrite it, nor write a lease in another's name; the owner and
/// an admin can. Before the fix a tag-limited token deleted any lease, and an admin gc then
/// deleted the packs of the push it protected.
#[test]
fn a_lease_belongs_to_the_token_that_wrote_it() {
    const TEAM_A: &str = "teamatoken-0123456789";
    const TEAM_B: &str = "teambtoken-0123456789";
    let env = Env::new(&[]);
    let tokens = env.path("tokens");
    fs::write(&tokens, format!("{TEAM_A} write team-a\n{TEAM_B} write team-b\n{ADMIN} admin\n")).unwrap();
    let server = Server::start(&env.store, &["--tokens", tokens.to_str().unwrap()]);
    let lease_of = |token: &str, n: u8| {
        let prefix = gstore_store::format::lease::owner_prefix(token.as_bytes());
        ObjectKey::Lease(format!("{prefix}{}", format!("{n:02x}").repeat(8))).to_string()
    };
    let record = env.path("lease.json");
    use gstore_store::repo::leases::Liveness;
    let owner = gstore_store::format::lease::Owner::current();
    let body = serde_json::json!({ "format": 1, "owner": owner, "purpose": "push team-b:1" });
    fs::write(&record, serde_json::to_vec(&body).unwrap()).unwrap();
    let put = |key: &str, token: &str| server.curl("PUT", &format!("/v1/o/{key}"), Some(token), &[], Some(&record));
    let delete = |key: &str, token: &str| server.curl("DELETE", &format!("/v1/o/{key}"), Some(token), &[], None);

    let b = lease_of(TEAM_B, 1);
    assert_eq!(put(&b, TEAM_B).0, 201, "the owner writes its lease");
    let (status, text) = delete(&b, TEAM_A);
    assert_eq!(status, 403, "another tenant deleted a lease: {text}");
    assert!(text.contains("belongs to another token"), "{text}");
    assert_eq!(put(&b, TEAM_A).0, 403, "another tenant overwrote a lease");
    assert_eq!(put(&lease_of(TEAM_B, 2), TEAM_A).0, 403, "a lease written in another's name");
    assert!(env.store.join(&b).exists());
    assert_eq!(delete(&b, TEAM_B).0, 204, "the owner deletes its lease");
    let b3 = lease_of(TEAM_B, 3);
    assert_eq!(put(&b3, TEAM_B).0, 201);
    assert_eq!(delete(&b3, ADMIN).0, 204, "an admin deletes any lease");

    // A push through the server names its lease with its token's prefix, so it still works.
    let src = env.path("src");
    make_tree(&src, 3, 1);
    let o = server.cmd("node", TEAM_A, &["push", src.to_str().unwrap(), "--tag", "team-a:1"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Issue 64: SIGHUP reads the token file again (a token taken out is refused at once, a new
/// one admitted); a file that does not read (or lists no token, which would turn
/// authentication off) keeps the tokens in force; the server lives through every SIGHUP.
#[test]
fn sighup_reloads_the_tokens_and_a_bad_file_keeps_them() {
    let env = Env::new(&[]);
    let tokens = token_file(&env);
    let server = Server::start(&env.store, &["--tokens", tokens.to_str().unwrap()]);
    let status = |token: &str| server.curl("GET", "/metrics", Some(token), &[], None).0;
    let hangup = || {
        assert!(std::process::Command::new("kill")
            .args(["-HUP", &server.pid().to_string()])
            .status()
            .unwrap()
            .success());
    };
    // Waits (up to 10 s) for `token` to get `want`: the reload runs on the server's own time.
    let wait_for = |token: &str, want: u16| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while status(token) != want {
            assert!(Instant::now() < deadline, "{token} never got {want}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    const NEW: &str = "newtoken-0123456789";
    assert_eq!((status(READ), status(NEW)), (200, 401));
    fs::write(&tokens, format!("{NEW} read\n{ADMIN} admin\n")).unwrap();
    hangup();
    wait_for(NEW, 200);
    assert_eq!(status(READ), 401, "a token taken out of the file is refused");
    for bad in ["not a token file\n", "# every token taken out\n"] {
        fs::write(&tokens, bad).unwrap();
        hangup();
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!((status(NEW), status(READ)), (200, 401), "a bad file ({bad:?}) changed the tokens");
    }
    fs::remove_file(&tokens).unwrap();
    hangup();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(status(NEW), 200);
    assert_eq!(server.curl("GET", "/v1/health", None, &[], None).0, 200, "the server lived through every SIGHUP");
}

/// Issue 64: a write token's quota bounds the stored bytes of the images under its prefix. A
/// push that would pass it is refused with a clear error and tags nothing; one adding nothing
/// new (deduplicated) passes; a token already at its quota is refused before it uploads a
/// pack; other teams are not limited by it; removing images gives room back; `gstore du
/// --prefix` counts what the server counts.
#[test]
fn a_quota_bounds_what_a_token_s_images_hold() {
    const TEAM_A: &str = "team-a-token-0123456789";
    const TEAM_B: &str = "team-b-token-0123456789";
    let env = Env::new(&[]);
    let tokens = env.path("tokens");
    fs::write(&tokens, format!("{TEAM_A} write a- quota=3M\n{TEAM_B} write b-\n{ADMIN} admin\n")).unwrap();
    let server = Server::start(&env.store, &["--tokens", tokens.to_str().unwrap()]);
    let image = |name: &str, seed: u64| {
        let dir = env.path(name);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("data.img"), random_bytes(2 << 20, seed)).unwrap();
        dir
    };
    let push = |token: &str, src: &std::path::Path, tag: &str| {
        server.cmd("w", token, &["--json", "push", src.to_str().unwrap(), "--tag", tag]).output().unwrap()
    };
    let (one, two) = (image("one", 1), image("two", 2));
    let first = push(TEAM_A, &one, "a-model:1");
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    // 2 MiB more would make 4 MiB under a-: refused, nothing tagged.
    let second = push(TEAM_A, &two, "a-model:2");
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("quota exceeded") && err.contains("\"a-\"") && err.contains("3145728"), "{err}");
    let ls = env.ok(&["ls"]);
    assert!(ls.contains("a-model:1") && !ls.contains("a-model:2"), "{ls}");
    // The same bytes under another name add nothing: they pass.
    let again = push(TEAM_A, &one, "a-copy:1");
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    // Another team is not bounded by team a's quota.
    assert!(push(TEAM_B, &two, "b-model:1").status.success());
    // What the server counts is what `du --prefix` says.
    let du: serde_json::Value =
        serde_json::from_str(&env.ok(&["--json", "du", "--prefix", "a-", "--prefix", "b-"])).unwrap();
    let a = &du["prefixes"][0];
    assert_eq!((a["prefix"].as_str(), a["images"].as_u64()), (Some("a-"), Some(2)), "{du}");
    let held = a["stored_bytes"].as_u64().unwrap();
    assert!((2 << 20..3 << 20).contains(&held), "{du}");
    assert_eq!(a["unique_stored_bytes"].as_u64(), Some(held), "{du}");
    // A quota lowered below what the prefix holds refuses the next push before any pack.
    fs::write(&tokens, format!("{TEAM_A} write a- quota=1M\n{TEAM_B} write b-\n{ADMIN} admin\n")).unwrap();
    assert!(std::process::Command::new("kill").args(["-HUP", &server.pid().to_string()]).status().unwrap().success());
    let may_write = || server.curl("GET", "/v1/may-write/tags/a-model", Some(TEAM_A), &[], None);
    let deadline = Instant::now() + Duration::from_secs(10);
    while may_write().0 != 403 {
        assert!(Instant::now() < deadline, "the lowered quota never took effect");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(may_write().1.contains("quota exceeded"), "{}", may_write().1);
    let packs_before = env.packs();
    let refused = push(TEAM_A, &image("three", 3), "a-model:3");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("quota exceeded"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert_eq!(env.packs(), packs_before, "a push at its quota is refused before it sends a pack");
    // Room comes back when images go.
    env.ok(&["rm", "a-model:1"]);
    env.ok(&["rm", "a-copy:1"]);
    let (code, body) = may_write();
    assert_eq!(code, 204, "{body}");
    env.ok(&["verify"]);
}
