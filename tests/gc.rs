//! `gstore gc` with real processes: against a real S3 server while two machines push, killed
//! with SIGKILL at random moments, on a local store, and through `gstore serve`.

use gstore_tests::*;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// An image: a file shared by every image (so pushes deduplicate against each other and
/// against what gc removes) and a file of its own.
fn make_image(dir: &Path, seed: u64) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    write_mixed_file(&dir.join("base.img"), 1_500_000, 1000 + seed % 3);
    write_mixed_file(&dir.join("own.img"), 700_000, seed);
    dir.to_path_buf()
}

/// Names of the current tags (`ls --json`).
fn tags(ls: &str) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(ls).unwrap();
    v.as_array().unwrap().iter().map(|t| t["tag"].as_str().unwrap().to_string()).collect()
}

fn report(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("gc --json printed {out:?}: {e}"))
}

/// Every tag in `expected` restores to its source on a fresh machine, and verify is clean.
fn check_all(s3: &S3, machine: &str, expected: &BTreeMap<String, PathBuf>) {
    s3.ok(machine, &["verify", "--read-data"]);
    let present = tags(&s3.ok(machine, &["--json", "ls"]));
    for (tag, src) in expected {
        assert!(present.contains(tag), "{tag} lost; tags: {present:?}");
        let out = s3.tmp.path().join(format!("out-{machine}-{}", tag.replace(':', "-")));
        s3.ok(machine, &["restore", tag, "--to", out.to_str().unwrap()]);
        assert_same_tree(src, &out);
    }
}

#[test]
fn gc_runs_while_two_machines_push_to_s3() {
    let s3 = S3::start();
    s3.ok("p1", &["init", "--pack-size", "1048576"]);
    let mut expected = BTreeMap::new();
    for round in 0..2u64 {
        // Two machines push three images each while a third runs gc (with retention) again
        // and again; rm removes one image from the last round first.
        if round > 0 {
            s3.ok("g", &["rm", "p1-0"]);
            expected.remove("p1-0:latest");
        }
        let done = std::sync::atomic::AtomicBool::new(false);
        let pushed = std::thread::scope(|s| {
            let pushers: Vec<_> = ["p1", "p2"]
                .into_iter()
                .enumerate()
                .map(|(m, machine)| {
                    let s3 = &s3;
                    s.spawn(move || {
                        let mut last = Vec::new();
                        for i in 0..3u64 {
                            let seed = round * 100 + m as u64 * 10 + i;
                            let src = make_image(&s3.tmp.path().join(format!("src-{seed}")), seed);
                            let tag = format!("{machine}-{}:latest", i % 2);
                            s3.ok(machine, &["-q", "push", src.to_str().unwrap(), "--tag", &tag]);
                            last.push((tag, src));
                        }
                        last
                    })
                })
                .collect();
            let gc = s.spawn(|| {
                let mut passes = 0;
                while !done.load(std::sync::atomic::Ordering::SeqCst) || passes < 2 {
                    s3.ok("g", &["--json", "gc", "--keep-last", "2"]);
                    passes += 1;
                }
                passes
            });
            let pushed: Vec<_> = pushers.into_iter().flat_map(|h| h.join().unwrap()).collect();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            assert!(gc.join().unwrap() >= 2);
            pushed
        });
        // The last push to each tag is what it names.
        expected.extend(pushed);
        check_all(&s3, &format!("check{round}"), &expected);
    }
    // With nothing running, two passes reclaim everything no image needs.
    s3.ok("g", &["gc"]);
    let last = report(&s3.ok("g", &["--json", "gc"]));
    assert_eq!(last["packs_tombstoned"], 0, "{last}");
    assert!(files_below(&s3.bucket_dir().join("images/tombstones")).is_empty());
    check_all(&s3, "final", &expected);
}

