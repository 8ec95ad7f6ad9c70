//! Two gstore processes on one local store at once: the second waits (and says so) or works;
//! neither corrupts the store or fails on RocksDB's lock.

use gstore_tests::*;
use std::fs;
use std::process::Stdio;

#[test]
fn concurrent_pushes_both_land() {
    let env = Env::new(&[]);
    let (a, b) = (env.path("a"), env.path("b"));
    make_tree(&a, 1, 20_000_000);
    make_tree(&b, 2, 20_000_000);
    let spawn = |src: &std::path::Path, tag: &str| {
        env.cmd(&["push", src.to_str().unwrap(), "--tag", tag])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (ca, cb) = (spawn(&a, "a"), spawn(&b, "b"));
    let (oa, ob) = (ca.wait_with_output().unwrap(), cb.wait_with_output().unwrap());
    for o in [&oa, &ob] {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "a push failed: {err}");
        assert!(!err.to_lowercase().contains("rocksdb") && !err.contains("LOCK"), "raw lock error leaked: {err}");
    }
    let waited = [&oa, &ob].iter().filter(|o| String::from_utf8_lossy(&o.stderr).contains("waiting for")).count();
    // Either the pushes overlapped and one waited, or one finished before the other began.
    assert!(waited <= 1);
    env.ok(&["verify", "--read-data"]);
    for (src, tag) in [(&a, "a"), (&b, "b")] {
        let dest = env.path(&format!("out-{tag}"));
        env.ok(&["restore", tag, "--to", dest.to_str().unwrap()]);
        assert_same_tree(src, &dest);
    }
}

#[test]
fn a_second_process_waits_for_the_lock_and_says_so() {
    let env = Env::new(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    write_mixed_file(&src.join("f"), 100_000, 1);
    env.ok(&["push", src.to_str().unwrap(), "--tag", "x"]);
    // Hold the store's lock from this process, as a running gstore would.
    let lock_path = env.store.join("index.lock");
    let holder = fs::OpenOptions::new().write(true).open(&lock_path).unwrap();
    holder.lock().unwrap();
    let mut child = env.cmd(&["du"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // The lock is let go once the waiting notice is out (however long the start took).
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in std::io::BufRead::lines(stderr).map_while(Result::ok) {
            if line.contains("waiting for") {
                let _ = tx.send(());
            }
            lines.push(line);
        }
        lines.join("\n")
    });
    let noticed = rx.recv_timeout(std::time::Duration::from_secs(60)).is_ok();
    holder.unlock().unwrap();
    let status = child.wait().unwrap();
    let stderr = reader.join().unwrap();
    assert!(noticed, "no waiting notice: {stderr}");
    assert!(status.success(), "{stderr}");
    // Reading tags needs no lock at all.
    holder.lock().unwrap();
    env.ok(&["ls"]);
    env.ok(&["show", "x"]);
}
