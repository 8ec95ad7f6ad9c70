//! Encrypted stores (issue 20, docs/SECURITY.md): everything works with the key, nothing
//! without it, and the bucket holds no plain text; changed, moved and swapped objects, a
//! replaced config and wrong or removed keys are each refused clearly.

use gstore_tests::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Text planted in the pushed tree: found in an unencrypted store's files, never in an
/// encrypted one's.
const MARKER: &[u8] = b"api_token=sk-live-4f1c9a7e-gstore-secret-marker";

/// A tree with the marker planted in incompressible bytes (which an unencrypted store keeps
/// as they are, so the marker shows there).
fn tree_with_marker(root: &Path) {
    make_tree(root, 7, 3 << 20);
    let mut bytes = random_bytes(1 << 20, 11);
    for at in (0..bytes.len() - MARKER.len()).step_by(100_000) {
        bytes[at..at + MARKER.len()].copy_from_slice(MARKER);
    }
    fs::write(root.join("heap.bin"), &bytes).unwrap();
}

/// Every file of the store but its local index (a cache of chunk locations on this machine).
fn store_files(store: &Path) -> Vec<PathBuf> {
    files_below(store).into_iter().filter(|p| !p.starts_with(store.join("index"))).collect()
}

fn holds_marker(files: &[PathBuf]) -> bool {
    files.iter().any(|f| fs::read(f).unwrap().windows(MARKER.len()).any(|w| w == MARKER))
}

/// `gstore` on `env`'s store with the key file `key` (none: no key in the environment).
fn with_key(env: &Env, key: Option<&Path>, args: &[&str]) -> Command {
    let mut c = env.cmd(args);
    c.env_remove("GSTORE_KEY_FILE").env_remove("GSTORE_PASSPHRASE");
    if let Some(k) = key {
        c.env("GSTORE_KEY_FILE", k);
    }
    c
}

