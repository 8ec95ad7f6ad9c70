//! The everyday CLI through the real binary (docs/CLI.md): naming images by id prefix,
//! listing and history, one file out of an image, partial restores, exit codes and JSON
//! errors, sizes with units, and the shell helpers.

use gstore_tests::*;
use std::fs;

/// Exit status of `gstore ARGS`.
fn status(env: &Env, args: &[&str]) -> i32 {
    env.run(args).status.code().expect("exited")
}

/// A store with app:v1, app:v2 (one file changed) and other:v1.
fn three_images() -> Env {
    let env = Env::new(&[]);
    let src = env.path("src");
    fs::create_dir_all(src.join("conf/deep")).unwrap();
    fs::write(src.join("conf/a.json"), b"{\"a\": 1}").unwrap();
    fs::write(src.join("conf/deep/b.json"), b"{\"b\": 2}").unwrap();
    fs::write(src.join("notes.txt"), b"first").unwrap();
    write_mixed_file(&src.join("big.bin"), 2_500_000, 3);
    env.ok(&["push", src.to_str().unwrap(), "--tag", "app:v1"]);
    fs::write(src.join("notes.txt"), b"second").unwrap();
    env.ok(&["push", src.to_str().unwrap(), "--tag", "app:v2"]);
    env.ok(&["push", src.to_str().unwrap(), "--tag", "other:v1"]);
    env
}

#[test]
fn images_are_named_by_id_prefixes_and_missing_tags_get_suggestions() {
    let env = three_images();
    let rows = env.json(&["ls"]);
    let v1 = rows.as_array().unwrap().iter().find(|r| r["tag"] == "app:v1").unwrap()["manifest"]
        .as_str()
        .unwrap()
        .to_string();
    // The 12 digits ls prints, and 8, both name the image.
    for prefix in [&v1[..12], &v1[..8], &v1.to_uppercase()[..10]] {
        let shown = env.json(&["show", prefix]);
        assert_eq!(shown["manifest"], v1.as_str(), "{prefix}");
    }
    assert_eq!(env.json(&["show", &v1[..8]])["created"].as_str().unwrap().len(), 20, "RFC 3339 time");
    let none = env.fails(&["show", "00000000"]);
    assert!(none.contains("no image's id starts with it"), "{none}");
    assert_eq!(status(&env, &["show", "00000000"]), 3);
    // A typo names the tag meant; a missing version lists the ones there are.
    assert!(env.fails(&["show", "ap:v1"]).contains("did you mean app:v1?"));
    assert!(env.fails(&["show", "app:v9"]).contains("app has: app:v1, app:v2"));
    assert!(env.fails(&["rm", "app"]).contains("app has: app:v1, app:v2"));
    // rm of an id says what rm removes.
    let rm_id = env.fails(&["rm", &v1[..12]]);
    assert!(rm_id.contains("is an image id: rm removes tags"), "{rm_id}");
}

