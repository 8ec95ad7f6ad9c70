//! The restore engine through the real binary: resuming an interrupted restore, the memory
//! budget, images of more files than a process may open, and loads into host memory.

use gstore_tests::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

#[test]
fn an_interrupted_restore_resumes_and_repairs() {
    let env = Env::new(&[]);
    let src = env.path("src");
    fs::create_dir_all(&src).unwrap();
    write_mixed_file(&src.join("pages-1.img"), 150_000_000, 3);
    write_mixed_file(&src.join("pages-2.img"), 30_000_000, 4);
    env.ok(&["push", src.to_str().unwrap(), "--tag", "big"]);
    let dest = env.path("out");
    let partial = env.path(".out.gstore-partial");
    // Kill restores until one dies part-way (the staging directory holds some of the image).
    let mut interrupted = false;
    // Part-way means chunk data was written (the files start as holes: no blocks): more than
    // three of the largest chunks, so that besides the chunk damaged below (and one a kill may
    // have cut short) some whole chunk is there to resume from.
    let chunk_max = gstore_store::StoreConfig::default().chunk_max as u64;
    let written = |p: &std::path::Path| {
        fs::metadata(p).map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512 > 3 * chunk_max).unwrap_or(false)
    };
    for delay_ms in [150u64, 100, 200, 120, 60, 250, 90, 180, 40, 300, 70, 220] {
        let mut child = env
            .cmd(&["-q", "restore", "big", "--to", dest.to_str().unwrap(), "--memory-budget", "16777216"])
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let still_running = child.try_wait().unwrap().is_none();
        let _ = child.kill();
        let _ = child.wait();
        if still_running && written(&partial.join("pages-1.img")) && !dest.exists() {
            interrupted = true;
            break;
        }
        let _ = fs::remove_dir_all(&dest);
        let _ = fs::remove_dir_all(&partial);
    }
    assert!(interrupted, "no restore was caught part-way");
    // Damage a byte the first run may already have written: the resume must not trust it.
    let f = fs::OpenOptions::new().write(true).open(partial.join("pages-1.img")).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"X", 5).unwrap();
    drop(f);
    let r = env.json(&["restore", "big", "--to", dest.to_str().unwrap()]);
    assert!(r["resumed_chunks"].as_u64().unwrap() > 0, "{r}");
    assert!(!partial.exists());
    assert_same_tree(&src, &dest);
}

/// `c` run under `ulimit -n max_fds`, as on a machine allowing a process few open files.
fn with_fd_limit(c: Command, max_fds: u32) -> Command {
    let mut sh = Command::new("sh");
    sh.args(["-c", &format!("ulimit -n {max_fds} && exec \"$0\" \"$@\"")]).arg(c.get_program()).args(c.get_args());
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => sh.env(k, v),
            None => sh.env_remove(k),
        };
    }
    sh
}