/// Runs `c`, asserts success, returns stdout.
fn ok(mut c: Command) -> String {
    let o = c.output().unwrap();
    assert!(o.status.success(), "{c:?} failed:\n{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// Runs `c`, asserts failure, returns what it printed (stdout, then stderr).
fn fails(mut c: Command) -> String {
    let o = c.output().unwrap();
    assert!(!o.status.success(), "{c:?} succeeded but should fail:\n{}", String::from_utf8_lossy(&o.stdout));
    String::from_utf8([o.stdout, o.stderr].concat()).unwrap()
}

/// An empty encrypted store in a scratch dir, and its first key file.
fn encrypted_store() -> (Env, PathBuf) {
    let env = Env::uninitialized();
    let key = env.path("store.key");
    ok(with_key(&env, None, &["key", "generate", key.to_str().unwrap()]));
    ok(with_key(&env, Some(&key), &["init", "--encrypt"]));
    (env, key)
}

/// An encrypted store in a scratch dir, its first key file and a pushed tree (`app:v1`).
fn encrypted_env() -> (Env, PathBuf, PathBuf) {
    let (env, key) = encrypted_store();
    let src = env.path("src");
    tree_with_marker(&src);
    ok(with_key(&env, Some(&key), &["push", src.to_str().unwrap(), "--tag", "app:v1"]));
    (env, key, src)
}

/// An encrypted store in a bucket of a real S3 server, and its key file.
struct EncryptedS3 {
    s3: S3,
    key: PathBuf,
}

impl EncryptedS3 {
    /// Starts the server and makes the store (`init --encrypt` on machine "a").
    fn start() -> EncryptedS3 {
        let s3 = S3::start();
        let key = s3.tmp.path().join("store.key");
        fs::write(&key, format!("{}\n", "ab".repeat(32))).unwrap();
        let e = EncryptedS3 { s3, key };
        ok(e.cmd("a", &["init", "--encrypt"]));
        e
    }

    /// `gstore ARGS` on the store, as machine `machine`, with the key.
    fn cmd(&self, machine: &str, args: &[&str]) -> Command {
        let mut c = self.s3.cmd(machine, args);
        c.env("GSTORE_KEY_FILE", &self.key);
        c
    }
}

#[test]
fn an_encrypted_store_works_with_its_key_and_keeps_no_plain_text() {
    let (env, key, src) = encrypted_env();
    let k = Some(key.as_path());
    let out = env.path("out");
    ok(with_key(&env, k, &["restore", "app:v1", "--to", out.to_str().unwrap()]));
    assert_same_tree(&src, &out);
    // A second image deduplicates against the first inside the encrypted store.
    let pushed = serde_json::from_str::<serde_json::Value>(&ok(with_key(
        &env,
        k,
        &["--json", "push", src.to_str().unwrap(), "--tag", "app:v2"],
    )))
    .unwrap();
    assert_eq!(pushed["new_chunks"], 0, "{pushed}");
    ok(with_key(&env, k, &["verify", "--read-data"]));
    ok(with_key(&env, k, &["rm", "app:v2"]));
    ok(with_key(&env, k, &["gc"]));
    ok(with_key(&env, k, &["index", "rebuild"]));
    let again = env.path("again");
    ok(with_key(&env, k, &["restore", "app:v1", "--to", again.to_str().unwrap()]));
    assert_same_tree(&src, &again);
    assert!(ok(with_key(&env, k, &["ls"])).contains("app"));
    assert!(!holds_marker(&store_files(&env.store)), "plain text in an encrypted store");

    // The same tree in an unencrypted store: the marker is there to be found.
    let plain = Env::new(&[]);
    plain.ok(&["push", src.to_str().unwrap(), "--tag", "app:v1"]);
    assert!(holds_marker(&store_files(&plain.store)), "the check above could not fail");
}

#[test]
fn a_store_opens_with_any_of_its_keys_and_with_no_other() {
    let (env, key, _) = encrypted_env();
    let err = fails(with_key(&env, None, &["ls"]));
    assert!(err.contains("is encrypted: give its key"), "{err}");
    assert_eq!(with_key(&env, None, &["ls"]).output().unwrap().status.code(), Some(2), "a usage error");
    let other = env.path("other.key");
    ok(with_key(&env, None, &["key", "generate", other.to_str().unwrap()]));
    let err = fails(with_key(&env, Some(&other), &["ls"]));
    assert!(err.contains("does not open"), "{err}");
    assert!(fails(with_key(&env, None, &["key", "generate", other.to_str().unwrap()])).contains("creating key file"));
    // A key in the environment and no --encrypt: no unencrypted store is made by mistake.
    let plain = Env::uninitialized();
    assert!(fails(with_key(&plain, Some(&key), &["init"])).contains("--encrypt is not given"));
    assert!(!plain.store.join("config.json").exists());

    // A passphrase added as a second key opens the same store.
    let mut add = with_key(&env, Some(&key), &["--json", "key", "add"]);
    add.env("GSTORE_NEW_PASSPHRASE", "correct horse battery staple");
    let added: serde_json::Value = serde_json::from_str(&ok(add)).unwrap();
    let by_pass = |args: &[&str]| {
        let mut c = with_key(&env, None, args);
        c.env("GSTORE_PASSPHRASE", "correct horse battery staple");
        c
    };
    assert!(ok(by_pass(&["ls"])).contains("app"));
    let mut wrong = with_key(&env, None, &["ls"]);
    wrong.env("GSTORE_PASSPHRASE", "correct horse battery stapler");
    assert!(fails(wrong).contains("does not open"));

    // The first key removed (by the passphrase): it opens nothing any more; the passphrase
    // still does, and the last key is never removed.
    let keys: serde_json::Value =
        serde_json::from_str(&ok(with_key(&env, Some(&key), &["--json", "key", "list"]))).unwrap();
    assert_eq!(keys.as_array().unwrap().len(), 2, "{keys}");
    let first =
        keys.as_array().unwrap().iter().map(|k| k["id"].as_str().unwrap()).find(|id| *id != added["added"]).unwrap();
    ok(by_pass(&["key", "remove", first]));
    assert!(fails(with_key(&env, Some(&key), &["ls"])).contains("does not open"));
    let out = env.path("out");
    ok(by_pass(&["restore", "app:v1", "--to", out.to_str().unwrap()]));
    let err = fails(by_pass(&["key", "remove", added["added"].as_str().unwrap()]));
    assert!(err.contains("last key"), "{err}");
}

/// The sealed object files under `dir` of the store (e.g. "packs").
fn objects(env: &Env, dir: &str) -> Vec<PathBuf> {
    files_below(&env.store.join(dir))
}

#[test]
fn changed_moved_and_swapped_objects_and_a_replaced_config_are_refused() {
    let (env, key, src) = encrypted_env();
    let k = Some(key.as_path());
    // A flipped byte in a pack: restore and verify name the damage; nothing is restored wrong.
    let packs = objects(&env, "packs");
    let mut bytes = fs::read(&packs[0]).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    let saved = fs::read(&packs[0]).unwrap();
    fs::write(&packs[0], &bytes).unwrap();
    let err = fails(with_key(&env, k, &["restore", "app:v1", "--to", env.path("o1").to_str().unwrap()]));
    assert!(err.contains("fails its authentication"), "{err}");
    let restore = with_key(&env, k, &["restore", "app:v1", "--to", env.path("o1b").to_str().unwrap()]).output();
    assert_eq!(restore.unwrap().status.code(), Some(4), "damage");
    assert!(fails(with_key(&env, k, &["verify", "--read-data"])).contains("authentication"));
    fs::write(&packs[0], &saved).unwrap();

    // One tag's record moved under another tag's name.
    ok(with_key(&env, k, &["push", env.path("src/sub").to_str().unwrap(), "--tag", "other:v1"]));
    let app = env.store.join("tags/app/v1.tag");
    let other = env.store.join("tags/other/v1.tag");
    let other_saved = fs::read(&other).unwrap();
    fs::copy(&app, &other).unwrap();
    let err = fails(with_key(&env, k, &["restore", "other:v1", "--to", env.path("o2").to_str().unwrap()]));
    assert!(err.contains("fails its authentication"), "{err}");
    fs::write(&other, &other_saved).unwrap();

    // Stored bytes moved between packs: two packs swapped under each other's names, and one
    // block of a pack put in place of another pack's block.
    let extra = env.path("extra");
    fs::create_dir_all(&extra).unwrap();
    fs::write(extra.join("heap.bin"), random_bytes(1 << 20, 99)).unwrap();
    ok(with_key(&env, k, &["push", extra.to_str().unwrap(), "--tag", "extra:v1"]));
    let packs = objects(&env, "packs");
    assert_eq!(packs.len(), 2, "{packs:?}");
    let (p0, p1) = (fs::read(&packs[0]).unwrap(), fs::read(&packs[1]).unwrap());
    fs::write(&packs[0], &p1).unwrap();
    fs::write(&packs[1], &p0).unwrap();
    // Packs of other lengths: the one read first is too short for its footer's ranges (the
    // other's blocks would fail their authentication, below); either way it is named corrupt.
    for tag in ["app:v1", "extra:v1"] {
        let err =
            fails(with_key(&env, k, &["restore", tag, "--to", env.path(&format!("swap-{tag}")).to_str().unwrap()]));
        assert!(err.contains("corrupt") && err.contains(".pack"), "{tag}: {err}");
    }
    let block = 48..48 + 16 * 1024 + 16;
    let mut transplanted = p0.clone();
    transplanted[block.clone()].copy_from_slice(&p1[block]);
    fs::write(&packs[0], &transplanted).unwrap();
    fs::write(&packs[1], &p1).unwrap();
    assert!(fails(with_key(&env, k, &["verify", "--read-data"])).contains("block 0 fails its authentication"));
    fs::write(&packs[0], &p0).unwrap();

    // Every manifest put under another's name (rotated).
    let manifests = objects(&env, "manifests");
    assert_eq!(manifests.len(), 3);
    let saved: Vec<Vec<u8>> = manifests.iter().map(|m| fs::read(m).unwrap()).collect();
    for (i, m) in manifests.iter().enumerate() {
        fs::write(m, &saved[(i + 1) % saved.len()]).unwrap();
    }
    let err = fails(with_key(&env, k, &["restore", "app:v1", "--to", env.path("o3").to_str().unwrap()]));
    assert!(err.contains("fails its authentication"), "{err}");
    for (m, bytes) in manifests.iter().zip(&saved) {
        fs::write(m, bytes).unwrap();
    }

    // The config replaced: by an unencrypted one (gstore would then write plain objects), or
    // with a setting changed.
    let config = env.store.join("config.json");
    let saved = fs::read_to_string(&config).unwrap();
    let plain = Env::new(&[]);
    fs::copy(plain.store.join("config.json"), &config).unwrap();
    let err = fails(with_key(&env, None, &["push", src.to_str().unwrap(), "--tag", "app:v3"]));
    assert!(err.contains("holds key records"), "{err}");
    assert!(fails(with_key(&env, k, &["ls"])).contains("holds key records"));
    // The key records deleted as well: a user who gives a key is still refused.
    fs::rename(env.store.join("keys"), env.path("keys-aside")).unwrap();
    assert!(fails(with_key(&env, k, &["ls"])).contains("not encrypted, but GSTORE_KEY_FILE"));
    fs::rename(env.path("keys-aside"), env.store.join("keys")).unwrap();
    fs::write(&config, saved.replace("\"zstd_level\": 1", "\"zstd_level\": 19")).unwrap();
    let err = fails(with_key(&env, k, &["ls"]));
    assert!(err.contains("config.json was changed"), "{err}");
    fs::write(&config, &saved).unwrap();

    // Put back, everything reads again.
    let out = env.path("out");
    ok(with_key(&env, k, &["restore", "app:v1", "--to", out.to_str().unwrap()]));
    assert_same_tree(&src, &out);
}

#[test]
fn an_encrypted_store_on_s3_holds_no_plain_text() {
    let (s3, tmp) = (EncryptedS3::start(), tempfile::tempdir().unwrap());
    let src = tmp.path().join("src");
    tree_with_marker(&src);
    ok(s3.cmd("a", &["push", src.to_str().unwrap(), "--tag", "app:v1"]));
    let out = tmp.path().join("out");
    ok(s3.cmd("b", &["restore", "app:v1", "--to", out.to_str().unwrap()]));
    assert_same_tree(&src, &out);
    let bucket = files_below(&s3.s3.bucket_dir());
    assert!(bucket.iter().any(|f| f.to_string_lossy().contains("/packs/")), "objects in the bucket");
    assert!(!holds_marker(&bucket), "plain text in the bucket");
    let err = String::from_utf8(s3.s3.cmd("c", &["ls"]).output().unwrap().stderr).unwrap();
    assert!(err.contains("is encrypted"), "{err}");
}

#[test]
fn a_server_keeps_an_encrypted_store_without_its_key() {
    let (env, key) = encrypted_store();
    let server = Server::start(&env.store, &[]);
    let src = env.path("src");
    tree_with_marker(&src);
    let client = |machine: &str, args: &[&str]| {
        let mut c = server.cmd(machine, "", args);
        c.env("GSTORE_KEY_FILE", &key);
        c
    };
    ok(client("a", &["push", src.to_str().unwrap(), "--tag", "app:v1"]));
    let out = env.path("out");
    ok(client("b", &["restore", "app:v1", "--to", out.to_str().unwrap()]));
    assert_same_tree(&src, &out);
    assert!(!holds_marker(&store_files(&env.store)), "plain text in the served store");
    let mut no_key = server.cmd("c", "", &["ls"]);
    no_key.env_remove("GSTORE_KEY_FILE");
    assert!(fails(no_key).contains("is encrypted"));
    // The server cannot find chunks by id without the key, and says so.
    let (status, body) = server.curl("GET", &format!("/v1/chunks/{}", "00".repeat(32)), None, &[], None);
    assert_eq!(status, 409, "{body}");
    // A plain object where a sealed one belongs is refused before it is stored.
    let bogus = env.path("bogus");
    fs::write(&bogus, br#"{"tag":"x"}"#).unwrap();
    let (status, body) = server.curl("PUT", "/v1/o/tags/evil/v1.tag", None, &[], Some(&bogus));
    assert_eq!(status, 422, "{body}");
    // Packs are written once: another sealed object under an existing pack's key (framed as
    // one, all the server can check) is refused, the same bytes again are fine.
    let src2 = env.path("src2");
    make_tree(&src2, 46, 200_000);
    ok(client("a", &["push", src2.to_str().unwrap(), "--tag", "app:v2"]));
    let packs = env.packs();
    assert!(packs.len() >= 2, "{packs:?}");
    let key = packs[0].strip_prefix(&env.store).unwrap().to_str().unwrap().to_string();
    let before = fs::read(&packs[0]).unwrap();
    let (status, body) = server.curl("PUT", &format!("/v1/o/{key}"), None, &[], Some(&packs[1]));
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("written once"), "{body}");
    let (status, body) = server.curl("PUT", &format!("/v1/o/{key}"), None, &[], Some(&packs[0]));
    assert_eq!(status, 200, "{body}");
    assert_eq!(fs::read(&packs[0]).unwrap(), before);
    ok(client("b", &["verify", "--read-data"]));
}

#[test]
fn a_process_checkpointed_into_an_encrypted_store_runs_on_after_a_lazy_restore() {
    let (env, key) = encrypted_store();
    let criu = criu_args();
    let c = PyCounter::start(3);
    let pid = c.pid.to_string();
    ok(with_key(&env, Some(&key), &with_criu(&["checkpoint", "--pid", &pid, "--tag", "counter"], &criu)));
    let at_dump = c.value().unwrap();
    c.wait_gone();
    assert!(fails(with_key(&env, None, &with_criu(&["restore", "counter", "--run"], &criu))).contains("is encrypted"));
    assert!(!c.alive(), "nothing restored without the key");
    let r: serde_json::Value = serde_json::from_str(&ok(with_key(
        &env,
        Some(&key),
        &with_criu(&["--json", "restore", "counter", "--run"], &criu),
    )))
    .unwrap();
    assert_eq!(r["pid"].as_u64().unwrap(), c.pid as u64);
    assert!(c.wait_above(at_dump) > at_dump);
    assert!(c.alive());
}

#[test]
fn a_tag_rolled_back_in_the_bucket_is_refused_where_a_newer_value_was_seen() {
    let (s3, tmp) = (EncryptedS3::start(), tempfile::tempdir().unwrap());
    let cmd = |machine: &str, args: &[&str]| s3.cmd(machine, args);
    let (one, two) = (tmp.path().join("one"), tmp.path().join("two"));
    tree_with_marker(&one);
    make_tree(&two, 9, 1 << 20);
    ok(cmd("a", &["push", one.to_str().unwrap(), "--tag", "app"]));
    let record = s3.s3.bucket_dir().join("images/tags/app/latest.tag");
    let old = fs::read(&record).unwrap();
    ok(cmd("a", &["push", two.to_str().unwrap(), "--tag", "app"]));
    let new = fs::read(&record).unwrap();

    // The older sealed record put back: machine a saw the newer value and refuses it.
    fs::write(&record, &old).unwrap();
    let err = fails(cmd("a", &["restore", "app", "--to", tmp.path().join("o1").to_str().unwrap()]));
    assert!(err.contains("rolled back"), "{err}");
    let err = fails(cmd("a", &["push", two.to_str().unwrap(), "--tag", "app"]));
    assert!(err.contains("rolled back"), "a push onto the rolled-back tag: {err}");
    // A machine that never saw the newer value cannot tell (docs/SECURITY.md).
    let out = tmp.path().join("o2");
    ok(cmd("b", &["restore", "app", "--to", out.to_str().unwrap()]));
    assert_same_tree(&one, &out);

    // Put back, the newest value reads everywhere.
    fs::write(&record, &new).unwrap();
    let out = tmp.path().join("o3");
    ok(cmd("a", &["restore", "app", "--to", out.to_str().unwrap()]));
    assert_same_tree(&two, &out);
}

/// The chunk id of the one-chunk file `sub/deeper/tiny` (b"x") of image `app:v1` in `store`.
fn tiny_chunk_id(store: &gstore_store::Store) -> gstore_store::ObjectId {
    let m = store.get_manifest(&store.resolve("app:v1").unwrap()).unwrap();
    let (_, chunks) = m.files().find(|(e, _)| e.path == "sub/deeper/tiny").unwrap();
    chunks[0].id
}

#[test]
fn an_encrypted_store_names_chunks_by_keyed_hashes() {
    use gstore_store::{ChunkIds, ObjectId, Store, StoreLocation};
    let (env, key, _) = encrypted_env();
    // Each test runs in its own process: the store opens with the key from the environment.
    std::env::set_var("GSTORE_KEY_FILE", &key);
    let store = Store::open(&StoreLocation::Local(env.store.clone())).unwrap();
    assert!(matches!(store.chunk_ids(), ChunkIds::Keyed(_)));
    let id = tiny_chunk_id(&store);
    assert_ne!(id, ObjectId::of(b"x"), "a plain BLAKE3 id would tell what the chunk holds");
    assert_eq!(id, store.chunk_ids().id(b"x"));
    std::env::remove_var("GSTORE_KEY_FILE");
    let plain = Env::new(&[]);
    let src = env.path("src");
    plain.ok(&["push", src.to_str().unwrap(), "--tag", "app:v1"]);
    let store = Store::open(&StoreLocation::Local(plain.store.clone())).unwrap();
    assert_eq!(tiny_chunk_id(&store), ObjectId::of(b"x"), "an unencrypted store's ids are plain BLAKE3");
}

#[test]
fn images_are_not_copied_between_stores_that_name_chunks_differently() {
    let (env, key, _) = encrypted_env();
    // Another encrypted store opened by the same key file has its own master key, so its own ids.
    let other = Env::uninitialized();
    ok(with_key(&other, Some(&key), &["init", "--encrypt"]));
    let err = fails(with_key(&env, Some(&key), &["copy", "app:v1", "--to", other.store.to_str().unwrap()]));
    assert!(err.contains("name chunks differently"), "{err}");
    // Nor into a plain store: said the same way, not "unset the key".
    let plain = Env::new(&[]);
    let err = fails(with_key(&env, Some(&key), &["copy", "app:v1", "--to", plain.store.to_str().unwrap()]));
    assert!(err.contains("name chunks differently") && err.contains("restore the image and push it"), "{err}");
    assert!(!err.contains("unset"), "{err}");
}

#[test]
fn verify_without_the_key_checks_the_framing_of_every_sealed_object() {
    let (env, key, _) = encrypted_env();
    let r: serde_json::Value = serde_json::from_str(&ok(with_key(&env, None, &["--json", "verify"]))).unwrap();
    assert!(r["objects_checked"].as_u64().unwrap() >= 3, "{r}");
    assert_eq!(r["key_records"], 1);
    // A pack cut short: found without the key; the full check with it finds it too.
    let pack = &objects(&env, "packs")[0];
    let bytes = fs::read(pack).unwrap();
    fs::write(pack, &bytes[..bytes.len() - 100]).unwrap();
    let err = fails(with_key(&env, None, &["verify"]));
    assert!(err.contains("but its header says"), "{err}");
    assert!(fails(with_key(&env, Some(&key), &["verify"])).contains("DAMAGED"));
}

/// The ids of the store's key records (`gstore key list`, no key needed).
fn key_ids(env: &Env) -> Vec<String> {
    let list: serde_json::Value = serde_json::from_str(&ok(with_key(env, None, &["--json", "key", "list"]))).unwrap();
    list.as_array().unwrap().iter().map(|k| k["id"].as_str().unwrap().to_string()).collect()
}

/// `gstore ARGS` on `env`'s store with passphrase `pass` (argon2id: each unlock takes a while,
/// so two commands started together reach the store at about the same moment).
fn with_passphrase(env: &Env, pass: &str, args: &[&str]) -> Command {
    let mut c = with_key(env, None, args);
    c.env("GSTORE_PASSPHRASE", pass);
    c
}

#[test]
fn two_key_removals_at_once_leave_a_key_that_opens_the_store() {
    for round in 0..3 {
        let env = Env::uninitialized();
        ok(with_passphrase(&env, "first secret", &["init", "--encrypt"]));
        let mut add = with_passphrase(&env, "first secret", &["--json", "key", "add"]);
        add.env("GSTORE_NEW_PASSPHRASE", "second secret");
        let added: serde_json::Value = serde_json::from_str(&ok(add)).unwrap();
        let b = added["added"].as_str().unwrap().to_string();
        let a = key_ids(&env).into_iter().find(|id| *id != b).unwrap();
        // Each removes the other's record, at the same moment.
        let mut one = with_passphrase(&env, "second secret", &["key", "remove", &a]).spawn().unwrap();
        let mut two = with_passphrase(&env, "first secret", &["key", "remove", &b]).spawn().unwrap();
        let done = [one.wait().unwrap().success(), two.wait().unwrap().success()];
        assert_eq!(done.iter().filter(|d| **d).count(), 1, "round {round}: {done:?}");
        assert_eq!(key_ids(&env).len(), 1, "round {round}");
        let left = if done[0] { "second secret" } else { "first secret" };
        ok(with_passphrase(&env, left, &["ls"]));
    }
}

#[test]
fn an_init_that_loses_the_race_leaves_no_key_record() {
    for round in 0..3 {
        let env = Env::uninitialized();
        let (k1, k2) = (env.path("k1"), env.path("k2"));
        for k in [&k1, &k2] {
            ok(with_key(&env, None, &["key", "generate", k.to_str().unwrap()]));
        }
        let mut one = with_key(&env, Some(&k1), &["init", "--encrypt"]).spawn().unwrap();
        let mut two = with_key(&env, Some(&k2), &["init", "--encrypt"]).spawn().unwrap();
        let done = [one.wait().unwrap().success(), two.wait().unwrap().success()];
        assert_eq!(done.iter().filter(|d| **d).count(), 1, "round {round}: {done:?}");
        let ids = key_ids(&env);
        assert_eq!(ids.len(), 1, "round {round}: {ids:?}");
        let winner = if done[0] { &k1 } else { &k2 };
        // The one record is the store's last key: never removed.
        let err = fails(with_key(&env, Some(winner), &["key", "remove", &ids[0]]));
        assert!(err.contains("last key"), "{err}");
        ok(with_key(&env, Some(winner), &["ls"]));
    }
}
