//! The OCI registry of `gstore serve` (`/v2/`) through plain HTTP requests (curl), without
//! podman: uploads bounded and bound to their repository, request bodies under one rule
//! whether their length is declared or they are sent chunked, blobs of an image gc removed,
//! client errors answered 4xx, and an encrypted store's answer.

use gstore_tests::*;

/// Write tokens: two without a prefix, one limited to `team-a`.
const WRITE_A: &str = "registry-write-token-000a";
const WRITE_B: &str = "registry-write-token-000b";
const TEAM_A: &str = "registry-team-a-token-0001";

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// `gstore serve` over `env`'s store with the write tokens and `extra` arguments.
fn serve(env: &Env, extra: &[&str]) -> Server {
    let tokens = env.path("tokens");
    std::fs::write(&tokens, format!("{WRITE_A} write\n{WRITE_B} write\n{TEAM_A} write team-a\n")).unwrap();
    let mut args = vec!["--tokens", tokens.to_str().unwrap()];
    args.extend_from_slice(extra);
    Server::start(&env.store, &args)
}

/// `METHOD PATH` to `server` ([`http`]).
fn request(server: &Server, method: &str, path: &str, r: Req) -> Answer {
    http(method, &format!("{}{path}", server.url()), r)
}

/// Uploads `bytes` to `repo` in one request (`POST ?digest=`).
fn upload(server: &Server, token: &str, repo: &str, bytes: &[u8]) -> Answer {
    let path = format!("/v2/{repo}/blobs/uploads/?digest={}", sha256(bytes));
    request(server, "POST", &path, Req { token: Some(token), body: Some(bytes), ..Req::default() })
}

/// Starts an upload in `repo`; returns its path (`/v2/REPO/blobs/uploads/ID`).
fn start_upload(server: &Server, token: &str, repo: &str) -> String {
    let a =
        request(server, "POST", &format!("/v2/{repo}/blobs/uploads/"), Req { token: Some(token), ..Req::default() });
    a.expect(202, None);
    a.header("location")
}

/// A manifest naming `config` and `layers`; with podman's checkpoint annotation when
/// `checkpoint`.
fn manifest(config: &[u8], layers: &[&[u8]], checkpoint: bool) -> Vec<u8> {
    let layers: Vec<_> = layers
        .iter()
        .map(|l| serde_json::json!({ "mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": sha256(l), "size": l.len() }))
        .collect();
    let mut m = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(config), "size": config.len() },
        "layers": layers,
    });
    if checkpoint {
        m["annotations"] = serde_json::json!({ "io.podman.annotations.checkpoint.runtime.name": "runc" });
    }
    serde_json::to_vec(&m).unwrap()
}

/// Uploads `config` and `layers` to `repo` and pushes their manifest as `repo:tag`.
fn push(server: &Server, repo: &str, tag: &str, config: &[u8], layers: &[&[u8]], checkpoint: bool) -> Answer {
    for blob in std::iter::once(config).chain(layers.iter().copied()) {
        upload(server, WRITE_A, repo, blob).expect(201, None);
    }
    let m = manifest(config, layers, checkpoint);
    let ct = format!("Content-Type: {OCI_MANIFEST}");
    let r = Req { token: Some(WRITE_A), headers: &[&ct], body: Some(&m), ..Req::default() };
    request(server, "PUT", &format!("/v2/{repo}/manifests/{tag}"), r)
}

#[test]
fn an_upload_belongs_to_the_repository_it_was_started_in() {
    let env = Env::new(&[]);
    let server = serve(&env, &[]);
    let web = start_upload(&server, WRITE_A, "web");
    let other = web.replace("/v2/web/", "/v2/team-a/");
    let bytes = random_bytes(1000, 1);
    // Through another repository's path the upload is unknown, whoever asks.
    for token in [TEAM_A, WRITE_A] {
        let t = Some(token);
        let r =
            |m: &str, p: &str, b: Option<&[u8]>| request(&server, m, p, Req { token: t, body: b, ..Req::default() });
        r("PATCH", &other, Some(&bytes)).expect(404, Some("BLOB_UPLOAD_UNKNOWN"));
        r("GET", &other, None).expect(404, Some("BLOB_UPLOAD_UNKNOWN"));
        r("PUT", &format!("{other}?digest={}", sha256(&[])), None).expect(404, Some("BLOB_UPLOAD_UNKNOWN"));
        r("DELETE", &other, None).expect(404, Some("BLOB_UPLOAD_UNKNOWN"));
    }
    // Through its own it goes on, untouched.
    let t = Some(WRITE_A);
    let a = request(&server, "PATCH", &web, Req { token: t, body: Some(&bytes), ..Req::default() });
    a.expect(202, None);
    assert_eq!(a.header("range"), "0-999");
    let end = format!("{web}?digest={}", sha256(&bytes));
    request(&server, "PUT", &end, Req { token: t, ..Req::default() }).expect(201, None);
}

