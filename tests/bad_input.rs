//! Bad input gets a clear error and loses nothing.

use gstore_tests::*;
use std::fs;

#[test]
fn unknown_tag_and_bad_tag_names() {
    let env = Env::new(&[]);
    assert!(env
        .fails(&["restore", "nope", "--to", env.path("o").to_str().unwrap()])
        .contains("tag not found: nope:latest"));
    assert!(env.fails(&["show", "nope:v9"]).contains("tag not found: nope:v9"));
    // `log NAME` means every version: the name is what is missing.
    let err = env.fails(&["log", "nope"]);
    assert!(err.contains("tag name not found: nope (") && !err.contains("nope:latest"), "{err}");
    // Too few digits for an image id: said so.
    let err = env.fails(&["show", "1c06"]);
    assert!(err.contains("8 or more hex digits"), "{err}");
    let src = env.path("f");
    fs::write(&src, b"data").unwrap();
    for bad in ["../evil", "a/b", "x:y:z", "", ".hidden", "bad\u{0}name"] {
        let args = ["push", src.to_str().unwrap(), "--tag", bad];
        let o = env.cmd(&args).output();
        // A NUL cannot even be passed as an argument; everything else must be refused by gstore.
        if let Ok(o) = o {
            assert!(!o.status.success(), "tag {bad:?} accepted");
            assert!(
                String::from_utf8_lossy(&o.stderr).contains("invalid tag"),
                "{}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
    assert!(!env.store.join("tags").exists() || fs::read_dir(env.store.join("tags")).unwrap().next().is_none());
}

#[test]
fn unreadable_or_unsupported_sources() {
    let env = Env::new(&[]);
    let o = env.run(&["push", env.path("missing").to_str().unwrap(), "--tag", "x"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot push") && err.contains("No such file"), "{err}");
    let o = env.cmd(&["push", "-", "--tag", "x"]).current_dir(env.tmp.path()).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    // Standard input is read as a tar archive: an empty one is refused, nothing tagged.
    assert!(err.contains("standard input") && err.contains("not a tar archive"), "{err}");
    let dir = env.path("with-fifo");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("ok"), b"fine").unwrap();
    assert!(std::process::Command::new("mkfifo").arg(dir.join("pipe")).status().unwrap().success());
    let err = env.fails(&["push", dir.to_str().unwrap(), "--tag", "x"]);
    assert!(err.contains("not a regular file, directory or symlink"), "{err}");
    assert!(env.json(&["ls"]).as_array().unwrap().is_empty());
}

#[test]
fn destination_must_be_new_or_empty() {
    let env = Env::new(&[]);
    let src = env.path("src");
    make_tree(&src, 1, 100_000);
    env.ok(&["push", src.to_str().unwrap(), "--tag", "x"]);
    let dest = env.path("dest");
    fs::create_dir_all(&dest).unwrap();
    fs::write(dest.join("precious"), b"keep me").unwrap();
    assert!(env.fails(&["restore", "x", "--to", dest.to_str().unwrap()]).contains("is not empty"));
    assert_eq!(fs::read(dest.join("precious")).unwrap(), b"keep me");
    let file_dest = dest.join("precious");
    assert!(env.fails(&["restore", "x", "--to", file_dest.to_str().unwrap()]).contains("not a directory"));
    // An existing empty directory is fine.
    let empty = env.path("empty");
    fs::create_dir_all(&empty).unwrap();
    env.ok(&["restore", "x", "--to", empty.to_str().unwrap()]);
    assert_same_tree(&src, &empty);
}

#[test]
fn store_setup_errors() {
    let env = Env::uninitialized();
    let err = env.fails(&["ls"]);
    assert!(err.contains("no gstore store at") && err.contains("gstore init"), "{err}");
    env.ok(&["init"]);
    assert!(env.fails(&["init"]).contains("store already exists"));
    let other = Env::uninitialized();
    let err = other.fails(&["init", "--chunk-min", "1000000", "--chunk-avg", "1000"]);
    assert!(err.contains("out of range"), "{err}");
    assert!(!other.store.join("config.json").exists());
    let o = std::process::Command::new(gstore_bin()).args(["--store", "ftp://host/x", "ls"]).output().unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("ftp:// is not supported"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A URL with one slash is a typo, not a directory to make (usage error, exit 2).
    let dir = tempfile::tempdir().unwrap();
    for typo in ["s3:/bucket/x", "http:localhost:8080"] {
        let o = gstore_in(dir.path()).current_dir(dir.path()).args(["--store", typo, "init"]).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("mistyped URL"), "{err}");
        assert!(!dir.path().join(typo.split(':').next().unwrap().to_owned() + ":").exists(), "made a directory");
    }
}

#[test]
fn disk_full_during_push_leaves_the_store_intact() {
    let env = Env::uninitialized();
    let disk = SmallDisk::mount(&env.path("disk"), "6M");
    let store = disk.dir.join("store");
    let run = |args: &[&str]| {
        std::process::Command::new(gstore_bin()).arg("--store").arg(&store).args(args).output().unwrap()
    };
    assert!(run(&["init"]).status.success());
    let small = env.path("small");
    make_tree(&small, 1, 500_000);
    assert!(run(&["push", small.to_str().unwrap(), "--tag", "small"]).status.success());
    let big = env.path("big");
    fs::create_dir_all(&big).unwrap();
    fs::write(big.join("data"), random_bytes(20_000_000, 5)).unwrap();
    let o = run(&["push", big.to_str().unwrap(), "--tag", "big"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("No space left on device"), "{err}");
    // Nothing of the failed push is visible as an image; the earlier one is intact.
    let ls = run(&["--json", "ls"]);
    let tags: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(tags.as_array().unwrap().len(), 1, "{tags}");
    let v = run(&["verify", "--read-data"]);
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stdout));
    let out = env.path("out");
    assert!(run(&["restore", "small", "--to", out.to_str().unwrap()]).status.success());
    assert_same_tree(&small, &out);
}

#[test]
fn disk_full_during_restore_leaves_no_destination() {
    let env = Env::new(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("data"), random_bytes(12_000_000, 6)).unwrap();
    env.ok(&["push", src.to_str().unwrap(), "--tag", "x"]);
    let disk = SmallDisk::mount(&env.path("disk"), "4M");
    let dest = disk.dir.join("out");
    let err = env.fails(&["restore", "x", "--to", dest.to_str().unwrap()]);
    assert!(err.contains("No space left on device"), "{err}");
    assert!(!dest.exists());
    assert!(fs::read_dir(&disk.dir).unwrap().next().is_none(), "staging left behind");
}