#[test]
fn gc_killed_at_random_moments_loses_nothing() {
    let s3 = S3::start();
    s3.ok("a", &["init", "--pack-size", "1048576"]);
    let mut expected = BTreeMap::new();
    for i in 0..8u64 {
        let src = make_image(&s3.tmp.path().join(format!("src-{i}")), i);
        s3.ok("a", &["-q", "push", src.to_str().unwrap(), "--tag", &format!("img{i}")]);
        expected.insert(format!("img{i}:latest"), src);
    }
    for i in [1, 4, 6] {
        s3.ok("a", &["rm", &format!("img{i}")]);
        expected.remove(&format!("img{i}:latest"));
    }
    // How long one pass takes here, to spread the kills over it.
    let t = std::time::Instant::now();
    s3.ok("g", &["gc", "--dry-run"]);
    let pass = t.elapsed().max(Duration::from_millis(50));
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut killed = 0;
    for _ in 0..12 {
        let mut child = s3.cmd("g", &["-q", "gc"]).stderr(std::process::Stdio::null()).spawn().unwrap();
        std::thread::sleep(pass.mul_f64(rng.random_range(0.1..1.1)));
        if child.try_wait().unwrap().is_none() {
            killed += 1;
        }
        let _ = child.kill();
        child.wait().unwrap();
        // Between kills the store stays whole.
        s3.ok("g", &["verify"]);
    }
    assert!(killed >= 3, "only {killed} of 12 gc runs were killed before they finished");
    // The next gc takes over the dead one's lock (same machine) and finishes.
    s3.ok("g", &["gc"]);
    s3.ok("g", &["gc"]);
    check_all(&s3, "check", &expected);
    let r = report(&s3.ok("g", &["--json", "gc"]));
    assert_eq!((r["packs_tombstoned"].as_u64(), r["packs_deleted"].as_u64()), (Some(0), Some(0)), "{r}");
}

#[test]
fn retention_dry_run_and_reclaim_on_a_local_store() {
    let env = Env::new(&["--pack-size", "1048576"]);
    let mut sources = Vec::new();
    for i in 0..4u64 {
        let src = make_image(&env.path(&format!("src-{i}")), i);
        env.ok(&["-q", "push", src.to_str().unwrap(), "--tag", "model"]);
        sources.push(src);
    }
    let before = env.json(&["du"]);
    // A dry run says what would go and changes nothing.
    let dry = env.json(&["gc", "--keep-last", "2", "--dry-run"]);
    assert_eq!(dry["history_dropped"], 2, "{dry}");
    assert_eq!(env.json(&["du"]), before);
    // ... and why, image by image (issue 64): the two newest are kept by the rule, the others not.
    let verdicts = dry["retention"].as_array().unwrap();
    let why: Vec<(u64, bool, &str)> = verdicts
        .iter()
        .map(|v| (v["rank"].as_u64().unwrap(), v["kept"].as_bool().unwrap(), v["why"].as_str().unwrap()))
        .collect();
    assert_eq!(why.len(), 4, "{dry}");
    assert_eq!((why[0].1, why[0].2, why[1].1, why[1].2), (true, "one of the newest 2", true, "one of the newest 2"));
    assert!(!why[2].1 && why[2].2.contains("the 3rd newest of model: no rule keeps it"), "{why:?}");
    let text = env.ok(&["gc", "--keep-last", "2", "--dry-run"]);
    assert_eq!(
        text.lines().filter(|l| l.starts_with("model:latest ") && l.contains(": kept: one of the newest 2")).count(),
        2,
        "{text}"
    );
    assert_eq!(text.lines().filter(|l| l.contains("(history): would be dropped: made ")).count(), 2, "{text}");
    // Retention keeps the two newest pushes of "model"; two passes reclaim the rest.
    let first = env.json(&["gc", "--keep-last", "2"]);
    assert_eq!(first["history_dropped"], 2);
    let second = env.json(&["gc"]);
    let reclaimed = first["bytes_reclaimed"].as_u64().unwrap() + second["bytes_reclaimed"].as_u64().unwrap();
    assert!(reclaimed > 300_000, "reclaimed {reclaimed}: {first} {second}");
    let after = env.json(&["du"]);
    assert!(after["pack_bytes"].as_u64().unwrap() < before["pack_bytes"].as_u64().unwrap());
    // Both kept images restore: the current value, and the previous one by manifest id.
    let out = env.path("out");
    env.ok(&["restore", "model", "--to", out.to_str().unwrap()]);
    assert_same_tree(&sources[3], &out);
    env.ok(&["verify", "--read-data"]);
    // Bad arguments are refused before anything happens.
    assert!(env.fails(&["gc", "--keep-last", "0"]).contains("keep-last 0 and keep-within 0 would remove every image"));
    assert!(env.fails(&["gc", "--repack-below", "2"]).contains("fraction"));
    assert!(env.fails(&["gc", "--keep-within", "soon"]).contains("soon"));
}