#[test]
fn a_restore_of_more_files_than_it_may_open_at_once_restores_them_all() {
    let env = Env::new(&[]);
    let src = env.path("src");
    for i in 0..1500u64 {
        let dir = src.join(format!("d{}", i % 30));
        fs::create_dir_all(&dir).unwrap();
        // Every tenth file holds the same bytes: one chunk written to many files.
        let bytes = if i % 10 == 0 { random_bytes(10_000, 0) } else { random_bytes(10_000, i) };
        fs::write(dir.join(format!("f{i}")), bytes).unwrap();
        if i % 7 == 0 {
            fs::set_permissions(dir.join(format!("f{i}")), fs::Permissions::from_mode(0o600)).unwrap();
        }
    }
    env.ok(&["push", src.to_str().unwrap(), "--tag", "many"]);
    let restore = |dest: &str, extra: &[&str]| {
        let mut args = vec!["--json", "restore", "many", "--to", dest];
        args.extend_from_slice(extra);
        let out = with_fd_limit(env.cmd(&args), 256).output().unwrap();
        assert!(out.status.success(), "restore {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let first = env.path("first");
    restore(first.to_str().unwrap(), &[]);
    assert_same_tree(&src, &first);
    // A seed of as many files is read a bounded number of files at a time too: all of it.
    let seeded = env.path("seeded");
    let r = restore(seeded.to_str().unwrap(), &["--seed", first.to_str().unwrap()]);
    assert_eq!(r["fetched_bytes"], 0, "everything came from the seed: {r}");
    assert_same_tree(&src, &seeded);
}

#[test]
fn a_small_memory_budget_still_restores_everything() {
    let env = Env::new(&[]);
    let src = env.path("src");
    make_tree(&src, 9, 20_000_000);
    env.ok(&["push", src.to_str().unwrap(), "--tag", "x"]);
    let small = env.json(&["restore", "x", "--to", env.path("a").to_str().unwrap(), "--memory-budget", "1"]);
    let large = env.json(&["restore", "x", "--to", env.path("b").to_str().unwrap()]);
    assert!(
        small["reads"].as_u64().unwrap() > large["reads"].as_u64().unwrap(),
        "a smaller budget must mean smaller reads: {small} {large}"
    );
    assert_same_tree(&src, &env.path("a"));
    assert_same_tree(&src, &env.path("b"));
}

#[test]
fn load_into_host_memory_and_clear_device_errors() {
    let env = Env::new(&[]);
    let src = env.path("src");
    make_tree(&src, 2, 5_000_000);
    env.ok(&["push", src.to_str().unwrap(), "--tag", "w"]);
    let r = env.json(&["load", "w"]);
    let expect: u64 = env.json(&["show", "w"])["logical_bytes"].as_u64().unwrap();
    assert_eq!(r["bytes"].as_u64().unwrap(), expect);
    assert!(r["gb_per_s"].as_f64().unwrap() > 0.0);
    assert!(env.fails(&["load", "w", "--device", "gpu0"]).contains("expected host, all, or cuda:N"));
    // No GPU on this machine: a clear error, never a crash.
    let err = env.fails(&["load", "w", "--device", "cuda:0"]);
    assert!(err.contains("no CUDA driver"), "{err}");
}

/// A store with `make_tree(seed, scale)` pushed as "w", and the test CUDA driver built into
/// its `cuda` directory (for LD_LIBRARY_PATH).
fn pushed_with_fake_cuda(seed: u64, scale: usize) -> (Env, std::path::PathBuf) {
    let env = Env::new(&[]);
    let src = env.path("src");
    make_tree(&src, seed, scale);
    env.ok(&["push", src.to_str().unwrap(), "--tag", "w"]);
    let cuda = env.path("cuda");
    fake_libcuda(&cuda);
    (env, cuda)
}

/// Builds the test CUDA driver (gpu-dump/tests/fake_libcuda.c: device memory is host memory,
/// no kernel API) into `dir`/libcuda.so.1.
fn fake_libcuda(dir: &std::path::Path) {
    let source = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR (set by cargo test and nextest)"),
    )
    .join("../gpu-dump/tests/fake_libcuda.c");
    std::fs::create_dir_all(dir.join("state")).unwrap();
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O1"])
        .arg(format!("-DSTATE_DIR=\"{}\"", dir.join("state").display()))
        .arg("-o")
        .arg(dir.join("libcuda.so.1"))
        .arg(source)
        .status()
        .expect("run cc (a C compiler is needed for this test)");
    assert!(status.success());
}

#[test]
fn load_into_a_device_without_the_kernel_api_checks_on_the_host() {
    let (env, cuda) = pushed_with_fake_cuda(3, 4_000_000);
    let load = |args: &[&str]| {
        let mut a = vec!["--json", "load", "w", "--device", "cuda:0"];
        a.extend_from_slice(args);
        env.cmd(&a).env("LD_LIBRARY_PATH", &cuda).output().expect("gstore runs")
    };
    // --check reads every device buffer back and hashes each chunk against the manifest.
    let o = load(&["--check", "--memory-budget", "16000000"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["bytes"], env.json(&["show", "w"])["logical_bytes"]);
    assert_eq!(r["checked"], true);
    let path = r["path"].as_str().unwrap();
    assert!(path.contains("checked and decoded on the host") && path.contains("cuModuleLoadData"), "{path}");
    let logical = r["bytes"].as_u64().unwrap();
    // Two devices (the test driver has one GPU; it serves both): split, then replicated.
    for (extra, bytes) in [(None, logical), (Some("--replicate"), 2 * logical)] {
        let mut args = vec!["--check"];
        args.extend(extra);
        let mut a = vec!["--json", "load", "w", "--device", "cuda:0,cuda:0"];
        a.extend_from_slice(&args);
        let o = env.cmd(&a).env("LD_LIBRARY_PATH", &cuda).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["bytes"].as_u64().unwrap(), bytes, "{r}");
        let shares: Vec<u64> =
            r["per_device"].as_array().unwrap().iter().map(|d| d["bytes"].as_u64().unwrap()).collect();
        assert_eq!(shares.len(), 2);
        assert!(shares.iter().all(|&b| b > 0), "both devices get files: {shares:?}");
        assert_eq!(r["checked"], true);
    }
    // An image larger than the device's free memory (the test driver has 1 GiB) is refused
    // before anything is allocated.
    let big = env.path("big");
    std::fs::create_dir_all(&big).unwrap();
    std::fs::File::create(big.join("sparse")).unwrap().set_len(1 << 31).unwrap();
    env.ok(&["push", big.to_str().unwrap(), "--tag", "big"]);
    let o = env.cmd(&["load", "big", "--device", "cuda:0"]).env("LD_LIBRARY_PATH", &cuda).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("need 2147483648 bytes of device memory"), "{err}");
    // A damaged pack fails the load, naming the chunk.
    for pack in env.packs() {
        let mut bytes = std::fs::read(&pack).unwrap();
        let mid = bytes.len() / 3;
        bytes[mid] ^= 0x40;
        std::fs::write(&pack, bytes).unwrap();
    }
    let o = load(&[]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("corrupt chunk"), "{err}");
    // A missing pack too, naming the pack.
    for pack in env.packs() {
        std::fs::remove_file(pack).unwrap();
    }
    let err = String::from_utf8_lossy(&load(&[]).stderr).to_string();
    assert!(err.contains("pack") && err.contains("not found"), "{err}");
}