#[test]
fn ls_filters_sorts_and_picks_the_latest_and_log_shows_history_for_a_rollback() {
    let env = three_images();
    let tags = |args: &[&str]| -> Vec<String> {
        let rows = env.json(args);
        rows.as_array().unwrap().iter().map(|r| r["tag"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(tags(&["ls"]), ["app:v1", "app:v2", "other:v1"]);
    assert_eq!(tags(&["ls", "app"]), ["app:v1", "app:v2"]);
    assert_eq!(tags(&["ls", "ot*"]), ["other:v1"]);
    assert_eq!(tags(&["ls", "--latest"]).len(), 2);
    let by_size = env.json(&["ls", "--sort", "size"]);
    let sizes: Vec<u64> = by_size.as_array().unwrap().iter().map(|r| r["logical_bytes"].as_u64().unwrap()).collect();
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
    let text = env.ok(&["ls"]);
    assert!(text.contains("CREATED") && text.contains("T") && text.contains("Z"), "{text}");

    // Move app:v1 to v2's image, then roll it back with the id `gstore log` shows.
    let v1 = env.json(&["show", "app:v1"])["manifest"].as_str().unwrap().to_string();
    let v2 = env.json(&["show", "app:v2"])["manifest"].as_str().unwrap().to_string();
    env.ok(&["tag", "app:v2", "app:v1"]);
    let log = env.json(&["log", "app:v1"]);
    let entries = log.as_array().unwrap();
    assert_eq!(entries.len(), 2, "{log}");
    assert_eq!((entries[0]["manifest"].as_str(), entries[0]["current"].as_bool()), (Some(v2.as_str()), Some(true)));
    assert_eq!((entries[1]["manifest"].as_str(), entries[1]["current"].as_bool()), (Some(v1.as_str()), Some(false)));
    env.ok(&["tag", &v1[..12], "app:v1"]);
    assert_eq!(env.json(&["show", "app:v1"])["manifest"], v1.as_str());
    assert_eq!(env.json(&["log", "app"]).as_array().unwrap().len(), 4, "app:v1's three values and app:v2's one");
    assert_eq!(status(&env, &["log", "nope"]), 3);
}

#[test]
fn cat_writes_one_file_and_restore_takes_a_selection() {
    let env = three_images();
    let o = env.run(&["cat", "app:v1", "notes.txt"]);
    assert!(o.status.success());
    assert_eq!(o.stdout, b"first");
    let o = env.run(&["cat", "app:v1", "big.bin"]);
    assert_eq!(o.stdout, fs::read(env.path("src/big.bin")).unwrap());
    assert!(env.fails(&["cat", "app:v1", "nope.txt"]).contains("`gstore show` lists the image's files"));
    assert!(env.fails(&["cat", "app:v1", "conf"]).contains("is a directory, not a file"));

    let out = env.path("sel");
    env.ok(&["restore", "app:v2", "--to", out.to_str().unwrap(), "--include", "conf", "--exclude", "**/b.json"]);
    let mut got: Vec<String> =
        files_below(&out).iter().map(|p| p.strip_prefix(&out).unwrap().display().to_string()).collect();
    got.sort();
    assert_eq!(got, ["conf/a.json"]);
    let out2 = env.path("sel2");
    env.ok(&["restore", "app:v2", "--to", out2.to_str().unwrap(), "--include", "*.txt"]);
    assert_eq!(fs::read(out2.join("notes.txt")).unwrap(), b"second");
    assert!(!out2.join("big.bin").exists());
    let none = env.fails(&["restore", "app:v2", "--to", env.path("sel3").to_str().unwrap(), "--include", "*.nothing"]);
    assert!(none.contains("select no entry"), "{none}");
}

#[test]
fn diff_names_changed_files_and_the_bytes_each_image_adds() {
    let env = three_images();
    let src = env.path("src");
    fs::write(src.join("added.txt"), b"new file").unwrap();
    fs::remove_file(src.join("conf/a.json")).unwrap();
    let mut big = fs::read(src.join("big.bin")).unwrap();
    big[1_000_000..1_000_100].copy_from_slice(&random_bytes(100, 77));
    fs::write(src.join("big.bin"), &big).unwrap();
    env.ok(&["push", src.to_str().unwrap(), "--tag", "app:v3"]);
    let d = env.json(&["diff", "app:v2", "app:v3"]);
    let changes: Vec<(String, String)> = d["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["path"].as_str().unwrap().to_string(), c["change"].as_str().unwrap().to_string()))
        .collect();
    let expect = [("added.txt", "added"), ("big.bin", "changed"), ("conf/a.json", "removed")];
    assert_eq!(changes, expect.map(|(p, c)| (p.to_string(), c.to_string())));
    let big_change = &d["changes"][1];
    let new = big_change["new_bytes"].as_u64().unwrap();
    assert!(new > 0 && new < 600_000, "one edit costs about a chunk or two, not the file: {new}");
    assert_eq!(d["only_in_b_bytes"].as_u64().unwrap(), new + 8);
    assert!(d["only_in_a_bytes"].as_u64().unwrap() > 0);
    assert_eq!(env.json(&["diff", "app:v2", "other:v1"])["changes"].as_array().unwrap().len(), 0);
    assert!(env.ok(&["diff", "app:v2", "app:v3"]).contains("3 paths differ"));
}

#[test]
fn push_leaves_out_what_exclude_matches() {
    let env = three_images();
    let src = env.path("src");
    fs::create_dir_all(src.join("cache/inner")).unwrap();
    fs::write(src.join("cache/inner/x.bin"), b"cached").unwrap();
    fs::write(src.join("run.log"), b"log").unwrap();
    env.ok(&["push", src.to_str().unwrap(), "--tag", "app:v3", "--exclude", "cache", "--exclude", "*.log"]);
    let shown = env.json(&["show", "app:v3"]);
    let paths: Vec<&str> = shown["entries"].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert!(paths.contains(&"notes.txt") && paths.contains(&"conf/a.json"), "{paths:?}");
    assert!(!paths.iter().any(|p| p.starts_with("cache") || p.ends_with(".log")), "{paths:?}");
    assert_eq!(status(&env, &["gc", "--keep-within", "0s"]), 2, "keep-within 0 is refused like keep-last 0");
    // A dry run says what a push would add and writes nothing.
    fs::write(src.join("fresh.bin"), random_bytes(400_000, 9)).unwrap();
    // The store's objects (the local index beside them is this machine's cache, which RocksDB
    // rotates its own logs in whenever it is opened).
    let objects = || -> Vec<_> {
        files_below(&env.store).into_iter().filter(|p| !p.starts_with(env.store.join("index"))).collect()
    };
    let before = objects();
    let dry = env.json(&["push", src.to_str().unwrap(), "--tag", "app:v4", "--dry-run"]);
    assert_eq!(dry["dry_run"], true);
    assert!(dry["new_plain_bytes"].as_u64().unwrap() >= 400_000, "{dry}");
    assert_eq!(objects(), before, "a dry run wrote to the store");
    assert_eq!(status(&env, &["show", "app:v4"]), 3);
    let real = env.json(&["push", src.to_str().unwrap(), "--tag", "app:v4"]);
    assert_eq!(
        (real["new_chunks"].clone(), real["new_plain_bytes"].clone(), real["packs"].clone()),
        (dry["new_chunks"].clone(), dry["new_plain_bytes"].clone(), dry["packs"].clone())
    );
}

#[test]
fn failures_have_distinct_exit_codes_and_json_errors() {
    let env = three_images();
    // Not found: 3, with a JSON error on stdout under --json.
    let o = env.run(&["--json", "show", "app:v9"]);
    assert_eq!(o.status.code(), Some(3));
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((e["error"]["code"].as_str(), e["error"]["exit_status"].as_i64()), (Some("not_found"), Some(3)));
    assert!(e["error"]["message"].as_str().unwrap().contains("app:v9"));
    // Usage: 2 (ours and the parser's).
    assert_eq!(status(&env, &["gc", "--keep-last", "0"]), 2);
    assert_eq!(status(&env, &["gc", "--keep-daily", "0"]), 2);
    assert_eq!(status(&env, &["gc", "--repack-below", "1.5"]), 2);
    assert_eq!(status(&env, &["push", "x", "--tag", "bad tag"]), 2);
    assert_eq!(status(&env, &["no-such-command"]), 2);
    // Damage: 4, from verify and from a restore, which points to verify --read-data.
    for p in env.packs() {
        let mut b = fs::read(&p).unwrap();
        let n = b.len() / 2;
        b[n] ^= 0xff;
        fs::write(&p, b).unwrap();
    }
    assert_eq!(status(&env, &["verify", "--read-data"]), 4);
    let o = env.run(&["restore", "app:v1", "--to", env.path("dmg").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&o.stderr).contains("gstore verify --read-data"));
    let uninit = Env::uninitialized();
    assert_eq!(status(&uninit, &["ls"]), 3, "no store is not found");
}

#[test]
fn sizes_take_units_and_listen_takes_host_names() {
    let env = Env::new(&["--chunk-avg", "32KiB", "--chunk-min", "8K", "--chunk-max", "128k", "--pack-size", "16MiB"]);
    let src = env.path("f");
    write_mixed_file(&src, 1_000_000, 5);
    env.ok(&["push", src.to_str().unwrap(), "--tag", "f"]);
    env.ok(&["restore", "f", "--to", env.path("o").to_str().unwrap(), "--memory-budget", "64MiB"]);
    assert_eq!(fs::read(env.path("o/f")).unwrap(), fs::read(&src).unwrap());
    let bad = env.fails(&["restore", "f", "--to", env.path("o2").to_str().unwrap(), "--memory-budget", "12 parsecs"]);
    assert!(bad.contains("unknown unit"), "{bad}");
    let bad = env.fails(&["serve", "--listen", "localhost"]);
    assert!(bad.contains("expected HOST:PORT"), "{bad}");
}

#[test]
fn version_completions_and_man_pages() {
    let env = Env::new(&[]);
    let v = env.json(&["version"]);
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert!(v["rustc"].as_str().unwrap().starts_with("rustc "), "{v}");
    assert_eq!(v["target"], format!("{}-{}", std::env::consts::ARCH, std::env::consts::OS));
    for shell in ["bash", "zsh", "fish"] {
        let script = env.ok(&["completions", shell]);
        assert!(script.contains("checkpoint") && script.contains("restore"), "{shell}");
    }
    let dir = env.path("man");
    env.ok(&["man", dir.to_str().unwrap()]);
    let page = fs::read_to_string(dir.join("gstore-restore.1")).unwrap();
    assert!(page.contains(".TH") && page.contains("memory\\-budget"), "{page}");
    assert!(dir.join("gstore.1").exists());
}

#[test]
fn errors_point_the_right_way() {
    let env = three_images();
    // A server address without http:// is not taken for a directory without saying so.
    let o = std::process::Command::new(gstore_bin()).args(["--store", "127.0.0.1:18420", "ls"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--store http://127.0.0.1:18420"), "{err}");
    assert_eq!(o.status.code(), Some(3));
    assert!(!std::path::Path::new("127.0.0.1:18420").exists(), "no directory was made");
    // `--to .` says what to give instead.
    let empty = env.path("empty");
    fs::create_dir_all(&empty).unwrap();
    let o = env.cmd(&["restore", "app:v1", "--to", "."]).current_dir(&empty).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("give a new directory's name"), "{err}");
    // A store on a read-only file system: the OS's words once, no library internals.
    let disk = SmallDisk::mount(&env.path("ro"), "1m");
    let remount = std::process::Command::new("mount").args(["-o", "remount,ro"]).arg(&disk.dir).status().unwrap();
    assert!(remount.success());
    let o = std::process::Command::new(gstore_bin()).arg("--store").arg(&disk.dir).arg("init").output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("Read-only file system").count(), 1, "{err}");
    assert!(!err.contains("LocalFileSystem") && !err.contains("#1"), "{err}");
}

#[test]
fn copy_sends_only_what_the_target_lacks_between_local_and_s3_stores() {
    let env = three_images();
    let second = Env::new(&[]);
    let to = second.store.to_str().unwrap().to_string();
    let first = env.json(&["copy", "app:v1", "--to", &to]);
    let r = &first[0];
    assert_eq!(r["copied_chunks"], r["chunks"], "an empty target gets every chunk: {first}");
    let again = env.json(&["copy", "app:v1", "app:v2", "--to", &to]);
    assert_eq!(again[0]["copied_chunks"], 0, "nothing new: {again}");
    let v2 = &again[1];
    assert!(v2["copied_chunks"].as_u64().unwrap() >= 1 && v2["copied_chunks"].as_u64().unwrap() <= 2, "{again}");
    assert_eq!(v2["manifest"], env.json(&["show", "app:v2"])["manifest"], "the same image, the same id");
    second.ok(&["verify", "--read-data"]);
    second.ok(&["restore", "app:v2", "--to", second.path("out").to_str().unwrap()]);
    assert_eq!(fs::read(second.path("out/notes.txt")).unwrap(), b"second");
    assert!(env
        .fails(&["copy", "app:v1", "--to", env.store.to_str().unwrap()])
        .contains("is the store the images are in"));
    assert_eq!(status(&env, &["copy", "nope:v1", "--to", &to]), 3);

    // To an S3 store and back to a new local one.
    let s3 = S3::start();
    s3.ok("m1", &["init"]);
    let s3_env = |c: &mut std::process::Command| {
        c.env("AWS_ENDPOINT", format!("http://127.0.0.1:{}", s3.port))
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", S3_KEY)
            .env("AWS_SECRET_ACCESS_KEY", S3_SECRET)
            .env("AWS_REGION", "us-east-1")
            .env("XDG_CACHE_HOME", s3.tmp.path().join("m1"));
    };
    let mut up = env.cmd(&["--json", "copy", "app:v2", "--to", &s3.url]);
    s3_env(&mut up);
    let o = up.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    s3.ok("m2", &["verify", "--read-data"]);
    let third = Env::new(&[]);
    let o = s3.cmd("m2", &["copy", "app:v2", "--to", third.store.to_str().unwrap()]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    third.ok(&["restore", "app:v2", "--to", third.path("out").to_str().unwrap()]);
    assert_eq!(fs::read(third.path("out/big.bin")).unwrap(), fs::read(env.path("src/big.bin")).unwrap());
}

/// The codec of every chunk in `env`'s packs, and for float-coded ones their lane codec bytes
/// (docs/FORMAT.md: the word width, then per lane a codec byte, a u32 LE length and the bytes).
fn stored_codecs(env: &Env) -> Vec<(gstore_store::codec::Codec, Vec<u8>)> {
    use gstore_store::codec::Codec;
    use gstore_store::{Store, StoreLocation};
    let store = Store::open(&StoreLocation::Local(env.store.clone())).unwrap();
    let mut out = Vec::new();
    for p in env.packs() {
        let id = gstore_store::ObjectId::from_hex(p.file_stem().unwrap().to_str().unwrap()).unwrap();
        let bytes = fs::read(&p).unwrap();
        for e in store.read_pack_footer(&id).unwrap() {
            let stored = &bytes[e.offset as usize..(e.offset + e.stored_len as u64) as usize];
            let mut lanes = Vec::new();
            if e.codec == Codec::Floats {
                let mut at = 1;
                for _ in 0..stored[0] {
                    lanes.push(stored[at]);
                    at += 5 + u32::from_le_bytes(stored[at + 1..at + 5].try_into().unwrap()) as usize;
                }
            }
            out.push((e.codec, lanes));
        }
    }
    out
}

#[test]
fn a_copy_writes_only_codecs_the_target_store_allows() {
    use gstore_store::codec::Codec;
    let env = Env::new(&[]);
    let src = env.path("weights");
    fs::create_dir_all(&src).unwrap();
    // Small-magnitude float32 weights: stored with the float codec here.
    let weights = fp32_weights(600_000, 45);
    fs::write(src.join("model.bin"), &weights).unwrap();
    env.ok(&["-q", "push", src.to_str().unwrap(), "--tag", "w:v1"]);
    let huffman = |codecs: &[(Codec, Vec<u8>)]| codecs.iter().any(|(_, lanes)| lanes.contains(&2));
    let source = stored_codecs(&env);
    assert!(huffman(&source), "the source holds float chunks with Huffman lanes");
    for flag in ["--no-float-codec", "--zstd-lanes"] {
        let target = Env::new(&[flag]);
        env.ok(&["copy", "w:v1", "--to", target.store.to_str().unwrap()]);
        let codecs = stored_codecs(&target);
        assert!(!huffman(&codecs), "{flag}: Huffman lanes copied");
        if flag == "--no-float-codec" {
            assert!(codecs.iter().all(|(c, _)| *c != Codec::Floats), "{flag}: float-coded chunks copied");
        }
        target.ok(&["verify", "--read-data"]);
        let out = target.path("out");
        target.ok(&["restore", "w:v1", "--to", out.to_str().unwrap()]);
        assert_same_tree(&src, &out);
    }
}

#[test]
fn a_store_made_with_min_saving_keeps_raw_what_compresses_less_and_restores_it() {
    use gstore_store::codec::Codec;
    // fp32 weights: the float codec saves 10-25 % of them. Text compresses far more.
    let weights = fp32_weights(400_000, 7);
    let text: Vec<u8> = (0..200_000u32).flat_map(|i| format!("line {i} of the log\n").into_bytes()).collect();
    let codecs_for = |min_saving: &str| {
        let env = Env::new(&["--min-saving", min_saving]);
        let src = env.path("src");
        fs::create_dir_all(&src).unwrap();
        fs::write(src.join("model.bin"), &weights).unwrap();
        fs::write(src.join("log.txt"), &text).unwrap();
        env.ok(&["-q", "push", src.to_str().unwrap(), "--tag", "m:1"]);
        let out = env.path("out");
        env.ok(&["restore", "m:1", "--to", out.to_str().unwrap()]);
        assert_same_tree(&src, &out);
        env.ok(&["verify", "--read-data"]);
        stored_codecs(&env).into_iter().map(|(c, _)| c).collect::<Vec<_>>()
    };
    let default = codecs_for("3");
    assert!(default.contains(&Codec::Floats), "by default the weights take the float codec: {default:?}");
    let raw = codecs_for("30");
    assert!(!raw.contains(&Codec::Floats), "with --min-saving 30 no weights are float-coded: {raw:?}");
    assert!(raw.contains(&Codec::Raw) && raw.contains(&Codec::Zstd), "weights raw, text still zstd: {raw:?}");
    let env = Env::uninitialized();
    let o = env.cmd(&["init", "--min-saving", "101"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("101"), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `n` small-magnitude float32 weights (uniform in ±0.02, random mantissas), as bytes, from
/// `seed`.
fn fp32_weights(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed;
    (0..n)
        .flat_map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            (u * 0.04f32).to_le_bytes()
        })
        .collect()
}
