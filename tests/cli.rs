//! End-to-end use of every store command through the real binary.

use gstore_tests::*;
use std::fs;

#[test]
fn push_restore_round_trip_of_a_tree() {
    let env = Env::new(&[]);
    let src = env.path("src");
    make_tree(&src, 1, 3_000_000);
    let out = env.ok(&["push", src.to_str().unwrap(), "--tag", "app:v1", "--meta", "kind=test"]);
    assert!(out.contains("pushed"), "{out}");
    env.ok(&["restore", "app:v1", "--to", env.path("out").to_str().unwrap()]);
    assert_same_tree(&src, &env.path("out"));
    // The zero-filled file comes back as a hole-backed file with the same bytes.
    assert_eq!(fs::read(env.path("out/zeros.bin")).unwrap(), vec![0u8; 300_000]);
    // No staging directory is left behind.
    assert!(!env.path(".out.gstore-partial").exists());
}

#[test]
fn single_file_push_and_restore_by_manifest_id() {
    let env = Env::new(&[]);
    let f = env.path("model.safetensors");
    write_mixed_file(&f, 1_234_567, 7);
    let r = env.json(&["push", f.to_str().unwrap(), "--tag", "model"]);
    let id = r["manifest"].as_str().unwrap().to_string();
    assert_eq!(r["logical_bytes"], 1_234_567);
    env.ok(&["restore", &id, "--to", env.path("out").to_str().unwrap()]);
    assert_eq!(fs::read(env.path("out/model.safetensors")).unwrap(), fs::read(&f).unwrap());
}

#[test]
fn near_identical_second_image_adds_little_and_du_accounts_for_it() {
    let env = Env::new(&[]);
    let a = env.path("a");
    fs::create_dir_all(&a).unwrap();
    write_mixed_file(&a.join("pages-1.img"), 8_000_000, 11);
    env.ok(&["push", a.to_str().unwrap(), "--tag", "run:1"]);
    // Second image: same pages with an insertion near the start and an edit in the middle.
    let b = env.path("b");
    fs::create_dir_all(&b).unwrap();
    let mut data = fs::read(a.join("pages-1.img")).unwrap();
    data.splice(100_000..100_000, b"inserted header".iter().copied());
    data[4_000_000..4_000_100].copy_from_slice(&random_bytes(100, 99));
    fs::write(b.join("pages-1.img"), &data).unwrap();
    let r = env.json(&["push", b.to_str().unwrap(), "--tag", "run:2"]);
    let added = r["new_plain_bytes"].as_u64().unwrap();
    assert!(added * 10 <= data.len() as u64, "second image added {added} of {} bytes", data.len());

    let du = env.json(&["du"]);
    assert_eq!(du["images"].as_array().unwrap().len(), 2);
    assert_eq!(du["logical_bytes"].as_u64().unwrap(), 8_000_000 + data.len() as u64);
    assert!(du["dedup_ratio"].as_f64().unwrap() > 1.5, "{du}");
    let unique: Vec<u64> =
        du["images"].as_array().unwrap().iter().map(|i| i["unique_stored_bytes"].as_u64().unwrap()).collect();
    assert!(unique.iter().all(|&u| u > 0 && u * 5 < 8_000_000), "{unique:?}");
    // Both restore byte-exact.
    env.ok(&["restore", "run:2", "--to", env.path("out2").to_str().unwrap()]);
    assert_eq!(fs::read(env.path("out2/pages-1.img")).unwrap(), data);
}