#[test]
fn retention_removes_whole_tags_and_a_removed_tag_can_be_pushed_again() {
    let env = Env::new(&[]);
    let v1 = make_image(&env.path("v1"), 1);
    let v2 = make_image(&env.path("v2"), 2);
    env.ok(&["-q", "push", v1.to_str().unwrap(), "--tag", "model:v1"]);
    std::thread::sleep(Duration::from_millis(1100)); // set times are in seconds
    env.ok(&["-q", "push", v2.to_str().unwrap(), "--tag", "model:v2"]);
    let r = env.json(&["gc", "--keep-last", "1"]);
    assert_eq!(r["tags_removed"], serde_json::json!(["model:v1"]), "{r}");
    let ls = env.json(&["ls"]);
    assert_eq!(ls.as_array().unwrap().len(), 1, "{ls}");
    assert!(env.fails(&["show", "model:v1"]).contains("not found"));
    // The removed tag's record is kept (marked) and a new push to it starts afresh.
    env.ok(&["-q", "push", v1.to_str().unwrap(), "--tag", "model:v1"]);
    let out = env.path("out");
    env.ok(&["restore", "model:v1", "--to", out.to_str().unwrap()]);
    assert_same_tree(&v1, &out);
    env.ok(&["gc"]);
    env.ok(&["gc"]);
    env.ok(&["verify", "--read-data"]);
}

#[test]
fn pinned_tags_and_other_names_survive_retention_and_ls_shows_what_history_keeps() {
    let env = Env::new(&[]);
    let dirs: Vec<PathBuf> = (1..=3).map(|i| make_image(&env.path(&format!("v{i}")), i)).collect();
    // run-a:step-1 pinned, then step-2 and step-3; "other" moved twice.
    for (i, d) in dirs.iter().enumerate() {
        env.ok(&["-q", "push", d.to_str().unwrap(), "--tag", &format!("run-a:step-{}", i + 1)]);
        env.ok(&["-q", "push", d.to_str().unwrap(), "--tag", "other"]);
        if i == 0 {
            assert_eq!(env.json(&["pin", "run-a:step-1"])["pinned"], serde_json::json!(["run-a:step-1"]));
        }
        std::thread::sleep(Duration::from_millis(1100)); // set times are in seconds
    }
    let ls = env.json(&["ls"]);
    let row = |tag: &str| ls.as_array().unwrap().iter().find(|r| r["tag"] == tag).unwrap().clone();
    assert_eq!(
        (row("run-a:step-1")["pinned"].as_bool(), row("other:latest")["history"].as_u64()),
        (Some(true), Some(2))
    );
    assert!(env.ok(&["ls"]).lines().next().unwrap().contains("HISTORY"));

    // Retention for run-a only: the newest and the pinned one stay, "other" keeps its history.
    let r = env.json(&["gc", "--keep-last", "1", "--prefix", "run-a"]);
    assert_eq!(r["tags_removed"], serde_json::json!(["run-a:step-2"]), "{r}");
    assert_eq!(env.json(&["ls"]).as_array().unwrap().len(), 3);
    assert_eq!(tags_of(&env), ["other:latest", "run-a:step-1", "run-a:step-3"]);
    // Unpinned, it goes; "other" is trimmed only when the rule reaches it.
    env.ok(&["unpin", "run-a:step-1"]);
    let r = env.json(&["gc", "--keep-last", "1"]);
    assert_eq!(r["tags_removed"], serde_json::json!(["run-a:step-1"]), "{r}");
    assert_eq!(r["history_dropped"], 2, "{r}");
    let out = env.path("out");
    env.ok(&["restore", "other", "--to", out.to_str().unwrap()]);
    assert_same_tree(&dirs[2], &out);
    env.ok(&["gc"]);
    env.ok(&["verify", "--read-data"]);
    // Bad arguments.
    assert!(env.fails(&["pin", "nope"]).contains("not found"));
    assert!(env.fails(&["gc", "--prefix", "run-a"]).contains("--keep"), "a prefix alone is refused");
    assert!(env.fails(&["gc", "--keep-daily", "0"]).contains("keep-daily and keep-weekly 0 keep nothing"));
}