#[test]
fn uploads_stay_within_the_limits_per_token_and_in_all() {
    let env = Env::new(&[]);
    let server = serve(&env, &["--upload-bytes", "96KiB", "--upload-bytes-per-token", "64KiB"]);
    let kib = |n: usize, seed: u64| random_bytes(n << 10, seed);
    let patch = |token: &str, path: &str, bytes: &[u8], chunked: bool| {
        request(&server, "PATCH", path, Req { token: Some(token), body: Some(bytes), chunked, ..Req::default() })
    };
    // A holds 48 KiB in an upload in progress; 32 KiB more would pass its 64, sent chunked
    // (refused once it passes, ending that upload) or declared (refused before it is read).
    let first = start_upload(&server, WRITE_A, "web");
    patch(WRITE_A, &first, &kib(48, 1), true).expect(202, None);
    let second = start_upload(&server, WRITE_A, "web");
    patch(WRITE_A, &second, &kib(32, 2), true).expect(413, Some("DENIED"));
    let gone = request(&server, "GET", &second, Req { token: Some(WRITE_A), ..Req::default() });
    gone.expect(404, Some("BLOB_UPLOAD_UNKNOWN"));
    let third = start_upload(&server, WRITE_A, "web");
    // Expect: 100-continue: a refused body is never sent.
    let declared =
        Req { token: Some(WRITE_A), headers: &["Expect: 100-continue"], body: Some(&kib(32, 3)), ..Req::default() };
    request(&server, "PATCH", &third, declared).expect(413, Some("DENIED"));
    let big = kib(32, 4);
    let path = format!("/v2/web/blobs/uploads/?digest={}", sha256(&big));
    let declared = Req { token: Some(WRITE_A), headers: &["Expect: 100-continue"], body: Some(&big), ..Req::default() };
    request(&server, "POST", &path, declared).expect(413, Some("DENIED"));

    // B's 40 KiB fit (88 in all); 16 more would not pass B's 64 but the 96 of all. An
    // uploaded blob counts until a manifest takes it in.
    upload(&server, WRITE_B, "web", &kib(40, 5)).expect(201, None);
    let last = kib(16, 6);
    upload(&server, WRITE_B, "web", &last).expect(413, Some("DENIED"));
    // A's upload cancelled, its bytes count no more.
    request(&server, "DELETE", &first, Req { token: Some(WRITE_A), ..Req::default() }).expect(204, None);
    upload(&server, WRITE_B, "web", &last).expect(201, None);
}

#[test]
fn a_token_s_quota_bounds_its_registry_uploads_and_pushes() {
    let env = Env::new(&[]);
    let tokens = env.path("quota-tokens");
    const QUOTA: &str = "registry-quota-token-0001";
    std::fs::write(&tokens, format!("{QUOTA} write q quota=1MiB\n")).unwrap();
    let server = Server::start(&env.store, &["--tokens", tokens.to_str().unwrap()]);
    // An upload past the quota is refused, and nothing of it is kept.
    upload(&server, QUOTA, "q", &random_bytes(1100 << 10, 1)).expect(413, Some("DENIED"));
    // An image within it goes in; then the room left bounds the uploads.
    let config = br#"{"architecture":"amd64"}"#;
    let layer = random_bytes(900 << 10, 2);
    for blob in [&config[..], &layer] {
        upload(&server, QUOTA, "q", blob).expect(201, None);
    }
    let m = manifest(config, &[&layer], false);
    let ct = format!("Content-Type: {OCI_MANIFEST}");
    let r = Req { token: Some(QUOTA), headers: &[&ct], body: Some(&m), ..Req::default() };
    request(&server, "PUT", "/v2/q/manifests/1", r).expect(201, None);
    let over = upload(&server, QUOTA, "q", &random_bytes(200 << 10, 3));
    over.expect(413, Some("DENIED"));
    assert!(over.text().contains("quota"), "{}", over.text());
    upload(&server, QUOTA, "q", &random_bytes(50 << 10, 4)).expect(201, None);
}

#[test]
fn registry_bodies_are_not_bound_by_max_body_whether_declared_or_chunked() {
    let env = Env::new(&[]);
    let server = serve(&env, &["--max-body", "4KiB"]);
    for (seed, chunked) in [(1, false), (2, true)] {
        let bytes = random_bytes(64 << 10, seed);
        let path = format!("/v2/web/blobs/uploads/?digest={}", sha256(&bytes));
        let r = Req { token: Some(WRITE_A), body: Some(&bytes), chunked, ..Req::default() };
        request(&server, "POST", &path, r).expect(201, None);
        let u = start_upload(&server, WRITE_A, "web");
        let r = Req { token: Some(WRITE_A), body: Some(&bytes), chunked, ..Req::default() };
        request(&server, "PATCH", &u, r).expect(202, None);
    }
    // The store's own routes keep --max-body.
    let big = env.path("big");
    std::fs::write(&big, random_bytes(64 << 10, 3)).unwrap();
    let (status, _) = server.curl("PUT", "/v1/o/tags/x/1.tag", Some(WRITE_A), &[], Some(&big));
    assert_eq!(status, 413);
}

