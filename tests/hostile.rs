//! Hostile images and careless use: crafted manifests, planted staging directories, symlinked
//! sources, permanent restore errors and closed pipes (issue 11). Each test failed before its fix.

use gstore_store::format::key::ObjectKey;
use gstore_store::format::manifest::{ChunkRef, Entry, EntryKind, Manifest};
use gstore_store::{ObjectId, Store, StoreLocation, TagRef};
use gstore_tests::*;
use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;

fn entry(path: &str, kind: EntryKind, target: Option<&str>) -> Entry {
    Entry { path: path.into(), kind, mode: 0o755, size: 0, target: target.map(Into::into), chunks: 0 }
}

/// Writes `m` into the env's store as is (no checks) and tags it `tag`; returns its id.
fn plant(env: &Env, m: &Manifest, tag: &str) -> ObjectId {
    let store = Store::open(&StoreLocation::Local(env.store.clone())).unwrap();
    let bytes = m.encode();
    let id = ObjectId::of(&bytes);
    store.put_manifest(&id, bytes).unwrap();
    store.set_tag(&TagRef::parse(tag).unwrap(), id).unwrap();
    id
}

fn crafted(entries: Vec<Entry>) -> Manifest {
    Manifest { created_unix: 1, meta: Default::default(), entries, chunks: vec![] }
}

#[test]
fn manifest_with_entries_below_a_symlink_is_refused_everywhere() {
    let env = Env::new(&[]);
    let outside = env.path("outside");
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("victim.txt"), b"precious").unwrap();
    let evil = crafted(vec![
        entry("a", EntryKind::Symlink, Some(outside.to_str().unwrap())),
        entry("a/victim.txt", EntryKind::Symlink, Some("/x")),
    ]);
    let id = plant(&env, &evil, "evil");
    let verify = env.run(&["verify"]);
    assert!(!verify.status.success(), "verify accepted a manifest writing through a symlink");
    let dest = env.path("dest");
    let err = env.fails(&["restore", "evil", "--to", dest.to_str().unwrap()]);
    assert!(err.contains("lies below \"a\", which is a symlink"), "{err}");
    assert_eq!(fs::read(outside.join("victim.txt")).unwrap(), b"precious");
    assert!(!dest.exists());
    // A manifest uploaded through the server is refused the same way, before it is stored.
    let clean = Env::new(&[]);
    let server = Server::start(&clean.store, &[]);
    let body = env.path("evil.manifest");
    fs::write(&body, evil.encode()).unwrap();
    let key = ObjectKey::Manifest(id).to_string();
    let (status, text) = server.curl("PUT", &format!("/v1/o/{key}"), None, &[], Some(&body));
    assert_eq!(status, 422, "{text}");
    assert!(text.contains("lies below"), "{text}");
    assert!(!clean.store.join(&key).exists());
}

/// Plants something in a staging directory.
type Plant<'a> = dyn Fn(&Path) + 'a;