fn tags_of(env: &Env) -> Vec<String> {
    env.json(&["ls"]).as_array().unwrap().iter().map(|r| r["tag"].as_str().unwrap().to_string()).collect()
}

/// The lease objects under `dir`: not the temporary files a writer killed mid-write leaves
/// beside them (`NAME.lease#N`, which gc sweeps as it does every killed writer's).
fn lease_objects(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    files_below(dir).into_iter().filter(|p| p.extension().is_some_and(|e| e == "lease")).collect()
}

/// A store with a push killed (SIGKILL) after it wrote packs, so it left its lease behind.
/// Pushes are fast here: a run in which the push finished first is tried again.
fn store_with_a_killed_push() -> Env {
    for attempt in 0..5u64 {
        let env = Env::new(&["--pack-size", "1048576"]);
        let src = env.path("big");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("a.img"), random_bytes(64_000_000, 9 + attempt)).unwrap();
        let mut child = env.cmd(&["-q", "push", src.to_str().unwrap(), "--tag", "big"]).spawn().unwrap();
        while env.packs().len() < 2 && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = child.kill();
        let status = child.wait().unwrap();
        if !status.success() && !lease_objects(&env.store.join("leases")).is_empty() {
            return env;
        }
    }
    panic!("in 5 tries the push always finished before it could be killed");
}