#[test]
fn blobs_of_an_image_gc_removed_are_gone_and_can_be_pushed_again() {
    let env = Env::new(&[]);
    let server = serve(&env, &[]);
    let config = br#"{"architecture":"amd64","os":"linux","config":{}}"#.to_vec();
    let layer = random_bytes(200 << 10, 7);
    push(&server, "web", "1", &config, &[&layer], false).expect(201, None);
    let ckpt_layer = ustar(&[("checkpoint/pages-1.img", &random_bytes(100 << 10, 8)), ("config.dump", b"{}")]);
    push(&server, "ckpt", "1", &config, &[&ckpt_layer], true).expect(201, None);
    // The checkpoint image's config as served is generated: learn it from its manifest.
    let read = |path: &str| request(&server, "GET", path, Req { token: Some(WRITE_A), ..Req::default() });
    let served: serde_json::Value = serde_json::from_slice(&read("/v2/ckpt/manifests/1").body).unwrap();
    let ckpt_config = served["config"]["digest"].as_str().unwrap().to_string();
    let blobs = [format!("/v2/web/blobs/{}", sha256(&config)), format!("/v2/web/blobs/{}", sha256(&layer))];
    let ckpt_config = format!("/v2/ckpt/blobs/{ckpt_config}");
    let all: Vec<&str> = blobs.iter().map(String::as_str).chain([ckpt_config.as_str()]).collect();
    for path in &all {
        read(path).expect(200, None);
        request(&server, "HEAD", path, Req { token: Some(WRITE_A), ..Req::default() }).expect(200, None);
    }

    env.ok(&["rm", "web:1"]);
    env.ok(&["rm", "ckpt:1"]);
    env.ok(&["gc"]);
    env.ok(&["gc"]);
    for path in &all {
        read(path).expect(404, Some("BLOB_UNKNOWN"));
        request(&server, "HEAD", path, Req { token: Some(WRITE_A), ..Req::default() }).expect(404, None);
    }
    read("/v2/web/manifests/1").expect(404, Some("MANIFEST_UNKNOWN"));

    // Pushed again, the same blobs make a new image.
    push(&server, "web", "2", &config, &[&layer], false).expect(201, None);
    for path in &blobs[..] {
        let a = read(path);
        a.expect(200, None);
        assert_eq!(sha256(&a.body), path.rsplit('/').next().unwrap());
    }
}

#[test]
fn bad_layers_and_big_configs_are_client_errors() {
    let env = Env::new(&[]);
    let server = serve(&env, &[]);
    let config = br#"{"os":"linux"}"#.to_vec();
    let data = random_bytes(5000, 9);
    let unsafe_path = ustar(&[("checkpoint/a", &data), ("checkpoint/../../escape", &data)]);
    let twice = ustar(&[("checkpoint/a", &data), ("checkpoint/a", &data)]);
    for (tag, layer) in [("1", &unsafe_path), ("2", &twice)] {
        push(&server, "ckpt", tag, &config, &[layer], true).expect(400, Some("MANIFEST_INVALID"));
    }
    // A checkpoint image's config is kept in its metadata: a big one is refused.
    let mut big = br#"{"os":"linux","padding":""#.to_vec();
    big.resize(big.len() + (5 << 20), b'x');
    big.extend_from_slice(br#""}"#);
    let layer = ustar(&[("checkpoint/a", &data)]);
    let a = push(&server, "ckpt", "3", &big, &[&layer], true);
    a.expect(400, Some("MANIFEST_INVALID"));
    assert!(a.text().contains("config"), "{}", a.text());
    assert!(!env.ok(&["ls"]).contains("ckpt"), "nothing tagged");
}

#[test]
fn an_encrypted_store_has_no_registry() {
    let env = Env::uninitialized();
    let key = env.path("store.key");
    let o = env.cmd(&["key", "generate", key.to_str().unwrap()]).env_remove("GSTORE_KEY_FILE").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = env.cmd(&["init", "--encrypt"]).env("GSTORE_KEY_FILE", &key).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let server = serve(&env, &[]);
    for path in ["/v2/", "/v2/web/tags/list"] {
        request(&server, "GET", path, Req { token: Some(WRITE_A), ..Req::default() }).expect(501, Some("UNSUPPORTED"));
    }
}