#[test]
fn planted_staging_directory_is_not_resumed() {
    let env = Env::new(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a.txt"), b"the real content").unwrap();
    env.ok(&["push", src.to_str().unwrap(), "--tag", "img"]);
    let id = env.json(&["show", "img"])["manifest"].as_str().unwrap().to_string();
    let outside = env.path("outside.txt");
    let dest = env.path("dest");
    let staging = env.path(".dest.gstore-partial");
    // Each plant names the manifest in its marker, as an interrupted restore would.
    let plants: [(&str, &Plant<'_>); 3] = [
        ("a symlink where a file goes", &|s| std::os::unix::fs::symlink(&outside, s.join("a.txt")).unwrap()),
        ("an unknown set-uid file", &|s| {
            fs::write(s.join("extra"), b"#!/bin/sh\n").unwrap();
            fs::set_permissions(s.join("extra"), fs::Permissions::from_mode(0o4755)).unwrap();
        }),
        ("a directory others may write", &|s| {
            fs::set_permissions(s, fs::Permissions::from_mode(0o777)).unwrap();
            fs::write(s.join("a.txt"), b"planted!").unwrap();
        }),
    ];
    for (what, plant) in plants {
        fs::write(&outside, b"outside, keep me").unwrap();
        fs::create_dir(&staging).unwrap();
        fs::set_permissions(&staging, fs::Permissions::from_mode(0o700)).unwrap();
        fs::write(staging.join(".gstore-restore"), &id).unwrap();
        plant(&staging);
        env.ok(&["restore", "img", "--to", dest.to_str().unwrap()]);
        assert_same_tree(&src, &dest);
        assert_eq!(fs::read(&outside).unwrap(), b"outside, keep me", "{what}");
        assert!(!staging.exists(), "{what}");
        fs::remove_dir_all(&dest).unwrap();
    }
}

#[test]
fn a_symlink_given_as_the_source_is_followed() {
    let env = Env::new(&[]);
    let file = env.path("weights.bin");
    fs::write(&file, random_bytes(300_000, 3)).unwrap();
    let link = env.path("link.bin");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    let pushed = env.json(&["push", link.to_str().unwrap(), "--tag", "linked"]);
    assert_eq!(pushed["logical_bytes"], 300_000, "{pushed}");
    let dest = env.path("dest");
    env.ok(&["restore", "linked", "--to", dest.to_str().unwrap()]);
    let restored = dest.join("link.bin");
    assert!(fs::symlink_metadata(&restored).unwrap().file_type().is_file());
    assert_eq!(fs::read(&restored).unwrap(), fs::read(&file).unwrap());
}

#[test]
fn chunk_count_overflow_is_a_clear_error_not_a_panic() {
    let env = Env::new(&[]);
    let src = env.path("src");
    make_tree(&src, 4, 50_000);
    env.ok(&["push", src.to_str().unwrap(), "--tag", "good"]);
    let mut m = crafted(vec![entry("x", EntryKind::File, None), entry("y", EntryKind::File, None)]);
    for e in &mut m.entries {
        e.chunks = 1 << 63;
    }
    plant(&env, &m, "overflow");
    let dest = env.path("dest");
    for args in [
        vec!["ls"],
        vec!["show", "overflow"],
        vec!["du"],
        vec!["verify"],
        vec!["restore", "overflow", "--to", dest.to_str().unwrap()],
        vec!["gc", "--dry-run"],
    ] {
        let o = env.run(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        let said = format!("{}{err}", String::from_utf8_lossy(&o.stdout));
        assert_ne!(o.status.code(), Some(101), "{args:?} panicked: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        if !o.status.success() {
            assert!(said.contains("chunk table holds 0 bytes"), "{args:?}: {said}");
        }
    }
    assert!(env.fails(&["show", "overflow"]).contains("chunk table holds 0 bytes"));
    // The good image is untouched and still restores.
    env.ok(&["restore", "good", "--to", dest.to_str().unwrap()]);
    assert_same_tree(&src, &dest);
    // Through the server such a manifest is refused as bad input, not with a panic.
    let server = Server::start(&env.store, &[]);
    let body = env.path("overflow.manifest");
    fs::write(&body, m.encode()).unwrap();
    let key = ObjectKey::Manifest(ObjectId::of(&m.encode())).to_string();
    let (status, text) = server.curl("PUT", &format!("/v1/o/{key}"), None, &[], Some(&body));
    assert_eq!(status, 422, "{text}");
    assert!(text.contains("chunk table holds 0 bytes") && !text.contains("panicked"), "{text}");
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let env = Env::new(&[]);
    let src = env.path("many");
    fs::create_dir_all(&src).unwrap();
    for i in 0..3000 {
        fs::write(src.join(format!("file-{i:05}")), i.to_string()).unwrap();
    }
    env.ok(&["push", src.to_str().unwrap(), "--tag", "many"]);
    for args in [vec!["show", "many"], vec!["ls"], vec!["--json", "show", "many"]] {
        // The reader reads one byte, then goes away (as `| head -c1` does).
        let mut child = env.cmd(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let mut one = [0u8; 1];
        child.stdout.take().unwrap().read_exact(&mut one).unwrap();
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{args:?}: {:?} {err}", o.status);
        assert!(err.is_empty(), "{args:?}: {err}");
    }
}

#[test]
fn permanent_restore_errors_are_not_called_resumable() {
    let env = Env::new(&[]);
    let long = "n".repeat(300);
    let mut file = entry(&long, EntryKind::File, None);
    file.size = 4096;
    file.chunks = 1;
    let mut m = crafted(vec![file]);
    m.chunks = vec![ChunkRef { id: ObjectId::of(&[0u8; 4096]), len: 4096, zero: true }];
    plant(&env, &m, "long");
    let dest = env.path("dest");
    let err = env.fails(&["restore", "long", "--to", dest.to_str().unwrap()]);
    assert!(err.contains("File name too long"), "{err}");
    assert!(!err.contains("resume"), "{err}");
    assert!(!env.path(".dest.gstore-partial").exists(), "staging kept for a restore that can never finish");
    assert!(!dest.exists());
}

#[test]
fn the_server_refuses_new_tags_that_read_as_manifest_ids() {
    let env = Env::new(&[]);
    let src = env.path("f");
    fs::write(&src, b"data").unwrap();
    env.ok(&["push", src.to_str().unwrap(), "--tag", "ok"]);
    let id = env.json(&["show", "ok"])["manifest"].as_str().unwrap().to_string();
    // A well-formed record for a tag named like the manifest id, as a raw client would send.
    let mut rec: serde_json::Value =
        serde_json::from_slice(&fs::read(env.store.join("tags/ok/latest.tag")).unwrap()).unwrap();
    rec["name"] = id.clone().into();
    let body = env.path("rec.json");
    fs::write(&body, serde_json::to_vec(&rec).unwrap()).unwrap();
    let server = Server::start(&env.store, &[]);
    let key = format!("/v1/o/tags/{id}/latest.tag");
    for headers in [&["If-None-Match: *"][..], &[][..]] {
        let (status, text) = server.curl("PUT", &key, None, headers, Some(&body));
        assert_eq!(status, 422, "{headers:?}: {text}");
        assert!(text.contains("would read as a manifest id"), "{text}");
    }
    assert!(!env.store.join("tags").join(&id).exists());
}

/// An archive holding `link -> /tmp` and then `link/f`, pushed as a file and on stdin: the
/// push is refused before it tags anything (exit 2), and a manifest of that shape already in
/// the store (written by an older version) does not stop gc: its chunks are kept.
#[test]
fn streamed_push_below_a_symlink_tags_nothing_and_gc_goes_on() {
    let env = Env::new(&[]);
    let (one, two) = (env.path("one"), env.path("two"));
    fs::create_dir_all(two.join("link")).unwrap();
    fs::create_dir_all(&one).unwrap();
    std::os::unix::fs::symlink("/tmp", one.join("link")).unwrap();
    fs::write(two.join("link/f"), b"written through the link").unwrap();
    // A container checkpoint archive (its config.dump first), which `push FILE` takes entry by
    // entry, as `push -` takes any archive.
    fs::write(two.join("config.dump"), b"{}").unwrap();
    let tar = env.path("x.tar");
    let made = std::process::Command::new("tar")
        .args(["-cf", tar.to_str().unwrap(), "-C", two.to_str().unwrap(), "config.dump"])
        .args(["-C", one.to_str().unwrap(), "link", "-C", two.to_str().unwrap(), "link/f"])
        .status()
        .unwrap();
    assert!(made.success());
    let o = env.run(&["push", tar.to_str().unwrap(), "--tag", "a:1"]);
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("lies below \"link\""), "{o:?}");
    let o = env.cmd(&["push", "-", "--tag", "a:2"]).stdin(fs::File::open(&tar).unwrap()).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    let tags = env.json(&["ls"]).to_string();
    assert!(!tags.contains("a:1") && !tags.contains("\"a\""), "a refused push tagged: {tags}");

    // One planted the old way, beside a good image whose chunks it shares.
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    write_mixed_file(&src.join("data"), 300_000, 7);
    env.ok(&["push", src.to_str().unwrap(), "--tag", "good:1"]);
    let store = Store::open(&StoreLocation::Local(env.store.clone())).unwrap();
    let good = store
        .get_manifest(&ObjectId::from_hex(env.json(&["show", "good:1"])["manifest"].as_str().unwrap()).unwrap())
        .unwrap();
    let mut evil =
        crafted(vec![entry("link", EntryKind::Symlink, Some("/tmp")), entry("link/f", EntryKind::File, None)]);
    evil.entries[1].chunks = good.chunks.len() as u64;
    evil.entries[1].size = good.chunks.iter().map(|c| c.len as u64).sum();
    evil.chunks = good.chunks.clone();
    let id = plant(&env, &evil, "old:1");
    env.ok(&["rm", "good:1"]);
    for _ in 0..2 {
        let gc = env.json(&["gc"]);
        let refused = gc["refused_manifests"].to_string();
        assert!(refused.contains(&id.to_hex()) && refused.contains("lies below"), "{gc}");
    }
    // Its chunks were kept: an image naming the same chunks reads back the original bytes.
    let mut again = crafted(vec![entry("f", EntryKind::File, None)]);
    again.entries[0].chunks = evil.chunks.len() as u64;
    again.entries[0].size = evil.entries[1].size;
    again.chunks = evil.chunks.clone();
    plant(&env, &again, "again:1");
    let cat = env.run(&["cat", "again:1", "f"]);
    assert!(cat.status.success(), "gc deleted chunks a refused manifest names: {cat:?}");
    assert_eq!(cat.stdout, fs::read(src.join("data")).unwrap());
}

/// `podman container checkpoint --export=/dev/stdout | gstore push -`: podman writes the
/// container's name after the tar. gstore reads its input to the end, so the writer is not
/// killed by SIGPIPE (PIPESTATUS was `141 0` before, failing the pipeline under pipefail).
#[test]
fn push_from_a_pipe_reads_past_the_end_of_the_tar() {
    let env = Env::new(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), b"contents").unwrap();
    let tar = env.path("x.tar");
    let made = std::process::Command::new("tar")
        .args(["-cf", tar.to_str().unwrap(), "-C", src.to_str().unwrap(), "f"])
        .status()
        .unwrap();
    assert!(made.success());
    // More than a pipe holds follows the tar, so a reader that stops early leaves the writer
    // blocked, then killed when the reader exits.
    let script = format!(
        "set -o pipefail; (cat {tar}; head -c 4000000 /dev/zero | tr '\\0' w) | {bin} --store {store} push - --tag web:4; echo \"${{PIPESTATUS[@]}}\"",
        tar = tar.display(),
        bin = gstore_bin().display(),
        store = env.store.display()
    );
    let o = std::process::Command::new("bash").args(["-c", &script]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.trim_end().ends_with("0 0"), "pipeline statuses: {out}\n{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(env.ok(&["cat", "web:4", "f"]), "contents");
}