#[test]
fn a_killed_push_leaves_a_lease_that_gc_on_the_same_machine_drops() {
    let env = store_with_a_killed_push();
    let leases = env.store.join("leases");
    assert_eq!(lease_objects(&leases).len(), 1, "one lease: the killed push's");
    let packs = env.packs().len();
    assert!(packs >= 2);
    // One run: the first pass tombstones the packs, the second deletes them.
    let r = env.json(&["gc"]);
    assert_eq!(r["leases_dropped"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!((r["passes"].as_u64(), r["packs_deleted"].as_u64()), (Some(2), Some(packs as u64)), "{r}");
    assert_eq!(r["packs_tombstoned"].as_u64(), Some(0), "nothing is left for a next run: {r}");
    assert!(env.packs().is_empty() && lease_objects(&leases).is_empty());
    // A lease this machine cannot judge (another boot) is kept, and so is what it names.
    let img = make_image(&env.path("img"), 3);
    env.ok(&["-q", "push", img.to_str().unwrap(), "--tag", "img"]);
    env.ok(&["rm", "img"]);
    let pack = env.packs()[0].clone();
    let id = pack.file_stem().unwrap().to_string_lossy().to_string();
    let foreign = serde_json::json!({
        "format": 1,
        "owner": { "host": "elsewhere", "boot_id": "another-boot", "pid_ns": "pid:[1]", "pid": 1, "start_ticks": 1 },
        "purpose": "push img:latest", "packs": [id], "manifests": []
    });
    std::fs::create_dir_all(&leases).unwrap();
    std::fs::write(leases.join(format!("{}.lease", "ab".repeat(16))), foreign.to_string()).unwrap();
    env.ok(&["gc"]);
    env.ok(&["gc"]);
    assert!(pack.exists(), "a pack a live lease names was deleted");
}

#[test]
fn a_second_gc_waits_for_nothing_and_is_refused_while_one_runs() {
    let env = Env::new(&[]);
    // A lock left by a gc on another machine: refused with a way out; --break-lock takes it.
    let foreign = serde_json::json!({
        "host": "elsewhere", "boot_id": "another-boot", "pid_ns": "pid:[1]", "pid": 1, "start_ticks": 1
    });
    std::fs::create_dir_all(env.store.join("gc")).unwrap();
    std::fs::write(env.store.join("gc/lock"), foreign.to_string()).unwrap();
    let err = env.fails(&["gc"]);
    assert!(err.contains("another gc is running") && err.contains("--break-lock"), "{err}");
    env.ok(&["gc", "--break-lock"]);
    assert!(!env.store.join("gc/lock").exists());
}

#[test]
fn gc_through_the_server_needs_an_admin_token() {
    let env = Env::new(&["--pack-size", "1048576"]);
    let tokens = env.path("tokens");
    std::fs::write(&tokens, "writer-0123456789 write\nadmin-0123456789 admin\n").unwrap();
    let server = Server::start(&env.store, &["--tokens", tokens.to_str().unwrap()]);
    let run = |token: &str, args: &[&str]| server.cmd("m", token, args).output().unwrap();
    let a = make_image(&env.path("a"), 1);
    let b = make_image(&env.path("b"), 2);
    for (src, tag) in [(&a, "a"), (&b, "b")] {
        let o = run("writer-0123456789", &["-q", "push", src.to_str().unwrap(), "--tag", tag]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    assert!(run("writer-0123456789", &["rm", "a"]).status.success());
    let o = run("writer-0123456789", &["gc"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("Admin is needed"), "{err}");
    let mut reclaimed = 0;
    for _ in 0..2 {
        let o = run("admin-0123456789", &["--json", "gc"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        reclaimed += report(&String::from_utf8_lossy(&o.stdout))["bytes_reclaimed"].as_u64().unwrap();
    }
    assert!(reclaimed > 0);
    let out = env.path("out");
    let o = run("writer-0123456789", &["restore", "b", "--to", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_same_tree(&b, &out);
    drop(server);
    env.ok(&["verify", "--read-data"]);
}

#[test]
fn keep_last_keeps_the_newest_of_pushes_within_one_second() {
    let env = Env::new(&[]);
    // Six quick pushes: several share a second, which alone cannot order them.
    for i in 1..=6 {
        let src = env.path(&format!("v{i}"));
        std::fs::write(&src, format!("version {i}")).unwrap();
        env.ok(&["-q", "push", src.to_str().unwrap(), "--tag", &format!("fast:v{i}")]);
    }
    let dry = env.json(&["gc", "--keep-last", "2", "--dry-run"]);
    // Listed in order.
    let removed: Vec<&str> = dry["tags_removed"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(removed, ["fast:v1", "fast:v2", "fast:v3", "fast:v4"], "{dry}");
    env.ok(&["gc", "--keep-last", "2"]);
    assert_eq!(tags(&env.ok(&["--json", "ls"])), ["fast:v5", "fast:v6"]);
}

/// The temporary files (`<key>#<n>`) of unfinished writes in a local store.
fn temp_files(env: &Env) -> std::collections::BTreeSet<PathBuf> {
    let is_temp = |p: &PathBuf| {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        name.rsplit_once('#').is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    files_below(&env.store).into_iter().filter(is_temp).collect()
}

/// True when `files` holds a pack's temporary file that is not in `known`.
fn new_pack_temp(files: &std::collections::BTreeSet<PathBuf>, known: &std::collections::BTreeSet<PathBuf>) -> bool {
    files.difference(known).any(|p| p.to_string_lossy().contains(".pack#"))
}

/// Sends `signal` (e.g. "-STOP") to `pid`.
fn signal(pid: u32, signal: &str) {
    assert!(std::process::Command::new("kill").args([signal, &pid.to_string()]).status().unwrap().success());
}

/// Waits until every thread of `pid` is stopped (a thread inside a system call stops only
/// when the call returns).
fn wait_stopped(pid: u32) {
    let state = |stat: String| stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    loop {
        let threads = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
        let running = threads
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
            .any(|stat| !matches!(state(stat), Some('T' | 't')));
        if !running {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Starts a push of 24 MB of fresh random bytes (from `seed`), tagged `t<seed>`, and waits
/// until it is writing a pack; returns it, still running, or `None` if it finished first.
fn push_caught_writing(env: &Env, seed: u64) -> Option<std::process::Child> {
    let src = env.path(&format!("src-{seed}"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a.img"), random_bytes(24_000_000, seed)).unwrap();
    let before = temp_files(env);
    let mut child = env.cmd(&["-q", "push", src.to_str().unwrap(), "--tag", &format!("t{seed}")]).spawn().unwrap();
    loop {
        if new_pack_temp(&temp_files(env), &before) {
            return Some(child);
        }
        if child.try_wait().unwrap().is_some() {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn gc_sweeps_the_temporary_files_of_killed_pushes_and_spares_a_running_one() {
    let env = Env::new(&["--pack-size", "1048576"]);
    // Pushes killed with SIGKILL while they write a pack leave `*.pack#1` files behind.
    let mut seed = 0;
    while temp_files(&env).is_empty() {
        seed += 1;
        assert!(seed <= 20, "in 20 tries no push was killed while writing a pack");
        if let Some(mut child) = push_caught_writing(&env, seed) {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
    let killed = temp_files(&env);
    let killed_bytes: u64 = killed.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
    // A push that is running (here: stopped) while it writes a pack.
    let running = loop {
        seed += 1;
        assert!(seed <= 40, "in 20 tries no push was caught writing a pack");
        let Some(child) = push_caught_writing(&env, seed) else { continue };
        signal(child.id(), "-STOP");
        wait_stopped(child.id());
        if new_pack_temp(&temp_files(&env), &killed) {
            break child;
        }
        // Its write finished between the look and the stop: let it go on and try again.
        signal(child.id(), "-CONT");
        let mut child = child;
        assert!(child.wait().unwrap().success());
    };
    let in_flight: Vec<PathBuf> = temp_files(&env).difference(&killed).cloned().collect();
    let first = env.json(&["gc"]);
    assert_eq!(first["temp_files_swept"].as_u64(), Some(killed.len() as u64), "{first}");
    assert_eq!(first["temp_bytes_swept"].as_u64(), Some(killed_bytes), "{first}");
    assert!(killed.iter().all(|p| !p.exists()), "{first}");
    let second = env.json(&["gc"]);
    assert_eq!(second["temp_files_swept"], 0, "{second}");
    assert!(in_flight.iter().all(|p| p.exists()), "the running push's temporary file was removed");
    // The running push goes on unharmed.
    let mut running = running;
    signal(running.id(), "-CONT");
    assert!(running.wait().unwrap().success(), "the running push failed after gc");
    let restored = env.path("restored");
    env.ok(&["restore", &format!("t{seed}"), "--to", restored.to_str().unwrap()]);
    assert_same_tree(&env.path(&format!("src-{seed}")), &restored);
    assert!(temp_files(&env).is_empty(), "{:?}", temp_files(&env));
    env.ok(&["verify", "--read-data"]);
}

/// Retention dates images by when they were made (`SOURCE_DATE_EPOCH` here), as `ls
/// --latest` does, not by when they were tagged: step-10, tagged before step-9, is the newest;
/// twelve images made over six days and pushed today keep one a day under `--keep-daily 6`.
#[test]
fn retention_goes_by_when_images_were_made() {
    let env = Env::new(&[]);
    let day = 86_400u64;
    let push = |tag: &str, made: u64, seed: u64| {
        let src = make_image(&env.path(&format!("src-{tag}")), seed);
        let o = env
            .cmd(&["-q", "push", src.to_str().unwrap(), "--tag", tag])
            .env("SOURCE_DATE_EPOCH", made.to_string())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    push("x:step-10", 1_790_000_000 + 100, 10);
    push("x:step-9", 1_790_000_000, 9);
    assert_eq!(tags(&env.ok(&["--json", "ls", "x", "--latest"])), ["x:step-10"]);
    env.ok(&["gc", "--keep-last", "1"]);
    assert_eq!(tags(&env.ok(&["--json", "ls", "x"])), ["x:step-10"]);

    for i in 0..12u64 {
        push(&format!("d:v{i:02}"), 1_790_000_000 + (i / 2) * day + (i % 2) * 3600, 100 + i);
    }
    env.ok(&["gc", "--keep-daily", "6", "--prefix", "d"]);
    let kept = tags(&env.ok(&["--json", "ls", "d", "--sort", "name"]));
    assert_eq!(kept, ["d:v01", "d:v03", "d:v05", "d:v07", "d:v09", "d:v11"]);
}

/// Issue 64: retention policies stored per name or prefix; gc applies them without flags
/// (pins win), names without one go by gc's flags; a dry run names the policy that decided;
/// bad patterns and empty rules are refused; only an admin token sets them through a server.
#[test]
fn stored_policies_decide_per_name_and_pins_win() {
    let env = Env::new(&["--pack-size", "1048576"]);
    let f = env.path("f");
    for (i, tag) in ["model:v1", "model:v2", "model:v3", "run-1", "run-1", "run-1", "other", "other"].iter().enumerate()
    {
        std::fs::write(&f, format!("image {i}")).unwrap();
        env.ok(&["-q", "push", f.to_str().unwrap(), "--tag", tag]);
    }
    env.ok(&["pin", "model:v1"]);
    env.ok(&["policy", "set", "model", "--keep-last", "1"]);
    env.ok(&["policy", "set", "run-*", "--keep-last", "2"]);
    let shown = env.json(&["policy", "show"]);
    assert_eq!(shown["policies"]["model"], serde_json::json!({ "keep_last": 1 }), "{shown}");
    assert_eq!(shown["policies"]["run-*"], serde_json::json!({ "keep_last": 2 }), "{shown}");
    assert!(env.ok(&["policy", "show"]).contains("run-*    --keep-last 2"));
    // Bad patterns and empty rules are refused, and change nothing.
    for bad in [
        &["policy", "set", "a*b*", "--keep-last", "1"][..],
        &["policy", "set", "model"],
        &["policy", "set", "x", "--keep-last", "0"],
    ] {
        assert_eq!(env.run(bad).status.code(), Some(2), "{bad:?}");
    }
    assert_eq!(env.json(&["policy", "show"]), shown);

    let dry = env.json(&["gc", "--dry-run"]);
    let by = |tag: &str| -> Vec<(bool, String)> {
        dry["retention"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["tag"] == tag)
            .map(|v| (v["kept"].as_bool().unwrap(), v["policy"].as_str().unwrap_or("").to_string()))
            .collect()
    };
    assert_eq!(by("model:v1"), [(true, "model".to_string())], "pinned: {dry}");
    assert_eq!(by("model:v2"), [(false, "model".to_string())], "{dry}");
    assert_eq!(by("model:v3"), [(true, "model".to_string())], "{dry}");
    assert_eq!(by("run-1:latest").iter().filter(|(kept, p)| *kept && p == "run-*").count(), 2, "{dry}");
    assert!(by("other:latest").is_empty(), "no policy and no flags: other is not judged: {dry}");

    let r = env.json(&["gc"]);
    assert_eq!(r["tags_removed"], serde_json::json!(["model:v2"]), "{r}");
    assert_eq!(r["history_dropped"], 1, "run-1 keeps 2 of 3; other keeps its history: {r}");
    // Flags still decide the names without a policy.
    let r = env.json(&["gc", "--keep-last", "1"]);
    assert_eq!(r["history_dropped"], 1, "other's history goes, run-1 keeps its policy's 2: {r}");
    let mut tags = tags_of(&env);
    tags.sort();
    assert_eq!(tags, ["model:v1", "model:v3", "other:latest", "run-1:latest"]);

    env.ok(&["policy", "rm", "run-*"]);
    assert_eq!(env.run(&["policy", "rm", "run-*"]).status.code(), Some(3));
    assert!(env.json(&["policy", "show"])["policies"].get("run-*").is_none());

    // Through a server, setting a policy is an admin's.
    let tokens = env.path("tokens");
    std::fs::write(&tokens, "writer-0123456789 write\nadmin-0123456789 admin\n").unwrap();
    let server = Server::start(&env.store, &["--tokens", tokens.to_str().unwrap()]);
    let run = |token: &str, args: &[&str]| server.cmd("m", token, args).output().unwrap();
    let o = run("writer-0123456789", &["policy", "set", "other", "--keep-daily", "3"]);
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run("admin-0123456789", &["policy", "set", "other", "--keep-daily", "3"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run("writer-0123456789", &["--json", "policy", "show"]);
    let shown: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(shown["policies"]["other"], serde_json::json!({ "keep_daily": 3 }), "{shown}");
}

/// A store where gc rewrites a pack: two images pushed together (one pack holds both), one
/// removed. Returns the env and the bytes of packs before gc.
fn store_with_a_pack_to_rewrite() -> (Env, u64) {
    let env = Env::new(&[]);
    let src = env.path("both");
    std::fs::create_dir_all(&src).unwrap();
    let keep = make_image(&src.join("keep"), 1);
    let gone = make_image(&src.join("gone"), 2);
    env.ok(&["-q", "push", src.to_str().unwrap(), "--tag", "both"]);
    env.ok(&["-q", "push", keep.to_str().unwrap(), "--tag", "keep"]);
    env.ok(&["rm", "both"]);
    assert!(gone.exists());
    let bytes = env.packs().iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
    (env, bytes)
}

fn pack_bytes(env: &Env) -> u64 {
    env.packs().iter().map(|p| std::fs::metadata(p).unwrap().len()).sum()
}

#[test]
fn one_run_reclaims_and_leaves_rewritten_copies_for_the_next_unless_asked() {
    // By default the old copy of a rewritten pack waits for the next run (a restore that
    // started before may read it); everything else goes in the one run.
    let (env, before) = store_with_a_pack_to_rewrite();
    let r = report(&env.ok(&["--json", "gc"]));
    assert!(r["packs_repacked"].as_u64().unwrap() >= 1, "{r}");
    assert!(r["passes"].as_u64().unwrap() >= 2, "{r}");
    assert!(r["packs_deferred"].as_u64().unwrap() >= 1, "{r}");
    assert_eq!(r["packs_tombstoned"].as_u64(), Some(0), "{r}");
    // The one pack held both images: its old copy is what waits.
    assert_eq!(r["bytes_deferred"].as_u64(), Some(before), "{r}");
    let after_one = pack_bytes(&env);
    let next = report(&env.ok(&["--json", "gc"]));
    assert_eq!(next["packs_deleted"], r["packs_deferred"], "the next run takes what was deferred: {next}");
    assert_eq!(next["packs_deferred"].as_u64(), Some(0), "{next}");
    let settled = pack_bytes(&env);
    assert!(settled < after_one, "{settled} < {after_one}");
    env.ok(&["verify", "--read-data"]);

    // With --reclaim-copies one run gives back all of it: the same as two.
    let (env, before_rc) = store_with_a_pack_to_rewrite();
    assert_eq!(before_rc, before, "the same store");
    let r = report(&env.ok(&["--json", "gc", "--reclaim-copies"]));
    assert_eq!((r["packs_deferred"].as_u64(), r["packs_tombstoned"].as_u64()), (Some(0), Some(0)), "{r}");
    assert_eq!(pack_bytes(&env), settled, "one run with --reclaim-copies frees what two runs do: {r}");
    assert_eq!(report(&env.ok(&["--json", "gc"]))["packs_deleted"].as_u64(), Some(0));
    let out = env.path("out");
    env.ok(&["restore", "keep", "--to", out.to_str().unwrap()]);
    assert_eq!(std::fs::read(out.join("own.img")).unwrap(), std::fs::read(env.path("both/keep/own.img")).unwrap());
}