#[test]
fn ls_show_tag_rm_and_history() {
    let env = Env::new(&[]);
    let src = env.path("src");
    make_tree(&src, 3, 200_000);
    let first = env.json(&["push", src.to_str().unwrap(), "--tag", "svc"])["manifest"].as_str().unwrap().to_string();
    fs::write(src.join("extra"), b"more").unwrap();
    let second = env.json(&["push", src.to_str().unwrap(), "--tag", "svc"])["manifest"].as_str().unwrap().to_string();
    assert_ne!(first, second);

    let ls = env.json(&["ls"]);
    assert_eq!(ls.as_array().unwrap().len(), 1);
    assert_eq!(ls[0]["tag"], "svc:latest");
    assert_eq!(ls[0]["manifest"], second.as_str());

    let tag_file = fs::read_to_string(env.store.join("tags/svc/latest.tag")).unwrap();
    let rec: serde_json::Value = serde_json::from_str(&tag_file).unwrap();
    assert_eq!(rec["history"][0]["manifest"], first.as_str());
    // The same image pushed again to a tag (a pinned creation time: the same id) adds no row.
    for _ in 0..2 {
        let o = env
            .cmd(&["-q", "push", src.to_str().unwrap(), "--tag", "same"])
            .env("SOURCE_DATE_EPOCH", "1700000000")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let same: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(env.store.join("tags/same/latest.tag")).unwrap()).unwrap();
    assert_eq!(same["history"].as_array().map_or(0, Vec::len), 0, "{same}");
    env.ok(&["rm", "same"]);

    let show = env.json(&["show", "svc"]);
    let paths: Vec<&str> = show["entries"].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert!(paths.contains(&"extra") && paths.contains(&"sub/deeper/tiny") && paths.contains(&"link"), "{paths:?}");
    let zeros = show["entries"].as_array().unwrap().iter().find(|e| e["path"] == "zeros.bin").unwrap();
    assert_eq!(zeros["chunks"], zeros["zero_chunks"]);
    let text = env.ok(&["show", "svc"]);
    assert!(text.contains("sub/deeper/tiny") && text.contains("link -> sub/core.img"), "{text}");
    // Sizes in binary units, counts in words that agree with them.
    assert!(text.contains("292.97 KiB") && !text.contains("300000"), "{text}");
    assert!(!text.contains(" 1 entries") && !text.contains(" 1 chunks"), "{text}");

    env.ok(&["tag", &first, "svc:old"]);
    env.ok(&["tag", "svc", "svc:copy"]);
    let ls = env.json(&["ls"]);
    let tags: Vec<&str> = ls.as_array().unwrap().iter().map(|r| r["tag"].as_str().unwrap()).collect();
    assert_eq!(tags, ["svc:copy", "svc:latest", "svc:old"]);
    env.ok(&["rm", "svc:copy"]);
    assert!(env.fails(&["rm", "svc:copy"]).contains("tag not found"));
    env.ok(&["restore", "svc:old", "--to", env.path("old").to_str().unwrap()]);
    assert!(!env.path("old/extra").exists());
    env.ok(&["verify", "--read-data"]);
}

#[test]
fn tag_names_that_read_as_manifest_ids_are_refused() {
    let env = Env::new(&[]);
    let (a, b) = (env.path("a"), env.path("b"));
    fs::write(&a, b"image a").unwrap();
    fs::write(&b, b"image b").unwrap();
    let id_a = env.json(&["push", a.to_str().unwrap(), "--tag", "a"])["manifest"].as_str().unwrap().to_string();
    // A tag named like an id would be shadowed by that id: restoring it would give image a.
    for name in [id_a.as_str(), "deadbeef", "0123456789:v2"] {
        let err = env.fails(&["push", b.to_str().unwrap(), "--tag", name]);
        assert!(err.contains("would read as a manifest id"), "{name}: {err}");
        let err = env.fails(&["tag", "a", name]);
        assert!(err.contains("would read as a manifest id"), "{name}: {err}");
    }
    assert_eq!(env.json(&["ls"]).as_array().unwrap().len(), 1);
    // A tag with such a name written by an older gstore stays listed, restorable as
    // NAME:VERSION and removable; the bare id still names image a.
    let id_b = env.json(&["push", b.to_str().unwrap(), "--tag", "b"])["manifest"].as_str().unwrap().to_string();
    fs::create_dir_all(env.store.join(format!("tags/{id_a}"))).unwrap();
    let old = serde_json::json!({"format": 1, "name": id_a, "version": "latest", "manifest": id_b, "set_unix": 1});
    fs::write(env.store.join(format!("tags/{id_a}/latest.tag")), old.to_string()).unwrap();
    let ls = env.json(&["ls"]);
    assert!(ls.as_array().unwrap().iter().any(|t| t["tag"] == format!("{id_a}:latest").as_str()), "{ls}");
    env.ok(&["restore", &format!("{id_a}:latest"), "--to", env.path("old-tag").to_str().unwrap()]);
    assert_eq!(fs::read(env.path("old-tag/b")).unwrap(), b"image b");
    env.ok(&["restore", &id_a, "--to", env.path("by-id").to_str().unwrap()]);
    assert_eq!(fs::read(env.path("by-id/a")).unwrap(), b"image a");
    env.ok(&["tag", &format!("{id_a}:latest"), "b-copy"]);
    env.ok(&["rm", &id_a]);
    let tags: Vec<String> =
        env.json(&["ls"]).as_array().unwrap().iter().map(|t| t["tag"].as_str().unwrap().to_string()).collect();
    assert_eq!(tags, ["a:latest", "b:latest", "b-copy:latest"]);
}

#[test]
fn index_rebuild_restores_the_same_answers() {
    let env = Env::new(&["--pack-size", "1048576"]);
    let src = env.path("src");
    make_tree(&src, 5, 4_000_000);
    env.ok(&["push", src.to_str().unwrap(), "--tag", "x"]);
    let du_before = env.json(&["du"]);
    fs::remove_dir_all(env.store.join("index")).unwrap();
    // A missing index is rebuilt on open; an explicit rebuild gives the same result.
    assert_eq!(env.json(&["du"]), du_before);
    let r = env.json(&["index", "rebuild"]);
    assert!(r["packs_indexed"].as_u64().unwrap() >= 2, "{r}");
    assert_eq!(env.json(&["du"]), du_before);
    env.ok(&["restore", "x", "--to", env.path("out").to_str().unwrap()]);
    assert_same_tree(&src, &env.path("out"));
}