/// A stand-in for `gstore hold` (a real one needs a GPU that runs gstore's kernels): answers
/// one load at `socket` with `files` ((path, size) pairs), checks the loader's handles (one
/// 128-hex-digit handle per file), then sends `last`. Returns the handles it got.
fn stand_in_holder(
    socket: &std::path::Path,
    files: Vec<(String, u64)>,
    last: serde_json::Value,
) -> std::thread::JoinHandle<Vec<String>> {
    use std::io::{BufRead, Write};
    let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        let (conn, _) = listener.accept().unwrap();
        let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
        let mut writer = conn;
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert_eq!(serde_json::from_str::<serde_json::Value>(&line).unwrap()["image"], "w", "{line}");
        let listed: Vec<_> = files.iter().map(|(p, n)| serde_json::json!({"path": p, "len": n})).collect();
        writeln!(writer, "{}", serde_json::json!({"image": "00", "files": listed})).unwrap();
        line.clear();
        reader.read_line(&mut line).unwrap();
        let request: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(request["device"], 0, "{line}");
        let handles: Vec<String> =
            request["handles"].as_array().unwrap().iter().map(|h| h.as_str().unwrap().to_string()).collect();
        writeln!(writer, "{last}").unwrap();
        handles
    })
}

#[test]
fn loads_through_gstore_hold_fail_clearly_and_check_catches_a_holder_that_lies() {
    let (env, cuda) = pushed_with_fake_cuda(5, 3_000_000);
    let gstore = |args: &[&str]| env.cmd(args).env("LD_LIBRARY_PATH", &cuda).output().expect("gstore runs");
    let fails = |args: &[&str], expect: &str| {
        let o = gstore(args);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(!o.status.success() && err.contains(expect), "{args:?}: wanted {expect:?}, got {err}");
    };
    // A holder checks every chunk on the GPU: the test driver runs no kernels, so it refuses,
    // and leaves no socket behind.
    let socket = env.path("hold.sock");
    let s = socket.to_str().unwrap();
    fails(&["hold", "w", "--socket", s], "gstore hold checks every chunk on the GPU");
    assert!(!socket.exists());
    // A path that is not a socket is never replaced; a socket someone answers on is refused.
    fs::write(&socket, b"keep me").unwrap();
    fails(&["hold", "w", "--socket", s], "is not a socket");
    assert_eq!(fs::read(&socket).unwrap(), b"keep me");
    fs::remove_file(&socket).unwrap();
    let busy = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    fails(&["hold", "w", "--socket", s], "a gstore hold already answers at");
    drop(busy);
    fs::remove_file(&socket).unwrap();
    // No holder at the socket.
    fails(&["load", "w", "--device", "cuda:0", "--held", s], "connecting to gstore hold");
    fails(&["load", "w", "--device", "host", "--held", s], "expected cuda:N");
    let shown = env.json(&["show", "w"]);
    let files: Vec<(String, u64)> = shown["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "file")
        .map(|e| (e["path"].as_str().unwrap().to_string(), e["size"].as_u64().unwrap()))
        .collect();
    // A holder's error reaches the loader.
    let holder = stand_in_holder(&socket, files.clone(), serde_json::json!({"error": "out of pinned memory"}));
    fails(&["load", "w", "--device", "cuda:0", "--held", s], "gstore hold: out of pinned memory");
    let handles = holder.join().unwrap();
    assert_eq!(handles.len(), files.len());
    assert!(handles.iter().all(|h| h.len() == 128 && h.bytes().all(|b| b.is_ascii_hexdigit())), "{handles:?}");
    // A holder that says it loaded the image without doing so: --check reads the buffers back
    // and finds chunks that are not there.
    fs::remove_file(&socket).unwrap();
    let bytes: u64 = files.iter().map(|f| f.1).sum();
    let holder = stand_in_holder(&socket, files, serde_json::json!({"bytes": bytes, "path": "stand-in"}));
    fails(&["load", "w", "--device", "cuda:0", "--held", s, "--check"], "do not match chunk");
    holder.join().unwrap();
}

/// bf16-like weights (small-magnitude values) from a seed.
fn write_bf16_weights(path: &std::path::Path, values: usize, seed: u64) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let bytes: Vec<u8> = (0..values)
        .flat_map(|_| {
            let v: f32 = (0..3).map(|_| rng.random::<f32>() - 0.5).sum::<f32>() * 0.04;
            ((v.to_bits() >> 16) as u16).to_le_bytes()
        })
        .collect();
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn float_weights_take_the_float_codec_restore_exactly_and_damage_is_caught() {
    let plain = Env::new(&["--no-float-codec"]);
    let floats = Env::new(&[]);
    let src = floats.path("src");
    std::fs::create_dir_all(&src).unwrap();
    write_bf16_weights(&src.join("weights.bin"), 3_000_000, 5);
    let stored = |env: &Env| {
        env.ok(&["push", src.to_str().unwrap(), "--tag", "w"]);
        env.json(&["du"])["pack_bytes"].as_u64().unwrap()
    };
    let (zstd_only, grouped) = (stored(&plain), stored(&floats));
    assert!(grouped * 100 < zstd_only * 92, "float codec {grouped} bytes, zstd {zstd_only}");
    floats.ok(&["verify", "--read-data"]);
    floats.ok(&["restore", "w", "--to", floats.path("out").to_str().unwrap()]);
    assert_same_tree(&src, &floats.path("out"));
    for pack in floats.packs() {
        let mut bytes = std::fs::read(&pack).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x10;
        std::fs::write(&pack, bytes).unwrap();
    }
    let err = floats.fails(&["restore", "w", "--to", floats.path("again").to_str().unwrap()]);
    assert!(err.contains("corrupt chunk"), "{err}");
}

/// The index directory's files, with their sizes and times: what a writable open of RocksDB
/// changes (a new manifest and options file at least) and a read-only one does not.
fn index_files(env: &Env) -> Vec<(String, u64, std::time::SystemTime)> {
    let mut files: Vec<_> = fs::read_dir(env.store.join("index"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            (e.file_name().to_string_lossy().into_owned(), meta.len(), meta.modified().unwrap())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn a_restore_opens_an_up_to_date_index_read_only_and_catches_up_one_that_is_not() {
    use gstore_store::format::meta::ImageMeta;
    use gstore_store::{progress::Silent, Store, StoreLocation, TagRef};
    let env = Env::new(&[]);
    let src = env.path("src");
    make_tree(&src, 4, 3_000_000);
    env.ok(&["push", src.to_str().unwrap(), "--tag", "a"]);
    // The push left the index current with the packs it added: restores find it so and
    // write nothing to it.
    let before = index_files(&env);
    env.ok(&["restore", "a", "--to", env.path("one").to_str().unwrap()]);
    assert_same_tree(&src, &env.path("one"));
    assert_eq!(index_files(&env), before, "the first restore after a push wrote to the index");
    env.ok(&["restore", "a", "--to", env.path("two").to_str().unwrap()]);
    assert_same_tree(&src, &env.path("two"));
    assert_eq!(index_files(&env), before, "a restore of an unchanged store wrote to its index");
    assert!(env.store.join("index.plans").read_dir().unwrap().count() >= 1, "the restores recorded no plan");
    // Another machine (here: another index of the store) pushes: the packs it wrote are not
    // in this index, which is caught up again before the restore reads them.
    let other = env.path("other");
    make_tree(&other, 3, 2_000_000);
    {
        let location = StoreLocation::Local(env.store.clone());
        let store = Store::open(&location).unwrap().with_index_slot(7).with_index(&|_| {}).unwrap();
        let tag = TagRef::parse_new("b").unwrap();
        gstore_store::commands::push::push(&store, &other, &tag, ImageMeta::default(), &Silent).unwrap();
    }
    env.ok(&["restore", "b", "--to", env.path("three").to_str().unwrap()]);
    assert_same_tree(&other, &env.path("three"));
    assert_ne!(index_files(&env), before, "the index was not caught up with the other machine's packs");
    let caught_up = index_files(&env);
    env.ok(&["restore", "b", "--to", env.path("four").to_str().unwrap()]);
    assert_same_tree(&other, &env.path("four"));
    assert_eq!(index_files(&env), caught_up, "once caught up, a restore wrote to the index again");
    // gc removes packs: plans naming them are not used, and restores read the right bytes.
    env.ok(&["rm", "a"]);
    env.ok(&["gc"]);
    env.ok(&["restore", "b", "--to", env.path("five").to_str().unwrap()]);
    assert_same_tree(&other, &env.path("five"));
}

#[test]
fn a_restore_records_its_plan_and_the_next_restore_of_the_image_reads_it() {
    use gstore_restore::plan::Needs;
    use gstore_store::{Store, StoreLocation};
    let env = Env::new(&[]);
    let src = env.path("src");
    make_tree(&src, 6, 8_000_000);
    env.ok(&["push", src.to_str().unwrap(), "--tag", "a"]);
    let open = || Store::open_indexed(&StoreLocation::Local(env.store.clone()), &|_| {}).unwrap();
    let (key, ids) = {
        let store = open();
        let m = store.get_manifest(&store.resolve("a").unwrap()).unwrap();
        let ids: Vec<_> = {
            let mut seen = std::collections::HashSet::new();
            m.files().flat_map(|(_, c)| c.iter()).filter(|c| !c.zero && seen.insert(c.id)).map(|c| c.id).collect()
        };
        let key = Needs::of(&m).key();
        assert!(store.recorded_plan(&key).unwrap().is_none(), "nothing is recorded before a restore");
        (key, ids)
    };
    env.ok(&["restore", "a", "--to", env.path("one").to_str().unwrap()]);
    assert_same_tree(&src, &env.path("one"));
    {
        // The record holds what the index says, chunk by chunk, in order of first use.
        let store = open();
        let recorded: Vec<_> =
            store.recorded_plan(&key).unwrap().expect("the restore recorded its plan").map(Option::unwrap).collect();
        let looked_up: Vec<_> = store.locate_many(&ids).unwrap().into_iter().map(Option::unwrap).collect();
        assert_eq!(recorded, looked_up);
    }
    // Planned from the record this time.
    env.ok(&["restore", "a", "--to", env.path("two").to_str().unwrap()]);
    assert_same_tree(&src, &env.path("two"));
}

#[test]
fn a_restore_seeded_by_an_earlier_one_fetches_only_what_changed_and_is_exact() {
    let env = Env::new(&[]);
    let (v1, v2) = (env.path("v1"), env.path("v2"));
    fs::create_dir_all(&v1).unwrap();
    write_bf16_weights(&v1.join("pages-1.img"), 3_000_000, 11);
    write_mixed_file(&v1.join("core.img"), 3_000_000, 12);
    env.ok(&["push", v1.to_str().unwrap(), "--tag", "m:1"]);
    let first = env.path("first");
    env.ok(&["restore", "m:1", "--to", first.to_str().unwrap()]);

    // The next version: 1 % of the weights' pages rewritten (a page image: the changed
    // chunks are stored as deltas against v1's), the weights moved to another path, and 10 KiB inserted at the head of the other file (every offset after it shifts).
    fs::create_dir_all(v2.join("model")).unwrap();
    let mut weights = fs::read(v1.join("pages-1.img")).unwrap();
    for page in (0..weights.len() / 4096).step_by(100) {
        weights[page * 4096..page * 4096 + 4096].copy_from_slice(&random_bytes(4096, page as u64));
    }
    fs::write(v2.join("model/pages-1.img"), &weights).unwrap();
    let mut core = random_bytes(10 * 1024, 13);
    core.extend(fs::read(v1.join("core.img")).unwrap());
    fs::write(v2.join("core.img"), &core).unwrap();
    let v1_packs = env.packs();
    let pushed = env.json(&["push", v2.to_str().unwrap(), "--tag", "m:2"]);
    assert!(pushed["delta_chunks"].as_u64().unwrap() > 0, "the changed pages are deltas against v1");

    let unseeded = env.json(&["restore", "m:2", "--to", env.path("plain").to_str().unwrap()]);
    assert_eq!(unseeded["seeded_chunks"], 0);
    let seeded_to = env.path("seeded");
    let seeded = env.json(&["restore", "m:2", "--to", seeded_to.to_str().unwrap(), "--seed", first.to_str().unwrap()]);
    assert_same_tree(&v2, &seeded_to);
    let logical = seeded["logical_bytes"].as_u64().unwrap();
    let copied = seeded["seeded_bytes"].as_u64().unwrap();
    let (fetched, fetched_alone) =
        (seeded["fetched_bytes"].as_u64().unwrap(), unseeded["fetched_bytes"].as_u64().unwrap());
    // About a third of core.img is zero runs (never fetched) and a sixth of the weights'
    // chunks hold a rewritten page: about three quarters of the image is there to copy.
    assert!(copied * 10 > logical * 7, "{copied} of {logical} bytes copied from the seed");
    assert!(fetched * 4 < fetched_alone, "fetched {fetched} bytes seeded, {fetched_alone} without");

    // Everything v1's packs hold that v2 needs (its unchanged chunks, and the bases of v2's
    // deltas against v1) comes from the seed: with those packs damaged, only the seeded
    // restore succeeds.
    let kept: Vec<Vec<u8>> = v1_packs.iter().map(|p| fs::read(p).unwrap()).collect();
    for (p, bytes) in v1_packs.iter().zip(&kept) {
        let mut bad = bytes.clone();
        for i in (0..bad.len() * 9 / 10).step_by(16 << 10) {
            bad[i] ^= 0x10;
        }
        fs::write(p, bad).unwrap();
    }
    let err = env.fails(&["restore", "m:2", "--to", env.path("without").to_str().unwrap()]);
    assert!(err.contains("corrupt"), "{err}");
    let only_new = env.path("only-new");
    env.ok(&["restore", "m:2", "--to", only_new.to_str().unwrap(), "--seed", first.to_str().unwrap()]);
    assert_same_tree(&v2, &only_new);
    for (p, bytes) in v1_packs.iter().zip(&kept) {
        fs::write(p, bytes).unwrap();
    }

    // A seed is read, never trusted: damaged where it matters, the restore is still exact.
    let damaged = env.path("damaged");
    fs::create_dir_all(damaged.join("model")).unwrap();
    let mut bad = weights.clone();
    for i in (0..bad.len()).step_by(50_000) {
        bad[i] ^= 0x40;
    }
    fs::write(damaged.join("model/pages-1.img"), &bad).unwrap();
    fs::write(damaged.join("core.img"), &core[..core.len() / 2]).unwrap();
    let out = env.path("from-damaged");
    let r = env.json(&["restore", "m:2", "--to", out.to_str().unwrap(), "--seed", damaged.to_str().unwrap()]);
    assert_same_tree(&v2, &out);
    assert!(r["seeded_chunks"].as_u64().unwrap() > 0, "the undamaged chunks were copied");
    assert!(r["fetched_bytes"].as_u64().unwrap() > fetched, "the damaged ones were fetched");

    // A seed that is not a directory is refused before anything is written.
    let none = env.path("no-such-dir");
    let err = env.fails(&["restore", "m:2", "--to", env.path("x").to_str().unwrap(), "--seed", none.to_str().unwrap()]);
    assert!(err.contains("seed") && err.contains("no-such-dir"), "{err}");
    let err = env.fails(&[
        "restore",
        "m:2",
        "--to",
        env.path("x").to_str().unwrap(),
        "--seed",
        v2.join("core.img").to_str().unwrap(),
    ]);
    assert!(err.contains("is not a directory"), "{err}");
    assert!(!env.path("x").exists(), "nothing restored");
}
