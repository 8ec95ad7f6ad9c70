//! Containers through the real binary, podman + runc and CRIU (>= 4): checkpoint a running
//! container into the store, restore it into podman, archives in and out, and the failures
//! (no such container, no runtime, bad archives, a missing base image, a store that fills up
//! mid-checkpoint). The container is a static counter holding 256 MiB of known memory that
//! checks itself (tests/containers/counter.c) and writes its count into a bind-mounted
//! directory. scripts/setup.sh installs podman and runc and configures them for this machine.

use gstore_tests::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The counter's image, made once per test process from tests/containers/counter.c.
const IMAGE: &str = "localhost/gstore-test-counter:1";

/// `podman ARGS` with CRIU >= 4 first on PATH; `storage`: a podman storage.conf of its own.
fn podman(storage: Option<&Path>, args: &[&str]) -> std::process::Output {
    let mut c = Command::new("podman");
    c.args(args).env("PATH", path_with_criu());
    if let Some(conf) = storage {
        c.env("CONTAINERS_STORAGE_CONF", conf);
    }
    c.output().expect("podman runs (scripts/setup.sh installs it)")
}

/// `podman ARGS` that must succeed; its stdout.
fn podman_ok(storage: Option<&Path>, args: &[&str]) -> String {
    let out = podman(storage, args);
    assert!(out.status.success(), "podman {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// PATH with the CRIU of scripts/criu.sh first, as podman's runc needs.
fn path_with_criu() -> std::ffi::OsString {
    let criu = PathBuf::from(&criu_args()[1]);
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::iter::once(criu.parent().unwrap().to_path_buf()).chain(std::env::split_paths(&path));
    std::env::join_paths(dirs).unwrap()
}

/// Builds the counter image into podman's storage (idempotent: the same rootfs each time).
fn counter_image(scratch: &Path) {
    static MADE: std::sync::Once = std::sync::Once::new();
    MADE.call_once(|| {
        let rootfs = scratch.join("rootfs");
        for d in ["state", "tmp"] {
            std::fs::create_dir_all(rootfs.join(d)).unwrap();
        }
        let source = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo and nextest"))
            .join("containers/counter.c");
        let cc = Command::new("cc")
            .args(["-O2", "-static", "-o"])
            .arg(rootfs.join("counter"))
            .arg(&source)
            .status()
            .expect("cc");
        assert!(cc.success(), "building {}", source.display());
        let tar = scratch.join("rootfs.tar");
        assert!(Command::new("tar").arg("-C").arg(&rootfs).arg("-cf").arg(&tar).arg(".").status().unwrap().success());
        podman_ok(None, &["import", &tar.to_string_lossy(), IMAGE]);
    });
}

/// A running counter container, removed on drop; its count file through [`CountFile`].
struct Counter {
    name: String,
    _state: tempfile::TempDir,
    storage: Option<PathBuf>,
    counted: CountFile,
}

impl std::ops::Deref for Counter {
    type Target = CountFile;
    fn deref(&self) -> &CountFile {
        &self.counted
    }
}

impl Counter {
    /// Starts a counter holding `mib` MiB, named uniquely.
    fn start(env: &Env, tag: &str, mib: u32) -> Counter {
        counter_image(&env.tmp.path().join("image"));
        let name = format!("gstore-test-{tag}-{}", std::process::id());
        podman(None, &["rm", "-f", &name]);
        let state = tempfile::tempdir().unwrap();
        let volume = format!("{}:/state", state.path().display());
        podman_ok(None, &["run", "-d", "--name", &name, "-v", &volume, IMAGE, "/counter", &mib.to_string()]);
        let counted = CountFile::new(state.path().join("count"), &name);
        let c = Counter { name, _state: state, storage: None, counted };
        c.wait_above(2);
        c
    }

    /// podman's status of it ("running", "exited", ...).
    fn status(&self) -> String {
        let out =
            podman(self.storage.as_deref(), &["container", "inspect", "--format", "{{.State.Status}}", &self.name]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Removes the container from podman.
    fn remove(&self) {
        podman_ok(self.storage.as_deref(), &["rm", "-f", &self.name]);
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        podman(self.storage.as_deref(), &["rm", "-f", &self.name]);
    }
}

/// gstore with podman's CRIU: `--criu` from [`criu_args`] goes after `args`.
fn gstore(env: &Env, args: &[&str]) -> std::process::Output {
    let criu = criu_args();
    env.run(&with_criu(args, &criu))
}

fn json_ok(env: &Env, args: &[&str]) -> serde_json::Value {
    let mut full = vec!["--json"];
    full.extend_from_slice(args);
    let out = gstore(env, &full);
    assert!(out.status.success(), "gstore {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn fails(env: &Env, args: &[&str]) -> (i32, String) {
    let out = env.run(args);
    assert!(!out.status.success(), "gstore {args:?} succeeded");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_container_checkpointed_into_the_store_is_restored_and_counts_on() {
    let env = Env::new(&[]);
    let c = Counter::start(&env, "cr", 256);
    let r = json_ok(&env, &["checkpoint", "--container", &c.name, "--tag", "ctr:1"]);
    assert_eq!(r["left_running"], false);
    assert!(r["push"]["logical_bytes"].as_u64().unwrap() > 256 << 20, "the 256 MiB of memory are in the image");
    assert_eq!(c.status(), "exited", "podman's checkpoint stopped it");
    let at_dump = c.assert_still();
    let show = env.json(&["show", "ctr:1"]);
    assert_eq!(show["meta"]["kind"], "container-checkpoint");
    assert_eq!(show["meta"]["container"]["image"], IMAGE);
    assert_eq!(show["meta"]["container"]["name"], c.name.as_str());

    c.remove();
    let since = Instant::now();
    let r = json_ok(&env, &["restore", "ctr:1", "--container"]);
    assert_eq!(r["container"], c.name.as_str());
    let after = c.counts_on_from(at_dump, since);
    // Its full self-check (every 20 ticks) passes on the restored memory.
    c.wait_above(after + 25);

    // A second checkpoint, the container left running: it adds about what changed.
    let r2 = json_ok(&env, &["checkpoint", "--container", &c.name, "--tag", "ctr:2", "--leave-running"]);
    assert_eq!(r2["left_running"], true);
    assert_eq!(c.status(), "running");
    let n = c.wait_above(after + 30);
    c.wait_above(n + 2);
    let logical = r2["push"]["logical_bytes"].as_u64().unwrap();
    let added = r2["push"]["new_stored_bytes"].as_u64().unwrap();
    assert!(added * 20 < logical, "the second checkpoint added {added} of {logical} bytes");
}

#[test]
fn archives_go_in_and_out_byte_for_byte_and_podman_imports_them() {
    let env = Env::new(&[]);
    let c = Counter::start(&env, "ar", 64);
    let exported = env.path("exported.tar.zst");
    podman_ok(None, &["container", "checkpoint", &format!("--export={}", exported.display()), &c.name]);
    let at_dump = c.assert_still();
    // One creation time for both pushes, so the same entries give the same manifest id.
    let push = |args: &[&str]| {
        let mut c = env.cmd(args);
        c.env("SOURCE_DATE_EPOCH", "1790000000");
        c
    };
    let out = push(&["--json", "push", &exported.to_string_lossy(), "--tag", "ar:1"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["archive"]["checkpoint"], true);
    assert_eq!(r["archive"]["compression"], "zstd");
    assert!(env.json(&["show", "ar:1"])["entries"].as_array().unwrap().len() > 10, "stored entry by entry");

    // Standard input gives the same image; the archive written back is the same bytes each time.
    let piped = push(&["--json", "push", "-", "--tag", "ar:2"])
        .stdin(std::fs::File::open(&exported).unwrap())
        .output()
        .unwrap();
    assert!(piped.status.success(), "{}", String::from_utf8_lossy(&piped.stderr));
    let piped: serde_json::Value = serde_json::from_slice(&piped.stdout).unwrap();
    assert_eq!(piped["manifest"], r["manifest"]);
    let out = env.path("out.tar");
    env.ok(&["restore", "ar:1", "--archive", &out.to_string_lossy()]);
    let streamed = env.cmd(&["restore", "ar:2", "--archive", "-"]).output().unwrap();
    assert!(streamed.status.success());
    assert_eq!(streamed.stdout, std::fs::read(&out).unwrap(), "the same image gives the same archive");

    c.remove();
    let since = Instant::now();
    podman_ok(None, &["container", "restore", &format!("--import={}", out.display())]);
    c.counts_on_from(at_dump, since);
}

#[test]
fn a_fresh_podman_storage_needs_the_base_image_then_restores() {
    let env = Env::new(&[]);
    let c = Counter::start(&env, "fresh", 64);
    json_ok(&env, &["checkpoint", "--container", &c.name, "--tag", "fresh:1"]);
    let at_dump = c.assert_still();
    c.remove();

    // A storage of its own (as on another machine): podman keeps the checkpointed container's
    // run-time paths (its conmon pid file) from the archive, so only the image store is new.
    let storage = tempfile::tempdir().unwrap();
    let conf = storage.path().join("storage.conf");
    std::fs::write(
        &conf,
        format!(
            "[storage]\ndriver = \"overlay\"\ngraphroot = \"{0}/graph\"\nrunroot = \"/run/containers/storage\"\n",
            storage.path().display()
        ),
    )
    .unwrap();
    let mut fresh = env.cmd(&["restore", "fresh:1", "--container"]);
    fresh.args(criu_args()).env("CONTAINERS_STORAGE_CONF", &conf);
    let out = fresh.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("base image") && stderr.contains(IMAGE), "{stderr}");

    // The base image moved as podman moves images (save/load keeps its id).
    let saved = env.path("image.tar");
    podman_ok(None, &["save", "-o", &saved.to_string_lossy(), IMAGE]);
    podman_ok(Some(&conf), &["load", "-i", &saved.to_string_lossy()]);
    let mut fresh = env.cmd(&["restore", "fresh:1", "--container"]);
    fresh.args(criu_args()).env("CONTAINERS_STORAGE_CONF", &conf);
    let since = Instant::now();
    let out = fresh.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let state = tempfile::tempdir().unwrap();
    let counted = CountFile::new(state.path().join("count"), &c.name);
    let restored = Counter { name: c.name.clone(), _state: state, storage: Some(conf.clone()), counted };
    assert_eq!(restored.status(), "running");
    c.counts_on_from(at_dump, since); // in the bind mount
    drop(restored);
    podman(Some(&conf), &["system", "reset", "--force"]);
}

/// A text file that is no archive.
fn source_text(env: &Env) -> PathBuf {
    let p = env.path("text.txt");
    std::fs::write(&p, "not an archive\n".repeat(100)).unwrap();
    p
}

#[test]
fn bad_containers_runtimes_and_archives_fail_clearly_and_tag_nothing() {
    let env = Env::new(&[]);
    let criu = criu_args();
    let (code, err) =
        fails(&env, &with_criu(&["checkpoint", "--container", "gstore-no-such-container", "--tag", "x:1"], &criu));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no container \"gstore-no-such-container\""), "{err}");

    // No podman on PATH.
    let mut no_podman = env.cmd(&["checkpoint", "--container", "any", "--tag", "x:1"]);
    no_podman.args(criu_args()).env("PATH", "/nonexistent");
    let out = no_podman.output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("podman is not installed"));

    // A stopped container cannot be checkpointed.
    let c = Counter::start(&env, "bad", 16);
    podman_ok(None, &["stop", "-t", "0", &c.name]);
    let (_, err) = fails(&env, &with_criu(&["checkpoint", "--container", &c.name, "--tag", "x:1"], &criu));
    assert!(err.contains("only a running container"), "{err}");

    // Archives cut short, or not archives at all.
    podman_ok(None, &["start", &c.name]);
    c.wait_above(c.count().unwrap());
    let exported = env.path("c.tar");
    podman_ok(
        None,
        &["container", "checkpoint", "--compress=none", &format!("--export={}", exported.display()), &c.name],
    );
    let bytes = std::fs::read(&exported).unwrap();
    let cut = env.path("cut.tar");
    std::fs::write(&cut, &bytes[..bytes.len() / 2 / 512 * 512]).unwrap();
    let (code, err) = fails(&env, &["push", &cut.to_string_lossy(), "--tag", "x:1"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cut short") || err.contains("damaged"), "{err}");
    let garbage = env
        .cmd(&["push", "-", "--tag", "x:1"])
        .stdin(std::fs::File::open(source_text(&env)).unwrap())
        .output()
        .unwrap();
    assert_eq!(garbage.status.code(), Some(2), "{}", String::from_utf8_lossy(&garbage.stderr));
    assert!(env.ok(&["ls"]).lines().all(|l| !l.starts_with("x:1")), "nothing tagged");

    // An image that is not a container checkpoint.
    std::fs::write(env.path("plain.txt"), "plain").unwrap();
    env.ok(&["push", &env.path("plain.txt").to_string_lossy(), "--tag", "plain:1"]);
    let (code, err) = fails(&env, &with_criu(&["restore", "plain:1", "--container"], &criu));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not a container checkpoint"), "{err}");
}

#[test]
fn a_store_that_fills_up_mid_checkpoint_gives_the_container_back() {
    let tmp = tempfile::tempdir().unwrap();
    let small = tmp.path().join("small");
    let env = Env { store: small.join("store"), tmp };
    let _disk = SmallDisk::mount(&small, "24m");
    env.ok(&["init"]);
    // 1 GiB of memory, four times what a streamed push buffers: the store fills while podman
    // is still writing its archive (podman blocks for ever on a reader that went away).
    let c = Counter::start(&env, "full", 1024);
    let (code, err) = fails(&env, &with_criu(&["checkpoint", "--container", &c.name, "--tag", "full:1"], &criu_args()));
    assert_ne!(code, 0);
    assert!(err.contains("runs again"), "{err}");
    assert_eq!(c.status(), "running");
    let n = c.count().unwrap();
    c.wait_above(n + 3);
    assert!(!env.ok(&["ls"]).contains("full:1"), "nothing tagged");
}

/// Registry tokens: one may push, one may only pull.
const WRITE: &str = "registry-write-token-0001";
const READ: &str = "registry-read-token-00001";

/// `gstore serve` over the test's store with the two tokens; its `HOST:PORT`.
fn registry(env: &Env) -> (Server, String) {
    let tokens = env.path("tokens");
    std::fs::write(&tokens, format!("{WRITE} write\n{READ} read\n")).unwrap();
    let server = Server::start(&env.store, &["--tokens", &tokens.to_string_lossy()]);
    let host = format!("127.0.0.1:{}", server.port);
    (server, host)
}

/// podman's registry options with `token` (basic auth, the token as the password).
fn creds(token: &str) -> [String; 3] {
    ["--tls-verify=false".into(), "--creds".into(), format!("podman:{token}")]
}

fn podman_with(storage: Option<&Path>, args: &[&str], token: &str) -> std::process::Output {
    let c = creds(token);
    let mut all: Vec<&str> = args.to_vec();
    all.extend(c.iter().map(String::as_str));
    podman(storage, &all)
}

/// Images pulled into podman's storage, removed on drop.
struct Pulled(Vec<String>);

impl Drop for Pulled {
    fn drop(&mut self) {
        for i in &self.0 {
            podman(None, &["rmi", "-f", i]);
        }
    }
}

#[test]
fn checkpoint_images_go_through_the_registry_and_restore() {
    let env = Env::new(&[]);
    let (_server, host) = registry(&env);
    let c = Counter::start(&env, "rg", 64);
    let mut pulled = Pulled(vec![]);

    // Made by gstore: checkpointed into the store, pulled as a checkpoint image, restored.
    json_ok(&env, &["checkpoint", "--container", &c.name, "--tag", "rg:1"]);
    let at_dump = c.assert_still();
    c.remove();
    let image = format!("{host}/rg:1");
    pulled.0.push(image.clone());
    let out = podman_with(None, &["pull", &image], READ);
    assert!(out.status.success(), "pull: {}", String::from_utf8_lossy(&out.stderr));
    let since = Instant::now();
    podman_ok(None, &["container", "restore", &image]);
    c.counts_on_from(at_dump, since);

    // Made by podman and pushed: a read token cannot, a write token can; it is kept unpacked.
    let local = format!("localhost/gstore-test-rg-ckpt:{}", std::process::id());
    pulled.0.push(local.clone());
    podman_ok(None, &["container", "checkpoint", "--create-image", &local, &c.name]);
    let at_dump = c.assert_still();
    let target = format!("{host}/rg:2");
    let refused = podman_with(None, &["push", &local, &target], READ);
    assert!(!refused.status.success(), "a read token pushed");
    assert!(env.json(&["ls"]).as_array().unwrap().iter().all(|t| t["tag"] != "rg:2"), "nothing tagged");
    let out = podman_with(None, &["push", &local, &target], WRITE);
    assert!(out.status.success(), "push: {}", String::from_utf8_lossy(&out.stderr));
    let show = env.json(&["show", "rg:2"]);
    assert_eq!(show["meta"]["kind"], "container-checkpoint");
    assert!(show["entries"].as_array().unwrap().iter().any(|e| e["path"] == "checkpoint/pages-1.img"), "unpacked");

    // gc keeps what the registry's tags name; the image comes back from the store alone.
    c.remove();
    podman_ok(None, &["rmi", "-f", &local]);
    env.ok(&["gc"]);
    pulled.0.push(target.clone());
    let out = podman_with(None, &["pull", &target], READ);
    assert!(out.status.success(), "pull: {}", String::from_utf8_lossy(&out.stderr));
    let since = Instant::now();
    podman_ok(None, &["container", "restore", &target]);
    c.counts_on_from(at_dump, since);
}

/// `curl` of the registry: (exit status, HTTP status, headers, body).
fn curl(host: &str, token: Option<&str>, args: &[&str], path: &str) -> (bool, u16, String, Vec<u8>) {
    let tmp = tempfile::tempdir().unwrap();
    let (headers, body) = (tmp.path().join("h"), tmp.path().join("b"));
    let mut c = Command::new("curl");
    c.args(["-s", "-D"]).arg(&headers).arg("-o").arg(&body).args(["-w", "%{http_code}"]);
    if let Some(t) = token {
        c.args(["-u", &format!("podman:{t}")]);
    }
    let out = c.args(args).arg(format!("http://{host}{path}")).output().expect("curl runs");
    let code = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);
    let h = std::fs::read_to_string(&headers).unwrap_or_default().to_lowercase();
    (out.status.success(), code, h, std::fs::read(&body).unwrap_or_default())
}

#[test]
fn the_registry_serves_images_byte_for_byte_and_refuses_bad_pushes() {
    let env = Env::new(&[]);
    let (_server, host) = registry(&env);
    counter_image(&env.tmp.path().join("image"));
    let out = podman_with(None, &["push", IMAGE, &format!("{host}/base:1")], WRITE);
    assert!(out.status.success(), "push: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(env.json(&["show", "base:1"])["meta"]["kind"], "oci-image");

    // The manifest and every blob come back as their digests say.
    let (ok, code, headers, manifest) = curl(&host, Some(READ), &[], "/v2/base/manifests/1");
    assert!(ok && code == 200, "{code}");
    assert!(headers.contains(&format!("docker-content-digest: {}", sha256(&manifest))), "{headers}");
    let m: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
    let mut blobs = vec![m["config"]["digest"].as_str().unwrap().to_string()];
    blobs.extend(m["layers"].as_array().unwrap().iter().map(|l| l["digest"].as_str().unwrap().to_string()));
    for d in &blobs {
        let (ok, code, _, body) = curl(&host, Some(READ), &[], &format!("/v2/base/blobs/{d}"));
        assert!(ok && code == 200 && &sha256(&body) == d, "blob {d}: {code}");
    }
    assert_eq!(curl(&host, Some(READ), &[], "/v2/base/tags/list").3, br#"{"name":"base","tags":["1"]}"#);
    // Ranges of a blob, as a resumed pull asks; one past its end is refused.
    let layer_path = format!("/v2/base/blobs/{}", blobs[1]);
    let whole = curl(&host, Some(READ), &[], &layer_path).3;
    let (_, code, headers, part) = curl(&host, Some(READ), &["-r", "100-1123"], &layer_path);
    assert!(code == 206 && part[..] == whole[100..1124], "{code}");
    assert!(headers.contains(&format!("content-range: bytes 100-1123/{}", whole.len())), "{headers}");
    let (_, code, _, tail) = curl(&host, Some(READ), &["-r", "5000-"], &layer_path);
    assert!(code == 206 && tail[..] == whole[5000..], "{code}");
    assert_eq!(curl(&host, Some(READ), &["-r", &format!("{}-", whole.len())], &layer_path).1, 416);

    // A fresh podman storage pulls it and runs it.
    let storage = tempfile::tempdir().unwrap();
    let conf = storage.path().join("storage.conf");
    let graph = format!(
        "[storage]\ndriver = \"overlay\"\ngraphroot = \"{}/graph\"\nrunroot = \"{}/run\"\n",
        storage.path().display(),
        storage.path().display()
    );
    std::fs::write(&conf, graph).unwrap();
    let out = podman_with(Some(&conf), &["pull", &format!("{host}/base:1")], READ);
    assert!(out.status.success(), "pull: {}", String::from_utf8_lossy(&out.stderr));
    let id =
        |storage: Option<&Path>, image: &str| podman_ok(storage, &["image", "inspect", "--format", "{{.Id}}", image]);
    let pulled_id = id(Some(&conf), &format!("{host}/base:1"));
    podman(Some(&conf), &["system", "reset", "--force"]);
    assert_eq!(pulled_id, id(None, IMAGE), "the same image came back");

    // Bad requests: no token, a read token pushing, a nested name, a wrong digest, a manifest
    // naming a blob nobody uploaded. Nothing is tagged.
    let (_, code, headers, _) = curl(&host, None, &[], "/v2/");
    assert!(code == 401 && headers.contains("www-authenticate: basic"), "{code} {headers}");
    assert_eq!(curl(&host, Some(READ), &["-X", "POST"], "/v2/base/blobs/uploads/").1, 403);
    let (_, code, _, body) = curl(&host, Some(READ), &[], "/v2/team/base/manifests/1");
    assert!(code == 400 && String::from_utf8_lossy(&body).contains("NAME_INVALID"), "{code}");
    let file = env.path("blob");
    std::fs::write(&file, b"some bytes").unwrap();
    let data = format!("@{}", file.display());
    let wrong = sha256(b"other bytes");
    let (_, code, _, body) = curl(
        &host,
        Some(WRITE),
        &["-X", "POST", "--data-binary", &data],
        &format!("/v2/base/blobs/uploads/?digest={wrong}"),
    );
    assert!(code == 400 && String::from_utf8_lossy(&body).contains("DIGEST_INVALID"), "{code}");
    let missing = sha256(b"never uploaded");
    let bad = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{missing}","size":14}},"layers":[]}}"#
    );
    std::fs::write(&file, bad).unwrap();
    let put = ["-X", "PUT", "-H", "Content-Type: application/vnd.oci.image.manifest.v1+json", "--data-binary", &data];
    let (_, code, _, body) = curl(&host, Some(WRITE), &put, "/v2/base/manifests/2");
    assert!(code == 400 && String::from_utf8_lossy(&body).contains("MANIFEST_BLOB_UNKNOWN"), "{code}");
    assert_eq!(curl(&host, Some(READ), &[], "/v2/base/manifests/2").1, 404);
    assert_eq!(curl(&host, Some(READ), &[], "/v2/nothing/tags/list").1, 404);

    // A damaged chunk: the layer's transfer fails; it never ends as a whole, wrong layer.
    for pack in env.packs() {
        let mut bytes = std::fs::read(&pack).unwrap();
        for at in (4096..bytes.len().saturating_sub(8192)).step_by(50_000) {
            bytes[at] ^= 0x01;
        }
        std::fs::write(&pack, bytes).unwrap();
    }
    let layer = &blobs[1];
    let (ok, code, _, body) = curl(&host, Some(READ), &[], &format!("/v2/base/blobs/{layer}"));
    assert!(!(ok && &sha256(&body) != layer), "curl took a wrong layer for whole ({code})");
    assert!(!ok || code != 200, "the damaged layer was served ({code})");
}

#[test]
fn the_watcher_stores_each_archive_that_lands_once_across_a_kill() {
    let env = Env::new(&[]);
    let c = Counter::start(&env, "watch", 32);
    let exported = env.path("exported.tar");
    podman_ok(
        None,
        &["container", "checkpoint", "--compress=none", &format!("--export={}", exported.display()), &c.name],
    );
    let bytes = std::fs::read(&exported).unwrap();
    // 20 archives land at once the way the kubelet writes them (a temporary name, then the
    // final one), and one cut short under its final name.
    let dir = env.path("checkpoints");
    std::fs::create_dir_all(&dir).unwrap();
    let name = |i: usize| format!("checkpoint-pod{i}_default-counter-2026-11-28T22:44:{i:02}Z.tar");
    for i in 0..20 {
        let tmp = dir.join(format!(".{}.tmp", name(i)));
        std::fs::write(&tmp, &bytes).unwrap();
        std::fs::rename(&tmp, dir.join(name(i))).unwrap();
    }
    let cut = "checkpoint-cut_default-counter-2026-11-28T22:45:00Z.tar";
    std::fs::write(dir.join(cut), &bytes[..bytes.len() / 2]).unwrap();

    // The watcher is killed (SIGKILL) once it has stored a few, then started again.
    let metrics = env.path("watch.prom");
    let watch = |extra: &[&str]| {
        let mut args = vec!["--json", "watch", dir.to_str().unwrap(), "--remove", "--settle", "0", "--interval", "1"];
        args.extend_from_slice(extra);
        let mut c = env.cmd(&args);
        c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::null());
        c
    };
    let mut first = watch(&[]).spawn().unwrap();
    let lines = std::io::BufRead::lines(std::io::BufReader::new(first.stdout.take().unwrap()));
    let mut stored_before_kill = 0;
    for line in lines {
        let t: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        if t["outcome"] == "stored" {
            stored_before_kill += 1;
        }
        if stored_before_kill == 5 {
            break;
        }
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let again = watch(&["--once", "--metrics", metrics.to_str().unwrap()]).output().unwrap();
    assert_eq!(again.status.code(), Some(1), "the archive cut short fails the run");
    let taken: Vec<serde_json::Value> =
        String::from_utf8_lossy(&again.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let failed: Vec<_> = taken.iter().filter(|t| t["outcome"] == "failed").collect();
    assert_eq!(failed.len(), 1, "{taken:?}");
    assert_eq!(failed[0]["archive"], cut);

    // Each archive stored once: 20 tags, each set once, and only the one cut short left.
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, [std::ffi::OsString::from(cut)]);
    for i in 0..20 {
        let tag = format!("k8s-pod{i}_default-counter:20261128T2244{i:02}Z");
        let log = env.json(&["log", &tag]);
        let values = log.as_array().or_else(|| log["history"].as_array()).unwrap_or_else(|| panic!("{log}"));
        assert_eq!(values.len(), 1, "{tag} set once: {log}");
        assert_eq!(env.json(&["show", &tag])["meta"]["kind"], "container-checkpoint");
    }
    assert!(
        env.run(&["show", "k8s-cut_default-counter:20261128T224500Z"]).status.code() != Some(0),
        "nothing tagged for the cut archive"
    );
    let prom = std::fs::read_to_string(&metrics).unwrap();
    assert!(prom.contains("gstore_watch_archives_total{outcome=\"failed\"} 1"), "{prom}");
}