#[test]
fn default_store_location_comes_from_env() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(gstore_bin())
            .args(args)
            .env_remove("GSTORE_STORE")
            .env("XDG_DATA_HOME", tmp.path().join("xdg"))
            .output()
            .unwrap()
    };
    assert!(run(&["init"]).status.success());
    assert!(tmp.path().join("xdg/gstore/config.json").exists());
    let o = std::process::Command::new(gstore_bin())
        .args(["ls"])
        .env("GSTORE_STORE", tmp.path().join("xdg/gstore"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Issue 61 item 13: `serve --listen 127.0.0.1:0` says the port it bound (and prints a JSON
/// ready line with `--json`); commands other than `init` leave a missing store path missing;
/// `ls NAME:VERSION` lists that tag, and one that names no tag is not found (exit 3);
/// argument errors under `--json` still print one JSON value; a container name must be one.
#[test]
fn unclear_answers_are_clear() {
    let env = Env::new(&[]);
    let src = env.path("src");
    make_tree(&src, 5, 1);
    env.ok(&["push", src.to_str().unwrap(), "--tag", "app:v1"]);

    let mut serve = env
        .cmd(&["--json", "serve", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Read on a thread, so that a server that never says it is ready fails the test in
    // seconds instead of hanging it.
    let stdout = serve.stdout.take().unwrap();
    let (tell, told) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line);
        let _ = tell.send(line);
    });
    let line = told.recv_timeout(std::time::Duration::from_secs(30));
    let _ = serve.kill();
    let _ = serve.wait();
    let line = line.expect("serve --json printed no ready line within 30 s");
    let ready: serde_json::Value = serde_json::from_str(&line).expect("one JSON line");
    let listen = ready["listen"].as_str().unwrap();
    assert!(ready["ready"] == true && !listen.ends_with(":0"), "{line}");
    assert_eq!(ready["url"].as_str().unwrap(), format!("http://{listen}"));

    let missing = env.path("no-store-here");
    for args in [&["verify"][..], &["ls"]] {
        let o = gstore_in(env.tmp.path()).arg("--store").arg(&missing).args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(3), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(!missing.exists(), "{args:?} made the missing store's directory");
    }

    let rows = env.json(&["ls", "app:v1"]);
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    let o = env.run(&["ls", "app:v2"]);
    assert_eq!(o.status.code(), Some(3), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(env.run(&["ls", "nothing"]).status.code(), Some(3));
    assert!(env.json(&["ls", "nothing*"]).as_array().unwrap().is_empty());

    let o = env.run(&["--json", "ls", "--no-such-flag"]);
    assert_eq!(o.status.code(), Some(2));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON value on stdout");
    assert_eq!(report["error"]["code"], "usage", "{report}");

    let o = env.run(&["restore", "app:v1", "--container", "--name", "../x"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is not a container name"), "{o:?}");
}

/// Issue 61 item 15: exit statuses by kind (no such process: not found, 3), and answers that
/// say what they mean: a files image restored with `--run`, `rm` of a pinned tag, `diff`'s
/// plain bytes and one path, `log`'s ids as `ls` prints them.
#[test]
fn answers_say_what_they_mean() {
    let env = Env::new(&[]);
    let src = env.path("src");
    make_tree(&src, 6, 1);
    env.ok(&["push", src.to_str().unwrap(), "--tag", "app:v1"]);
    fs::write(src.join("extra.txt"), b"one more file").unwrap();
    env.ok(&["push", src.to_str().unwrap(), "--tag", "app:v2"]);

    // A pid no process has (pid_max is below 2^22).
    let criu = criu_args();
    let o = env.run(&with_criu(&["checkpoint", "--pid", "4194303", "--tag", "gone:1"], &criu));
    assert_eq!(o.status.code(), Some(3), "{}", String::from_utf8_lossy(&o.stderr));

    let o = env.run(&with_criu(&["restore", "app:v1", "--run"], &criu));
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("it holds files") && err.contains("--to DIR"), "{err}");

    let diff = env.ok(&["diff", "app:v1", "app:v2"]);
    assert!(diff.contains("1 path differs") && diff.contains("plain bytes"), "{diff}");

    let log = env.ok(&["log", "app:v2"]);
    let id = env.json(&["show", "app:v2"])["manifest"].as_str().unwrap().to_string();
    assert!(log.contains(&id[..12]) && !log.contains(&id[..13]), "{log}");

    env.ok(&["pin", "app:v1"]);
    let o = env.run(&["rm", "app:v1"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("app:v1 was pinned"), "{o:?}");
}
